"""What the audience-change sensor and the 48-hour activation schedule request."""

from __future__ import annotations

import hashlib
import os
from datetime import datetime, timedelta

import dagster as dg
import psycopg
import pytest
from activation_support import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    register_destination,
    set_members,
)

from cdp_assets.activation.audiences import audience_signatures
from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.triggers import (
    cadence_requests,
    change_requests,
    changed_audiences,
    tenant_blocks,
)
from cdp_assets.google.assets import google_customer_match
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.assets import meta_custom_audiences
from cdp_assets.meta.resources import MetaResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.sandbox.meta_graph import MetaSandbox
from cdp_assets.tenants.registry import Tenant, list_tenants

ORDER = ["trig_a", "trig_b"]  # the tenants' partitions, in order


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
        (request,) = change_requests(never_synced, rows, ORDER)
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
        assert change_requests(changed_audiences(conn), rows, ORDER) == []

        set_members(conn, "trig_a", range(10, 210))
        (first,) = change_requests(changed_audiences(conn), rows, ORDER)
        (same,) = change_requests(changed_audiences(conn), rows, ORDER)
        assert first.run_key == same.run_key  # one change launches one run
        set_members(conn, "trig_a", range(20, 220))
        (later,) = change_requests(changed_audiences(conn), rows, ORDER)
        assert later.run_key != first.run_key


def test_one_query_signs_every_tenant_of_an_audience(url) -> None:
    """A tenant's signature is its member count and a digest of its sorted member keys,
    whatever other tenants the same query signs; a tenant without members signs as none."""
    with psycopg.connect(url) as conn:
        set_members(conn, "trig_b", [3, 1, 2])
        signatures = audience_signatures(conn, AUDIENCE, ["trig_b", "trig_a", "nobody"])
        alone = audience_signatures(conn, AUDIENCE, ["trig_b"])
    digest = hashlib.md5(b"trig_b-1,trig_b-2,trig_b-3").hexdigest()
    assert alone == {"trig_b": f"3:{digest}"}
    assert signatures["trig_b"] == alone["trig_b"]
    assert signatures["nobody"] == "0:"
    assert signatures["trig_a"].split(":")[0] == "200"


def test_cadence_runs_every_48_hours_across_month_and_year_ends(url) -> None:
    with psycopg.connect(url) as conn:
        rows = list_tenants(conn)
    days = [datetime(2026, 12, 20, 10) + timedelta(days=n) for n in range(80)]
    active = [day for day in days if cadence_requests(rows, ORDER, {"trig_a"}, day)]
    gaps = {(b - a).days for a, b in zip(active, active[1:], strict=False)}
    assert gaps == {2}
    (request,) = cadence_requests(rows, ORDER, {"trig_a"}, active[0])
    assert request.partition_key == "trig_a"
    assert cadence_requests(rows, ORDER, set(), active[0]) == []


def test_neighbouring_tenants_share_one_run() -> None:
    rows = [Tenant(t, t, "K", "T", priority=p) for t, p in (("t1", 3), ("t2", 1), ("t4", 2))]
    order = ["t1", "t2", "t3", "t4", "t5"]  # t3 and t5: no change (or inactive)
    assert [[t.tenant_id for t in b] for b in tenant_blocks(order, rows)] == [["t1", "t2"], ["t4"]]
    changed = {
        "t1": {"meta": {"aud=1:x"}},
        "t2": {"google_data_manager": {"aud=2:y"}},
        "t4": {"meta": {"aud=3:z"}},
    }
    both, single = change_requests(changed, rows, order)
    # A range over t1..t2 for both platforms, with the more urgent tenant's priority; t3 is
    # left out, so t4 runs alone.
    assert (both.tags[RANGE_START_TAG], both.tags[RANGE_END_TAG]) == ("t1", "t2")
    assert both.partition_key is None
    assert both.asset_selection == sorted([meta_custom_audiences.key, google_customer_match.key])
    assert both.tags["dagster/priority"] == "-1"
    assert single.partition_key == "t4" and RANGE_START_TAG not in single.tags
    assert single.asset_selection == [meta_custom_audiences.key]
    # The run key follows the block's memberships.
    again = change_requests(changed, rows, order)
    assert [r.run_key for r in again] == [both.run_key, single.run_key]
    changed["t2"]["google_data_manager"] = {"aud=2:w"}
    assert change_requests(changed, rows, order)[0].run_key != both.run_key
