"""What the audience-change sensor and the 48-hour activation schedule request."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta

import dagster as dg
import psycopg
import pytest
import requests
from click.testing import CliRunner
from support.activation import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    register_destination,
    runs,
    set_members,
)

from cdp_assets.activation.audiences import audience_signatures
from cdp_assets.activation.cli import destinations
from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.activation.push_requests import (
    awaiting_verdicts,
    cadence_requests,
    change_requests,
    changed_audiences,
)
from cdp_assets.activation.schedules import activation_every_48_hours
from cdp_assets.activation.vtex_collections.assets import vtex_product_collections
from cdp_assets.analytics.schedules import on_48_hour_cadence
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.status import destination_problems
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_devkit.sandbox.meta.graph import MetaSandbox

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
    on_meta = {"trig_a": {"meta"}}
    active = [day for day in days if cadence_requests(rows, ORDER, on_meta, day)]
    gaps = {(b - a).days for a, b in zip(active, active[1:], strict=False)}
    assert gaps == {2}
    (request,) = cadence_requests(rows, ORDER, on_meta, active[0])
    assert request.partition_key == "trig_a"
    assert request.asset_selection == [meta_custom_audiences.key]
    # Google's and the collections' assets get runs of their own, for their tenants only.
    both = cadence_requests(rows, ORDER, {**on_meta, "trig_b": {"vtex_collections"}}, active[0])
    assert {(r.partition_key, *r.asset_selection) for r in both} == {
        ("trig_a", meta_custom_audiences.key),
        ("trig_b", vtex_product_collections.key),
    }
    assert cadence_requests(rows, ORDER, {}, active[0]) == []


def test_one_run_per_platform_asset_spans_the_changed_tenants_and_pushes_only_changes() -> None:
    rows = [
        Tenant(t, t, "K", "T", priority=p)
        for t, p in (("t1", 3), ("t2", 1), ("t3", 5), ("t5", 2), ("t6", 4))
    ]
    order = ["t1", "t2", "t3", "t4", "t5", "t6"]  # t4: inactive, or no partition yet
    changed = {
        "t1": {"meta": {"aud=1:x"}},
        "t2": {"google_data_manager": {"aud=2:y"}},
        "t3": {"meta": {"aud=3:z"}},
        "t6": {"meta": {"aud=6:v"}},
    }
    google, meta_span, meta_single = change_requests(changed, rows, order)
    # Meta: one run over t1..t3, t2 included though its Meta audiences did not change; one
    # for t6 (t4 is no partition a run may cover, and t5, unchanged, is at the span's edge).
    # Google: t2. No priority: the chain's runs are first come, first served in the queue.
    assert meta_span.asset_selection == [meta_custom_audiences.key]
    assert (meta_span.tags[RANGE_START_TAG], meta_span.tags[RANGE_END_TAG]) == ("t1", "t3")
    assert meta_span.partition_key is None
    assert not any("dagster/priority" in r.tags for r in (google, meta_span, meta_single))
    assert meta_single.partition_key == "t6" and RANGE_START_TAG not in meta_single.tags
    assert google.partition_key == "t2" and google.asset_selection == [google_customer_match.key]
    # Each run pushes only the audiences that changed (t2's Meta audiences are left alone).
    for request, op in (
        (google, "google_customer_match"),
        (meta_span, "meta_custom_audiences"),
        (meta_single, "meta_custom_audiences"),
    ):
        assert request.run_config == {"ops": {op: {"config": {"changed_only": True}}}}
    # The run key follows the span's memberships on the asset's platforms only.
    keys = [r.run_key for r in change_requests(changed, rows, order)]
    assert keys == [google.run_key, meta_span.run_key, meta_single.run_key]
    assert len(set(keys)) == 3
    changed["t2"]["google_data_manager"] = {"aud=2:w"}
    again = change_requests(changed, rows, order)
    assert again[0].run_key != google.run_key
    assert [r.run_key for r in again[1:]] == [meta_span.run_key, meta_single.run_key]
    # Runs come most urgent first, by the span's most urgent changed tenant: with t1's change
    # gone, t6 (priority 4) before t3 (5).
    del changed["t1"]
    _, meta_t6, meta_t3 = change_requests(changed, rows, order)
    assert meta_t6.partition_key == "t6" and meta_t3.partition_key == "t3"


def test_schedule_runs_the_assets_of_each_tenants_destinations(instance, url) -> None:
    """trig_a has a Meta destination, trig_b none: one run, for trig_a's Meta asset."""
    instance.add_dynamic_partitions(tenants.name, ORDER)
    days = [datetime(2026, 12, 20, 10, tzinfo=UTC) + timedelta(days=n) for n in range(2)]
    on, off = sorted(days, key=lambda day: not on_48_hour_cadence(day.date()))
    resources = {"warehouse": WarehouseResource(url=url)}
    with dg.build_schedule_context(instance, on, resources=resources) as context:
        (request,) = activation_every_48_hours(context)
    assert request.partition_key == "trig_a"
    assert request.asset_selection == [meta_custom_audiences.key]
    with dg.build_schedule_context(instance, off, resources=resources) as context:
        assert isinstance(activation_every_48_hours(context), dg.SkipReason)


