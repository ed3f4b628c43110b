"""What the audience-change sensor and the 48-hour activation schedule request."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

import dagster as dg
import psycopg
import pytest
from activation_support import (
    activation_warehouse,
    add_tenant_with_customers,
    register_destination,
    set_members,
)

from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.triggers import cadence_requests, change_requests, changed_audiences
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.assets import meta_custom_audiences
from cdp_assets.meta.resources import MetaResource
from cdp_assets.partitions import tenants
from cdp_assets.sandbox.meta_graph import MetaSandbox
from cdp_assets.tenants.registry import list_tenants


@pytest.fixture(scope="module")
def url():
    with activation_warehouse() as warehouse:
        os.environ["TRIGGER_META_TOKEN"] = "trigger-token"
        with psycopg.connect(warehouse) as conn:
            for tenant_id in ("trig_a", "trig_b"):
                add_tenant_with_customers(conn, tenant_id, 300)
                set_members(conn, tenant_id, range(200))
            register_destination(
                conn,
                Destination(
                    "trig_a_meta",
                    "trig_a",
                    "meta",
                    "55",
                    credential_refs={"access_token": "TRIGGER_META_TOKEN"},
                ),
            )
        yield warehouse


def test_sensor_requests_only_tenants_whose_audiences_changed(instance, url) -> None:
    with psycopg.connect(url) as conn:
        rows = list_tenants(conn)
        never_synced = changed_audiences(conn)
        assert set(never_synced) == {"trig_a"}  # trig_b has no destination
        (request,) = change_requests(never_synced, rows)
        assert request.partition_key == "trig_a"
        assert request.asset_selection == [meta_custom_audiences.key]

        with MetaSandbox({"trigger-token": ["55"]}) as meta:
            instance.add_dynamic_partitions(tenants.name, ["trig_a"])
            dg.materialize(
                [meta_custom_audiences],
                partition_key="trig_a",
                instance=instance,
                resources={
                    "warehouse": WarehouseResource(url=url),
                    "meta": MetaResource(graph_url=meta.graph_url),
                },
            )
        assert changed_audiences(conn) == {}
        assert change_requests(changed_audiences(conn), rows) == []

        set_members(conn, "trig_a", range(10, 210))
        (first,) = change_requests(changed_audiences(conn), rows)
        (same,) = change_requests(changed_audiences(conn), rows)
        assert first.run_key == same.run_key  # one change launches one run
        set_members(conn, "trig_a", range(20, 220))
        (later,) = change_requests(changed_audiences(conn), rows)
        assert later.run_key != first.run_key


def test_cadence_runs_every_48_hours_across_month_and_year_ends(url) -> None:
    with psycopg.connect(url) as conn:
        rows = list_tenants(conn)
    days = [datetime(2026, 12, 20, 10) + timedelta(days=n) for n in range(80)]
    active = [day for day in days if cadence_requests(rows, {"trig_a"}, day)]
    gaps = {(b - a).days for a, b in zip(active, active[1:], strict=False)}
    assert gaps == {2}
    (request,) = cadence_requests(rows, {"trig_a"}, active[0])
    assert request.partition_key == "trig_a"
    assert cadence_requests(rows, set(), active[0]) == []
