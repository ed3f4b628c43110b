"""The instance's event log writes over a pooled connection, not one connection per statement."""

from __future__ import annotations

import dagster as dg
from sqlalchemy import event


def test_storing_many_events_opens_a_connection_or_two_not_one_per_statement(instance):
    engine = instance.event_log_storage._engine
    connects = []

    def count(*_: object) -> None:
        connects.append(1)

    event.listen(engine, "connect", count)
    try:
        for n in range(30):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key="pool_probe", metadata={"n": n})
            )
    finally:
        event.remove(engine, "connect", count)
    stored = instance.fetch_materializations(dg.AssetKey("pool_probe"), limit=100).records
    assert len(stored) == 30
    assert len(connects) <= 2  # dagster-postgres' own NullPool opened 3-4 per event