def test_after_a_reset_the_sensor_pushes_the_same_membership_again(instance, url) -> None:
    """A run that failed on a deleted audience is not launched again for the same membership
    (its run key is spent, and the audience rests after the failure); once the operator
    resets the destination, the sensor's request is a new one."""
    with psycopg.connect(url) as conn:
        add_tenant_with_customers(conn, "trig_gone", 300)
        set_members(conn, "trig_gone", range(200))
        register_destination(
            conn,
            Destination(
                "trig_gone_meta",
                "trig_gone",
                "meta",
                "55",
                credential_refs={"access_token": "TRIGGER_META_TOKEN"},
                recreate_deleted_audiences=False,
            ),
        )
        # trig_gone alone: its run keys, whatever the other tenants' changes.
        rows = [t for t in list_tenants(conn) if t.tenant_id == "trig_gone"]
        order = ["trig_gone"]
        instance.add_dynamic_partitions(tenants.name, ["trig_gone"])
        with MetaSandbox({"trigger-token": ["55"]}) as meta:
            resources = {
                "warehouse": WarehouseResource(url=url),
                "meta": MetaResource(graph_url=meta.graph_url, retry_base_seconds=0.01),
            }

            def push() -> dg.ExecuteInProcessResult:
                return dg.materialize(
                    [meta_custom_audiences],
                    partition_key="trig_gone",
                    instance=instance,
                    resources=resources,
                    raise_on_error=False,
                )

            assert push().success
            (audience,) = [a["id"] for a in meta.audiences("55") if a["name"].startswith("trig_g")]
            graph = requests.delete(
                f"{meta.graph_url}/v26.0/{audience}", params={"access_token": "trigger-token"}
            )
            assert graph.json() == {"success": True}
            set_members(conn, "trig_gone", range(10, 210))
            (failing,) = [
                r
                for r in change_requests(changed_audiences(conn), rows, order)
                if r.partition_key == "trig_gone"
            ]
            assert not push().success
            # It rests after the failure; once the rest is over, its request is the same.
            assert not change_requests(changed_audiences(conn), rows, order)
            later = datetime.now(UTC) + timedelta(minutes=16)
            (again,) = [
                r
                for r in change_requests(changed_audiences(conn, later), rows, order)
                if r.partition_key == "trig_gone"
            ]
            assert again.run_key == failing.run_key

            reset = CliRunner().invoke(
                destinations, ["reset", "trig_gone_meta"], env={"DATABASE_URL": url}
            )
            assert reset.exit_code == 0, reset.output
            (after_reset,) = [
                r
                for r in change_requests(changed_audiences(conn), rows, order)
                if r.partition_key == "trig_gone"
            ]
            assert after_reset.run_key != failing.run_key
            assert push().success
        assert "trig_gone" not in changed_audiences(conn)


def test_a_change_push_over_a_span_of_tenants_syncs_only_the_changed_audiences(
    instance, url
) -> None:
    with psycopg.connect(url) as conn:
        register_destination(
            conn,
            Destination(
                "trig_b_meta",
                "trig_b",
                "meta",
                "55",
                credential_refs={"access_token": "TRIGGER_META_TOKEN"},
            ),
        )
        instance.add_dynamic_partitions(tenants.name, ORDER)
        set_members(conn, "trig_b", range(200))  # over Meta's minimum audience size
        with MetaSandbox({"trigger-token": ["55"]}) as meta:

            def push(request: dg.RunRequest) -> dg.ExecuteInProcessResult:
                result = dg.materialize(
                    [meta_custom_audiences],
                    instance=instance,
                    resources={
                        "warehouse": WarehouseResource(url=url),
                        "meta": MetaResource(graph_url=meta.graph_url),
                    },
                    tags=request.tags,
                    run_config=request.run_config,
                )
                assert result.success
                return result

            def history() -> dict[str, int]:
                """Syncs recorded per destination."""
                return {d: len(runs(conn, d)) for d in ("trig_a_meta", "trig_b_meta")}

            set_members(conn, "trig_a", range(30, 230))
            (both,) = change_requests(changed_audiences(conn), list_tenants(conn), ORDER)
            assert (both.tags[RANGE_START_TAG], both.tags[RANGE_END_TAG]) == ("trig_a", "trig_b")
            push(both)
            assert changed_audiences(conn) == {}
            before = history()

            # trig_b changes alone: a run over both tenants would push only trig_b's audience.
            set_members(conn, "trig_b", range(5, 205))
            assert set(changed_audiences(conn)) == {"trig_b"}
            span = dg.RunRequest(
                tags={RANGE_START_TAG: "trig_a", RANGE_END_TAG: "trig_b"},
                run_config=both.run_config,
            )
            result = push(span)
            (materialization, *_) = result.asset_materializations_for_node("meta_custom_audiences")
            assert materialization.metadata["audiences_already_synced"].value == 1
            assert history() == {
                "trig_a_meta": before["trig_a_meta"],
                "trig_b_meta": before["trig_b_meta"] + 1,
            }
            assert changed_audiences(conn) == {}


def test_a_destination_audience_that_keeps_failing_rests_between_pushes_of_changes(
    instance, url
) -> None:
    """Each refresh changes an audience's members; a destination that keeps failing (here, its
    token missing from the environment) must not fail, and alert, once per refresh. After a
    failure its changes rest 15 minutes, twice as long after each further failure in a row: a
    sensor's push over its tenant skips it meanwhile, a push by hand tries it, the platform's
    status names it. `cdp destinations retry` ends the rest; a completed sync clears the
    count."""
    tenant, destination = "trig_rest", "trig_rest_meta"
    with psycopg.connect(url) as conn:
        add_tenant_with_customers(conn, tenant, 300)
        set_members(conn, tenant, range(200))
        register_destination(
            conn,
            Destination(
                destination, tenant, "meta", "55", credential_refs={"access_token": "TRIG_REST"}
            ),
        )
        os.environ.pop("TRIG_REST", None)
        instance.add_dynamic_partitions(tenants.name, [tenant])
        with MetaSandbox({"trigger-token": ["55"]}) as meta:
            resources = {
                "warehouse": WarehouseResource(url=url),
                "meta": MetaResource(graph_url=meta.graph_url),
            }

            def push_changes(
                by_sensor: bool = True, reexecuting: dict[str, str] | None = None
            ) -> dg.ExecuteInProcessResult:
                """A push of changes as the change sensor launches it, or by hand; as a
                re-execution of another run with `reexecuting`'s tags."""
                sensor = {"dagster/sensor_name": "audience_changes_sensor"} if by_sensor else {}
                return dg.materialize(
                    [meta_custom_audiences],
                    partition_key=tenant,
                    instance=instance,
                    resources=resources,
                    run_config={
                        "ops": {"meta_custom_audiences": {"config": {"changed_only": True}}}
                    },
                    tags={**sensor, **(reexecuting or {})},
                    raise_on_error=False,
                )

            def failing() -> tuple[int, datetime | None]:
                row = conn.execute(
                    "SELECT failures_in_a_row, last_failed_at FROM cdp.destination_audiences"
                    " WHERE destination_id = %s",
                    (destination,),
                ).fetchone()
                conn.commit()
                assert row is not None
                return row

            def changed_in(minutes: float) -> bool:
                later = datetime.now(UTC) + timedelta(minutes=minutes)
                return tenant in changed_audiences(conn, later)

            def tried() -> int:
                return len(runs(conn, destination))

            def rest_over() -> None:
                conn.execute(
                    "UPDATE cdp.destination_audiences"
                    " SET last_failed_at = last_failed_at - interval '16 minutes'"
                    " WHERE destination_id = %s",
                    (destination,),
                )
                conn.commit()

            assert changed_in(0)
            assert not push_changes().success
            count, failed_at = failing()
            assert count == 1 and failed_at is not None
            set_members(conn, tenant, range(10, 210))
            assert not changed_in(0) and not changed_in(14) and changed_in(16)
            (problem,) = [
                p
                for p in destination_problems(conn, [tenant], datetime.now(UTC))
                if p.tenant_id == tenant
            ]
            assert "1 syncs failed in a row" in problem.detail
            # Nor is a verdict poll launched for it while it rests.
            conn.execute(
                "INSERT INTO cdp.destination_requests"
                " (destination_id, audience, platform_request_id, operation)"
                " VALUES (%s, %s, 'poll', 'add')",
                (destination, AUDIENCE),
            )
            conn.commit()
            assert tenant not in awaiting_verdicts(conn)
            rest_over()
            assert tenant in awaiting_verdicts(conn)
            conn.execute(
                "UPDATE cdp.destination_audiences SET last_failed_at = now()"
                " WHERE destination_id = %s",
                (destination,),
            )
            conn.execute("DELETE FROM cdp.destination_requests WHERE platform_request_id = 'poll'")
            conn.commit()

            # A sensor's push reaching the tenant meanwhile leaves the audience alone.
            before = tried()
            resting = push_changes()
            assert resting.success and tried() == before
            (materialization,) = resting.asset_materializations_for_node("meta_custom_audiences")
            assert materialization.metadata["audiences_resting"].value == 1
            # Pushed by hand, it is tried (and fails: one more in a row).
            assert not push_changes(by_sensor=False).success
            assert tried() == before + 1 and failing()[0] == 2
            assert not changed_in(29) and changed_in(31)
            listed = CliRunner().invoke(destinations, ["list"], env={"DATABASE_URL": url})
            assert f"{AUDIENCE} (failed 2 in a row)" in listed.output

            # Once its rest is over, a sensor's push tries it again.
            rest_over()
            rest_over()
            assert changed_in(0)
            assert not push_changes().success
            assert failing()[0] == 3

            # The operator renews the token: `retry` ends the rest, nothing else forgotten.
            os.environ["TRIG_REST"] = "trigger-token"
            retry = CliRunner().invoke(
                destinations, ["retry", destination], env={"DATABASE_URL": url}
            )
            assert retry.exit_code == 0, retry.output
            assert failing() == (0, None) and changed_in(0)
            assert push_changes().success
            assert not changed_in(0)

            # A completed sync alone clears the count.
            os.environ.pop("TRIG_REST")
            set_members(conn, tenant, range(20, 220))
            assert not push_changes().success and failing()[0] == 1
            os.environ["TRIG_REST"] = "trigger-token"
            rest_over()
            assert push_changes().success
            assert failing()[0] == 0
            assert not destination_problems(conn, [tenant], datetime.now(UTC))

            # Resting again: the sensor's run, retried automatically, leaves it alone; the same
            # run re-executed by hand (with the sensor's name among the tags it copies) tries it.
            os.environ.pop("TRIG_REST")
            set_members(conn, tenant, range(30, 230))
            failed_push = push_changes()
            assert not failed_push.success and failing()[0] == 1
            before = tried()
            parent = {"dagster/parent_run_id": failed_push.run_id}
            retried = push_changes(reexecuting={**parent, "dagster/retry_number": "1"})
            assert retried.success and tried() == before
            assert not push_changes(reexecuting=parent).success
            assert tried() == before + 1 and failing()[0] == 2
