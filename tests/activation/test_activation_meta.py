"""Meta Custom Audiences activation: the real asset and SDK against the Graph sandbox."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from urllib.parse import urlencode

import dagster as dg
import psycopg
import pytest
from click.testing import CliRunner, Result
from facebook_business.adobjects.adaccount import AdAccount
from facebook_business.adobjects.customaudience import CustomAudience
from facebook_business.api import FacebookAdsApi
from facebook_business.session import FacebookSession
from support.activation import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    outcome,
    register_destination,
    runs,
    set_members,
)
from support.activation import push as push_activation

from cdp_assets.activation.audiences import audience_members
from cdp_assets.activation.cli import destinations
from cdp_assets.activation.destinations import Destination, DestinationAudience, add_audience
from cdp_assets.activation.history import open_activation_runs
from cdp_assets.activation.identifiers import (
    meta_row,
    normalize_email,
    normalize_phone,
    sha256_hex,
)
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.audiences import FORM_PIECE, MetaAudiences, MetaError, form_encode
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.activation.push_requests import changed_audiences
from cdp_assets.activation.run import FAILURE_LENGTH, failure_description
from cdp_assets.activation.sync import (
    DELETE_UP_TO_BYTES,
    SyncOptions,
    SyncOutcome,
    sync_audience,
)
from cdp_assets.lib.outbound import Deadlines
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_devkit.sandbox.meta.graph import GraphLimits, MetaSandbox

TOKEN_REF = "META_TEST_TOKEN"
TOKEN = "meta-test-token"
ACCOUNT = "4242"
CROWDED_ACCOUNT = "4343"  # an account holding many other audiences


@pytest.fixture(scope="module")
def url():
    with activation_warehouse() as warehouse:
        yield warehouse


@pytest.fixture(scope="module")
def sandbox():
    os.environ[TOKEN_REF] = TOKEN
    with MetaSandbox({TOKEN: [ACCOUNT, CROWDED_ACCOUNT]}) as meta:
        yield meta


@pytest.fixture(autouse=True)
def no_faults(sandbox):
    sandbox.clear_faults()
    yield
    sandbox.clear_faults()


def setup(url: str, tenant_id: str, customers: int, members, **settings) -> Destination:
    destination = Destination(
        f"{tenant_id}_meta",
        tenant_id,
        "meta",
        ACCOUNT,
        credential_refs={"access_token": TOKEN_REF},
        **settings,
    )
    with psycopg.connect(url) as conn:
        add_tenant_with_customers(conn, tenant_id, customers)
        set_members(conn, tenant_id, members)
        register_destination(conn, destination)
    return destination


def push(instance, url, sandbox, tenant_id, **config) -> dg.ExecuteInProcessResult:
    resources = {
        "warehouse": WarehouseResource(url=url),
        "meta": MetaResource(graph_url=sandbox.graph_url, retry_base_seconds=0.01),
    }
    return push_activation(meta_custom_audiences, instance, tenant_id, resources, config)


def audience_id(sandbox: MetaSandbox, tenant_id: str) -> str:
    (audience,) = [a for a in sandbox.audiences(ACCOUNT) if a["name"] == f"{tenant_id}: {AUDIENCE}"]
    return audience["id"]


def member_keys(sandbox: MetaSandbox, tenant_id: str) -> set[str]:
    return {row["EXTERN_ID"] for row in sandbox.members(audience_id(sandbox, tenant_id))}


def matchable(tenant_id: str, numbers) -> set[str]:
    return {f"{tenant_id}-{i}" for i in numbers if i % 10 != 9}


def user_requests(sandbox: MetaSandbox, tenant_id: str) -> list:
    """Requests that carried members for this tenant's audience."""
    audience = audience_id(sandbox, tenant_id)
    return [r for r in sandbox.requests(f"/{audience}/users") if r.payload]


def audience_reads(sandbox: MetaSandbox, tenant_id: str) -> list:
    """GETs of the audience's node (its match info)."""
    audience = audience_id(sandbox, tenant_id)
    return [r for r in sandbox.requests(audience) if r.method == "GET" and "/users" not in r.path]


def test_first_push_then_unchanged_push(instance, url, sandbox) -> None:
    destination = setup(url, "meta_first", 300, range(250))
    first = push(instance, url, sandbox, "meta_first")
    assert first.success
    row = outcome(first)
    assert (row["status"], row["desired"], row["unmatchable"], row["added"]) == (
        "synced",
        225,
        25,
        225,
    )
    assert member_keys(sandbox, "meta_first") == matchable("meta_first", range(250))
    # Rows are hashed with our normalization: e-mail trimmed and lower-cased, phone E.164.
    one = next(
        m
        for m in sandbox.members(audience_id(sandbox, "meta_first"))
        if m["EXTERN_ID"] == "meta_first-7"
    )
    assert one["EMAIL"] == sha256_hex("cliente.7@exemplo.com.br")
    assert one["PHONE"] == sha256_hex("5511960070007")
    assert one["FN"] == sha256_hex("josé") and one["LN"] == sha256_hex("conceição")
    (upload,) = user_requests(sandbox, "meta_first")
    assert upload.payload["schema"] == ["EXTERN_ID", "EMAIL", "PHONE", "FN", "LN", "COUNTRY"]
    assert upload.session["batch_seq"] == 1 and upload.session["last_batch_flag"] is True

    node_reads = len(audience_reads(sandbox, "meta_first"))
    second = push(instance, url, sandbox, "meta_first")
    row = outcome(second)
    assert (row["added"], row["removed"], row["unchanged"]) == (0, 0, 225)
    assert len(user_requests(sandbox, "meta_first")) == 1  # nothing carrying members
    # Nor any other call: the match info Meta gave after the first push stands.
    assert len(audience_reads(sandbox, "meta_first")) == node_reads
    first_info = set(outcome(first)["match_info"].split(", "))
    assert set(row["match_info"].split(", ")) == first_info
    assert "approximate_count_lower_bound=225" in first_info
    # Confirmed members with unchanged inputs stay in the database: only the 25 Meta could
    # not take are read out (and hashed) again.
    target = DestinationAudience(destination, AUDIENCE, {}, None)
    with psycopg.connect(url) as reader:
        fresh = list(audience_members(reader, target, "BR", meta_row).fresh())
    assert {key for key, _, _ in fresh} == {f"meta_first-{i}" for i in range(9, 250, 10)}
    with psycopg.connect(url) as conn:
        history = runs(conn, "meta_first_meta")
    assert [(r["status"], r["added"], r["unchanged"]) for r in history] == [
        ("synced", 225, 0),
        ("synced", 0, 225),
    ]
    assert all(r["dagster_run_id"] for r in history)


def test_form_bodies_are_what_requests_would_send() -> None:
    """Encoded in pieces, a batch's body is still the text urlencode gives, byte for byte,
    with multi-byte characters on every side of the pieces' edges."""
    text = "".join(f"ç€😀&=+ {i}" for i in range(3 * FORM_PIECE // 10))
    assert len(text) > 2 * FORM_PIECE
    fields = {"payload": json.dumps({"data": [[text]]}), "batch_seq": 3, "flag": True, "é": ""}
    assert form_encode(fields) == urlencode(fields, doseq=True)


def analyzed(result: dg.ExecuteInProcessResult) -> bool:
    (event,) = result.get_asset_materialization_events()
    return event.materialization.metadata["sync_state_analyzed"].value


def test_a_push_that_changes_a_tenth_of_the_state_refreshes_its_statistics(
    instance, url, sandbox
) -> None:
    """The next sync plans on them whether or not autovacuum has come by."""
    setup(url, "meta_stats", 3000, range(2000))
    first = push(instance, url, sandbox, "meta_stats")
    assert outcome(first)["added"] == 1800
    assert analyzed(first)
    with psycopg.connect(url) as conn:
        (estimate,) = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'cdp.destination_members'::regclass"
        ).fetchone()
        (count,) = conn.execute("SELECT count(*) FROM cdp.destination_members").fetchone()
    assert estimate == count
    unchanged = push(instance, url, sandbox, "meta_stats")
    assert outcome(unchanged)["unchanged"] == 1800
    assert not analyzed(unchanged)


def test_partial_change_sends_only_the_difference(instance, url, sandbox) -> None:
    setup(url, "meta_partial", 400, range(200))
    assert push(instance, url, sandbox, "meta_partial").success
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_partial", range(20, 230))  # 20 leave, 30 join
        conn.execute(
            "UPDATE marts.customers SET email = 'New.Address@Exemplo.com'"
            " WHERE customer_key = 'meta_partial-100'"
        )
        conn.commit()
    result = push(instance, url, sandbox, "meta_partial")
    row = outcome(result)
    # 18 matchable leavers + the changed member's old row; 27 matchable joiners + its new row.
    assert (row["removed"], row["added"]) == (19, 28)
    # 210 members, 21 of them without a matchable identifier; all but the 28 sent are as
    # Meta holds them.
    assert (row["desired"], row["unmatchable"], row["unchanged"]) == (189, 21, 161)
    assert member_keys(sandbox, "meta_partial") == matchable("meta_partial", range(20, 230))
    changed = next(
        m
        for m in sandbox.members(audience_id(sandbox, "meta_partial"))
        if m["EXTERN_ID"] == "meta_partial-100"
    )
    assert changed["EMAIL"] == sha256_hex("new.address@exemplo.com")
    removal, addition = user_requests(sandbox, "meta_partial")[-2:]
    assert removal.form.get("method") == "DELETE" and removal.method == "POST"
    assert len(removal.payload["data"]) == 19 and len(addition.payload["data"]) == 28


def test_a_sync_after_a_large_one_starts_from_emptied_working_tables(url, sandbox) -> None:
    """A connection's working tables are emptied by DELETE while small; after a large sync
    they are truncated, or every later sync on the connection would scan the dead rows."""
    destination = setup(url, "meta_tables", 6_000, range(6_000), min_audience_size=1)
    target = DestinationAudience(destination, AUDIENCE, {}, None)
    platform = MetaAudiences(ACCOUNT, TOKEN, graph_url=sandbox.graph_url)
    sizes = []
    with psycopg.connect(url) as conn, psycopg.connect(url) as reader:
        for members in (range(6_000), range(200), range(200), range(210)):
            set_members(conn, "meta_tables", members)
            synced = sync_audience(
                conn,
                target,
                audience_members(reader, target, "BR", meta_row),
                platform,
                SyncOptions(force=True),
            )
            assert synced.status == "synced", synced.reason
            target = DestinationAudience(
                destination, AUDIENCE, {}, platform_audience_id(conn, destination)
            )
            sizes.append(
                conn.execute(
                    "SELECT pg_relation_size('desired_members'),"
                    " pg_relation_size('leaving_members')"
                ).fetchone()
            )
    (first_desired, _), (_, second_leaving), third, fourth = sizes
    assert first_desired > DELETE_UP_TO_BYTES and second_leaving > DELETE_UP_TO_BYTES
    # Truncated before the third sync, which had nothing to hash or remove; the fourth's
    # nine joiners fit in a page.
    assert third == (0, 0)
    assert fourth[0] == 8192 and fourth[1] == 0
    assert member_keys(sandbox, "meta_tables") == matchable("meta_tables", range(210))


def platform_audience_id(conn: psycopg.Connection, destination: Destination) -> str:
    (platform_id,) = conn.execute(
        "SELECT platform_audience_id FROM cdp.destination_audiences"
        " WHERE destination_id = %s AND audience = %s",
        (destination.destination_id, AUDIENCE),
    ).fetchone()
    return platform_id


def test_mass_removal_is_refused_then_forced_in_post_batches(instance, url, sandbox) -> None:
    setup(url, "meta_mass", 25_000, range(25_000))
    assert push(instance, url, sandbox, "meta_mass").success
    uploads = user_requests(sandbox, "meta_mass")
    assert [len(r.payload["data"]) for r in uploads] == [10_000, 10_000, 2_500]
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_mass", range(1_000))

    refused = push(instance, url, sandbox, "meta_mass")
    assert refused.success
    row = outcome(refused)
    assert row["status"] == "refused" and "force" in row["reason"]
    assert len(user_requests(sandbox, "meta_mass")) == 3
    assert len(member_keys(sandbox, "meta_mass")) == 22_500

    forced = push(instance, url, sandbox, "meta_mass", force=True)
    assert outcome(forced)["removed"] == 21_600
    removals = user_requests(sandbox, "meta_mass")[3:]
    assert [len(r.payload["data"]) for r in removals] == [10_000, 10_000, 1_600]
    assert all(r.method == "POST" and r.form["method"] == "DELETE" for r in removals)
    assert member_keys(sandbox, "meta_mass") == matchable("meta_mass", range(1_000))


def test_dry_run_and_size_floor_send_nothing(instance, url, sandbox) -> None:
    setup(url, "meta_dry", 300, range(300))
    before = len(sandbox.requests())
    dry = push(instance, url, sandbox, "meta_dry", dry_run=True)
    row = outcome(dry)
    assert (row["status"], row["added"], row["desired"]) == ("dry_run", 270, 270)
    assert len(sandbox.requests()) == before  # not even the audience was created
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM cdp.destination_members WHERE destination_id = 'meta_dry_meta'"
        ).fetchone() == (0,)
        set_members(conn, "meta_dry", range(50))
    small = push(instance, url, sandbox, "meta_dry")
    row = outcome(small)
    assert row["status"] == "skipped" and "minimum of 100" in row["reason"]
    assert len(sandbox.requests()) == before


def test_rate_limits_and_html_502_are_retried(instance, url, sandbox) -> None:
    setup(url, "meta_retry", 200, range(200))
    sandbox.inject("rate_limit", times=2)
    sandbox.inject("bad_gateway_html")
    result = push(instance, url, sandbox, "meta_retry")
    assert result.success
    assert member_keys(sandbox, "meta_retry") == matchable("meta_retry", range(200))
    faulted = [r.fault for r in sandbox.requests("/users") if r.fault]
    assert faulted == ["rate_limit", "rate_limit", "bad_gateway_html"]


def test_a_refused_batch_fails_the_run_and_keeps_state(instance, url, sandbox) -> None:
    setup(url, "meta_refused", 200, range(200))
    sandbox.inject("invalid_parameter")
    failed = push(instance, url, sandbox, "meta_refused")
    assert not failed.success
    row = outcome(failed)
    assert row["status"] == "failed" and row["reason"].startswith("MetaError: code=100 ")
    with psycopg.connect(url) as conn:
        (history,) = runs(conn, "meta_refused_meta")
        assert history["status"] == "failed" and "code=100" in history["reason"]
        assert conn.execute(
            "SELECT count(*) FROM cdp.destination_members"
            " WHERE destination_id = 'meta_refused_meta'"
        ).fetchone() == (0,)
    assert push(instance, url, sandbox, "meta_refused").success  # the next run catches up
    assert member_keys(sandbox, "meta_refused") == matchable("meta_refused", range(200))


def test_a_failed_runs_description_names_each_cause_masked_and_bounded(monkeypatch) -> None:
    """It becomes the run's row of cdp.sync_errors and the alert's text."""
    failed = [
        SyncOutcome(
            f"dest_{i}",
            AUDIENCE,
            "meta",
            "failed",
            f"MetaError: Meta 400 code=190 subcode=463: Session has expired for {TOKEN}"
            f" (access_token=EAAB{i}xyz)",
        )
        for i in range(40)
    ]
    monkeypatch.setenv(TOKEN_REF, TOKEN)
    text = failure_description([SyncOutcome("dest_ok", AUDIENCE, "meta", "synced"), *failed])
    assert text.startswith(
        "activation failed for 40 of 41 destination audiences (the others went on):"
        f" dest_0/{AUDIENCE}: MetaError: Meta 400 code=190 subcode=463: Session has expired"
    )
    assert TOKEN not in text and "EAAB" not in text
    assert len(text) == FAILURE_LENGTH and text.endswith("…")
    alone = failure_description(failed[:1])
    assert alone.startswith("activation failed for 1 of 1 destination audiences: dest_0/")


def test_full_replace_uses_a_replace_session(instance, url, sandbox) -> None:
    setup(url, "meta_replace", 300, range(150))
    assert push(instance, url, sandbox, "meta_replace").success
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_replace", range(100, 260))
    result = push(instance, url, sandbox, "meta_replace", full_replace=True, force=True)
    assert outcome(result)["status"] == "synced"
    replaces = sandbox.requests(f"/{audience_id(sandbox, 'meta_replace')}/usersreplace")
    assert [r.session["last_batch_flag"] for r in replaces] == [True]
    assert member_keys(sandbox, "meta_replace") == matchable("meta_replace", range(100, 260))
    again = outcome(push(instance, url, sandbox, "meta_replace"))  # state matches the platform
    assert (again["unchanged"], again["added"], again["removed"]) == (144, 0, 0)


def test_tenants_never_mix_and_no_raw_pii_leaves(instance, url, sandbox) -> None:
    setup(url, "meta_a", 150, range(150))
    setup(url, "meta_b", 150, range(150))
    results = [push(instance, url, sandbox, t) for t in ("meta_a", "meta_b")]
    assert member_keys(sandbox, "meta_a") == matchable("meta_a", range(150))
    assert member_keys(sandbox, "meta_b") == matchable("meta_b", range(150))

    with psycopg.connect(url) as conn:
        raw = conn.execute(
            "SELECT email, phone_e164 FROM marts.customers"
            " WHERE tenant_id IN ('meta_a', 'meta_b') AND email IS NOT NULL"
        ).fetchall()
    clear = set()
    for email, phone in raw:
        clear |= {email.strip(), normalize_email(email)}
        e164 = normalize_phone(phone, "BR")
        clear |= {phone, e164, e164[1:]}
    sent = [json.dumps([r.query, r.form]) for r in sandbox.requests()]
    logs = [entry.user_message for result in results for entry in instance.all_logs(result.run_id)]
    metadata = [
        json.dumps(str(value.value))
        for result in results
        for event in result.get_asset_materialization_events()
        for value in event.materialization.metadata.values()
    ]
    for text in sent + logs + metadata:
        assert not any(value in text for value in clear)


def test_rows_the_platform_refuses_are_recorded_and_sent_again(instance, url, sandbox) -> None:
    setup(url, "meta_rejects", 200, range(200))
    refused = sha256_hex("cliente.12@exemplo.com.br")
    sandbox.refuse([refused])
    first = outcome(push(instance, url, sandbox, "meta_rejects"))
    assert (first["added"], first["rejected"]) == (179, 1)
    with psycopg.connect(url) as conn:
        (reject,) = conn.execute(
            "SELECT j.member_key, j.operation, j.reason FROM cdp.activation_rejects j"
            " JOIN cdp.activation_runs r USING (activation_run_id)"
            " WHERE r.destination_id = 'meta_rejects_meta'"
        ).fetchall()
    assert reject == ("meta_rejects-12", "add", "row refused by the platform")
    assert "meta_rejects-12" not in member_keys(sandbox, "meta_rejects")

    sandbox.clear_faults()
    second = outcome(push(instance, url, sandbox, "meta_rejects"))
    assert (second["added"], second["rejected"], second["unchanged"]) == (1, 0, 179)
    assert member_keys(sandbox, "meta_rejects") == matchable("meta_rejects", range(200))


def test_a_full_replace_records_the_rows_meta_refuses_as_rejected_not_confirmed(
    instance, url, sandbox
) -> None:
    # Meta's replace ends at once here: the next diff is not kept waiting on its lock.
    sandbox.set_limits(GraphLimits(replace_lock_seconds=0))
    setup(url, "meta_replace_rejects", 200, range(200))
    assert push(instance, url, sandbox, "meta_replace_rejects").success
    sandbox.refuse([sha256_hex("cliente.12@exemplo.com.br")])
    replaced = outcome(
        push(instance, url, sandbox, "meta_replace_rejects", full_replace=True, force=True)
    )
    assert (replaced["status"], replaced["rejected"]) == ("synced", 1)
    assert "meta_replace_rejects-12" not in member_keys(sandbox, "meta_replace_rejects")
    with psycopg.connect(url) as conn:
        confirmed = {
            key
            for (key,) in conn.execute(
                "SELECT member_key FROM cdp.destination_members"
                " WHERE destination_id = 'meta_replace_rejects_meta'"
            )
        }
        (reject,) = conn.execute(
            "SELECT j.member_key, j.operation FROM cdp.activation_rejects j"
            " JOIN cdp.activation_runs r USING (activation_run_id)"
            " WHERE r.destination_id = 'meta_replace_rejects_meta' AND r.mode = 'replace'"
        ).fetchall()
    assert "meta_replace_rejects-12" not in confirmed
    assert reject == ("meta_replace_rejects-12", "add")

    sandbox.clear_faults()
    again = outcome(push(instance, url, sandbox, "meta_replace_rejects"))
    assert (again["added"], again["rejected"]) == (1, 0), (again["status"], again["reason"])
    assert member_keys(sandbox, "meta_replace_rejects") == matchable(
        "meta_replace_rejects", range(200)
    )


@pytest.mark.parametrize("changed_only", [False, True], ids=["every audience", "changed only"])
def test_an_audience_without_its_view_fails_alone(instance, url, sandbox, changed_only) -> None:
    tenant_id = "meta_noview_changes" if changed_only else "meta_noview"
    destination = setup(url, tenant_id, 150, range(150))
    with psycopg.connect(url) as conn:
        add_audience(conn, destination.destination_id, "audience_never_built")
        conn.commit()
    result = push(instance, url, sandbox, tenant_id, changed_only=changed_only)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert f"{tenant_id}_meta/audience_never_built" in failure.step_failure_data.error.message
    with psycopg.connect(url) as conn:
        history = {r["audience"]: r for r in runs(conn, destination.destination_id)}
    assert history[AUDIENCE]["status"] == "synced" and history[AUDIENCE]["added"] == 135
    assert history["audience_never_built"]["status"] == "failed"
    assert (
        "no audience materialized view audiences.audience_never_built"
        in (history["audience_never_built"]["reason"])
    )


def test_a_sync_that_fails_half_way_is_pushed_again_even_once_its_members_are_back(
    instance, url, sandbox
) -> None:
    """The stored signature says what the platform holds. A sync whose removals went through
    and whose additions were refused leaves none: once the audience is back at the members
    of the last completed sync, a push of only the changed audiences still sends them."""
    setup(url, "meta_half", 300, range(200))
    assert push(instance, url, sandbox, "meta_half").success
    with psycopg.connect(url) as conn:
        assert "meta_half" not in changed_audiences(conn)
        set_members(conn, "meta_half", range(100, 300))
        sandbox.inject("invalid_parameter", method="POST")  # the additions, not the removals
        assert not push(instance, url, sandbox, "meta_half", changed_only=True).success
        assert member_keys(sandbox, "meta_half") == matchable("meta_half", range(100, 200))
        set_members(conn, "meta_half", range(200))
        # After its rest (a failed sync holds its changes back a while), it is pushed.
        assert "meta_half" not in changed_audiences(conn)
        conn.execute(
            "UPDATE cdp.destination_audiences SET last_failed_at = now() - interval '1 hour'"
            " WHERE destination_id = 'meta_half_meta'"
        )
        conn.commit()
        assert "meta_half" in changed_audiences(conn)
    assert push(instance, url, sandbox, "meta_half", changed_only=True).success
    assert member_keys(sandbox, "meta_half") == matchable("meta_half", range(200))


def test_a_missing_credential_fails_naming_the_reference(instance, url, sandbox) -> None:
    destination = setup(url, "meta_nocred", 150, range(150))
    with psycopg.connect(url) as conn:
        register_destination(
            conn,
            Destination(
                destination.destination_id,
                "meta_nocred",
                "meta",
                ACCOUNT,
                credential_refs={"access_token": "META_TOKEN_NOT_SET_ANYWHERE"},
            ),
        )
    result = push(instance, url, sandbox, "meta_nocred")
    assert not result.success
    with psycopg.connect(url) as conn:
        (history,) = runs(conn, "meta_nocred_meta")
    assert history["status"] == "failed"
    assert "META_TOKEN_NOT_SET_ANYWHERE is not set" in history["reason"]


def test_one_run_pushes_a_range_of_tenants(instance, url, sandbox) -> None:
    setup(url, "meta_range_a", 250, range(200))
    setup(url, "meta_range_b", 250, range(150))
    with psycopg.connect(url) as conn:
        add_tenant_with_customers(conn, "meta_range_c", 50)  # in the range, no destination
    instance.add_dynamic_partitions(tenants.name, ["meta_range_a", "meta_range_c", "meta_range_b"])
    result = dg.materialize(
        [meta_custom_audiences],
        instance=instance,
        resources={
            "warehouse": WarehouseResource(url=url),
            "meta": MetaResource(graph_url=sandbox.graph_url, retry_base_seconds=0.01),
        },
        tags={RANGE_START_TAG: "meta_range_a", RANGE_END_TAG: "meta_range_b"},
    )
    assert member_keys(sandbox, "meta_range_a") == matchable("meta_range_a", range(200))
    assert member_keys(sandbox, "meta_range_b") == matchable("meta_range_b", range(150))
    # One step for the three partitions, each of them materialized, with a row per tenant
    # (each tenant's materialization carries the run's metadata: a row per destination
    # audience of every tenant, 41 times over, made the event log grow by megabytes a run).
    assert len(result.get_step_success_events()) == 1
    events = result.get_asset_materialization_events()
    assert sorted(e.partition for e in events) == ["meta_range_a", "meta_range_b", "meta_range_c"]
    metadata = events[0].materialization.metadata
    assert metadata["tenants_in_run"].value == 3
    assert "audiences" not in metadata
    rows = [record.data for record in metadata["tenants"].value.records]
    assert [
        (r["tenant_id"], r["destination_audiences"], r["synced"], r["added"]) for r in rows
    ] == [
        ("meta_range_a", 1, 1, 180),
        ("meta_range_b", 1, 1, 135),
    ]
    assert metadata["added"].value == 315
    # Each audience's sync is in the history all the same.
    with psycopg.connect(url) as conn:
        history = conn.execute(
            "SELECT destination_id, added FROM cdp.activation_runs WHERE dagster_run_id = %s"
            " ORDER BY 1",
            (result.run_id,),
        ).fetchall()
    assert history == [("meta_range_a_meta", 180), ("meta_range_b_meta", 135)]
    # The run's log: a line per tenant with destinations, not one per destination audience.
    lines = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if not entry.is_dagster_event and entry.user_message.startswith("meta_range_")
    ]
    assert lines == [
        "meta_range_a: 1 destination audiences (1 synced), +180 -0 =0 rejected 0",
        "meta_range_b: 1 destination audiences (1 synced), +135 -0 =0 rejected 0",
    ]


def test_one_reading_connection_serves_audiences_read_partly_or_whole(url) -> None:
    destination = setup(url, "meta_reader", 150, range(120))
    target = DestinationAudience(destination, AUDIENCE, {}, None)
    with psycopg.connect(url) as reader:
        partial = audience_members(reader, target, "BR", meta_row).fresh()
        next(partial)
        partial.close()  # a reader that stops early (the sync failed mid-audience)
        assert reader.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        whole = list(audience_members(reader, target, "BR", meta_row).fresh())
        assert reader.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert {key for key, _, _ in whole} == {f"meta_reader-{i}" for i in range(120)}


def delete_on_meta(sandbox: MetaSandbox, audience: str) -> None:
    """What deleting the audience in Ads Manager does: the Graph API's DELETE of its node."""
    session = FacebookSession(access_token=TOKEN)
    session.GRAPH = sandbox.graph_url
    CustomAudience(audience, api=FacebookAdsApi(session)).api_delete()


def cdp_destinations(url: str, *args: str) -> Result:
    return CliRunner().invoke(destinations, list(args), env={"DATABASE_URL": url})


def test_an_audience_deleted_on_meta_is_created_again_with_every_member(
    instance, url, sandbox
) -> None:
    setup(url, "meta_gone", 300, range(200))
    assert push(instance, url, sandbox, "meta_gone").success
    deleted = audience_id(sandbox, "meta_gone")
    delete_on_meta(sandbox, deleted)
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_gone", range(210))

    result = push(instance, url, sandbox, "meta_gone")
    assert result.success
    row = outcome(result)
    recreated = audience_id(sandbox, "meta_gone")
    assert recreated != deleted
    # Every member is sent to the new audience, not only the ten that joined.
    assert (row["status"], row["added"], row["removed"], row["unchanged"]) == ("synced", 189, 0, 0)
    assert member_keys(sandbox, "meta_gone") == matchable("meta_gone", range(210))
    assert f"audience {deleted}" in row["reason"] and "code=100 subcode=33" in row["reason"]
    assert f"created {recreated}" in row["reason"]
    with psycopg.connect(url) as conn:
        last = runs(conn, "meta_gone_meta")[-1]
        assert (last["status"], last["reason"]) == ("synced", row["reason"])
        assert platform_audience_id(conn, Destination("meta_gone_meta", "meta_gone", "meta")) == (
            recreated
        )
    again = outcome(push(instance, url, sandbox, "meta_gone"))
    assert (again["added"], again["unchanged"]) == (0, 189)


def test_with_recreation_off_a_deleted_audience_fails_until_reset(instance, url, sandbox) -> None:
    setup(url, "meta_kept", 300, range(200), recreate_deleted_audiences=False)
    assert push(instance, url, sandbox, "meta_kept").success
    deleted = audience_id(sandbox, "meta_kept")
    delete_on_meta(sandbox, deleted)
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_kept", range(210))

    failed = push(instance, url, sandbox, "meta_kept")
    assert not failed.success
    assert not [a for a in sandbox.audiences(ACCOUNT) if a["name"] == f"meta_kept: {AUDIENCE}"]
    (failure,) = [e for e in failed.all_events if e.is_step_failure]
    # The cause, as the run's failure (and so the error row and the alert) tells it.
    message = failure.step_failure_data.error.message
    assert f"meta_kept_meta/{AUDIENCE}" in message
    assert "code=100 subcode=33" in message and "does not exist" in message
    assert "cdp destinations reset meta_kept_meta" in message
    with psycopg.connect(url) as conn:
        (_, history) = runs(conn, "meta_kept_meta")
    assert history["status"] == "failed"
    assert f"audience {deleted}" in history["reason"] and "code=100" in history["reason"]
    assert "cdp destinations reset meta_kept_meta" in history["reason"]

    reset = cdp_destinations(url, "reset", "meta_kept_meta", "--audience", AUDIENCE)
    assert reset.exit_code == 0, reset.output
    assert deleted in reset.output and "180 confirmed members" in reset.output
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT platform_audience_id, synced_signature FROM cdp.destination_audiences"
            " WHERE destination_id = 'meta_kept_meta'"
        ).fetchone() == (None, None)
    result = push(instance, url, sandbox, "meta_kept")
    assert result.success
    assert outcome(result)["added"] == 189
    assert audience_id(sandbox, "meta_kept") != deleted
    assert member_keys(sandbox, "meta_kept") == matchable("meta_kept", range(210))


def test_reset_and_history_refuse_what_does_not_exist(url, sandbox) -> None:
    setup(url, "meta_names", 150, range(150))
    for args in (
        ("reset", "nobody_here"),
        ("reset", "meta_names_meta", "--audience", "audience_nowhere"),
        ("history", "nobody_here"),
    ):
        result = cdp_destinations(url, *args)
        assert result.exit_code != 0, args
        assert "Traceback" not in result.output and result.exception.__class__ is SystemExit
        assert args[-1] in result.output
    empty = cdp_destinations(url, "reset", "meta_names_meta")  # never synced: nothing to forget
    assert empty.exit_code == 0 and "0 confirmed members" in empty.output


# A run worker of its own, pushing one tenant to the Meta sandbox on the test's instance (its
# runs are stored in the same database).
_RUN_WORKER = """
import sys
import dagster as dg
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.push_requests import changed_audiences
from cdp_assets.activation.meta.resources import MetaResource

instance_url, warehouse_url, graph_url, tenant_id = sys.argv[1:]
storage = {"storage": storage_config(sqlalchemy_url(instance_url))}
with dg.instance_for_test(overrides=storage) as instance:
    dg.materialize(
        [meta_custom_audiences],
        partition_key=tenant_id,
        instance=instance,
        resources={
            "warehouse": WarehouseResource(url=warehouse_url),
            "meta": MetaResource(graph_url=graph_url),
        },
    )
"""


def waiting_on_a_lock(conn: psycopg.Connection) -> bool:
    (waiting,) = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return waiting > 0


def test_the_rows_of_a_killed_run_are_closed_by_the_next_run(
    instance, warehouse_url, url, sandbox
) -> None:
    setup(url, "meta_killed", 300, range(200))
    instance.add_dynamic_partitions(tenants.name, ["meta_killed"])
    outside = Destination(
        "meta_killed_outside",
        "meta_killed",
        "meta",
        ACCOUNT,
        credential_refs={"access_token": TOKEN_REF},
        active=False,
    )
    # Autocommit: within a transaction, pg_stat_activity would stay as first read.
    with psycopg.connect(url) as lock, psycopg.connect(url, autocommit=True) as conn:
        # The worker's sync blocks on its first write of confirmed members, after Meta took
        # the batch: killed there, it leaves its history row open.
        lock.execute("LOCK TABLE cdp.destination_members IN SHARE MODE")
        worker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _RUN_WORKER,
                warehouse_url,
                url,
                sandbox.graph_url,
                "meta_killed",
            ]
        )
        try:
            deadline = time.monotonic() + 60
            while not waiting_on_a_lock(conn) and worker.poll() is None:
                assert time.monotonic() < deadline, "the run worker never reached its sync"
                time.sleep(0.05)
        finally:
            worker.kill()
            worker.wait()
        lock.rollback()
        (killed,) = runs(conn, "meta_killed_meta")
        # Syncs outside Dagster (no run id): open for two days, and just started.
        register_destination(conn, outside)
        conn.execute(
            "INSERT INTO cdp.activation_runs (destination_id, audience, tenant_id, platform,"
            " mode, dry_run, status, started_at) VALUES"
            " ('meta_killed_outside', %(a)s, 'meta_killed', 'meta', 'diff', false, 'running',"
            "  now() - interval '2 days'),"
            " ('meta_killed_outside', %(a)s, 'meta_killed', 'meta', 'diff', false, 'running',"
            "  now())",
            {"a": AUDIENCE},
        )
        opened = {r.destination_id: r for r in open_activation_runs(conn, ["meta_killed"])}
    assert killed["status"] == "running" and killed["dagster_run_id"]
    assert opened["meta_killed_meta"].dagster_run_id == killed["dagster_run_id"]
    assert timedelta(0) < opened["meta_killed_meta"].age < timedelta(minutes=5)

    # The killed worker's run is still in progress as far as Dagster knows: left alone.
    assert push(instance, url, sandbox, "meta_killed").success
    with psycopg.connect(url) as conn:
        assert runs(conn, "meta_killed_meta")[0]["status"] == "running"
    # Dagster's run monitoring finds the worker gone and fails the run: the next activation
    # run, of any tenant, closes the row.
    instance.report_run_failed(instance.get_run_by_id(killed["dagster_run_id"]))
    setup(url, "meta_after_kill", 150, range(150))
    assert push(instance, url, sandbox, "meta_after_kill").success
    with psycopg.connect(url) as conn:
        closed, synced = runs(conn, "meta_killed_meta")
        old, recent = runs(conn, "meta_killed_outside")
    assert closed["status"] == "abandoned" and closed["finished_at"] is not None
    assert killed["dagster_run_id"] in closed["reason"] and "FAILURE" in closed["reason"]
    assert synced["status"] == "synced"
    assert old["status"] == "abandoned" and "no Dagster run" in old["reason"]
    assert recent["status"] == "running"
    # An abandoned sync is a failure of its audience (one that hangs every time rests as one
    # that fails), unless a sync of the audience completed after it started.
    with psycopg.connect(url) as conn:
        failures = dict(
            conn.execute(
                "SELECT destination_id, failures_in_a_row FROM cdp.destination_audiences"
                " WHERE destination_id IN ('meta_killed_meta', 'meta_killed_outside')"
            ).fetchall()
        )
    assert failures == {"meta_killed_meta": 0, "meta_killed_outside": 1}

    history = cdp_destinations(url, "history", "meta_killed_meta")
    assert history.exit_code == 0, history.output
    assert "abandoned" in history.output and "age" in history.output.splitlines()[0]
    running = cdp_destinations(url, "history", "meta_killed_outside")
    assert "running for" in running.output and "2d" in running.output


def meta_with(sandbox: MetaSandbox, **settings) -> MetaResource:
    return MetaResource(graph_url=sandbox.graph_url, retry_base_seconds=0.01, **settings)


@pytest.mark.timeout(120)
def test_a_graph_call_that_never_answers_fails_within_its_deadline(instance, url, sandbox) -> None:
    """The usersreplace that never answers fails its sync once its deadline has passed on each
    attempt (long before the per-read timeout), and the history row says so (it no longer stays
    `running`)."""
    setup(url, "meta_silent", 150, range(150))
    assert push(instance, url, sandbox, "meta_silent").success
    sandbox.inject("never_answer", times=2, path_contains="/usersreplace")
    resources = {
        "warehouse": WarehouseResource(url=url),
        "meta": meta_with(sandbox, attempts=2, timeout_seconds=60, deadline_seconds=1.5),
    }
    started = time.monotonic()
    result = push_activation(
        meta_custom_audiences,
        instance,
        "meta_silent",
        resources,
        {"full_replace": True, "force": True},
    )
    assert time.monotonic() - started < 30
    assert not result.success
    with psycopg.connect(url) as conn:
        history = runs(conn, "meta_silent_meta")[-1]
    assert history["status"] == "failed"
    assert "no complete answer within 1.5 s" in history["reason"], history["reason"]


def test_with_the_app_secret_every_call_carries_its_proof(
    instance, url, sandbox, monkeypatch
) -> None:
    """An app with "Require App Secret" refuses calls without `appsecret_proof`: a destination
    given the secret's reference signs every call and goes through."""
    secret = "meta-app-secret-for-proofs"
    monkeypatch.setenv("META_TEST_APP_SECRET", secret)
    with MetaSandbox({TOKEN: [ACCOUNT]}, app_secret=secret) as strict:
        setup(url, "meta_unsigned", 150, range(150))
        refused = push(instance, url, strict, "meta_unsigned")
        assert not refused.success
        assert "require an appsecret_proof" in outcome(refused)["reason"]

        signed = setup(url, "meta_signed", 150, range(150))
        with psycopg.connect(url) as conn:
            register_destination(
                conn,
                Destination(
                    signed.destination_id,
                    "meta_signed",
                    "meta",
                    ACCOUNT,
                    credential_refs={
                        "access_token": TOKEN_REF,
                        "app_secret": "META_TEST_APP_SECRET",
                    },
                ),
            )
        strict.clear_requests()
        assert push(instance, url, strict, "meta_signed").success
        assert member_keys(strict, "meta_signed") == matchable("meta_signed", range(150))
        proof = hmac.new(secret.encode(), TOKEN.encode(), hashlib.sha256).hexdigest()
        proofs = {r.query.get("appsecret_proof") for r in strict.requests()}
        assert proofs == {proof}


def test_a_token_quoted_by_a_graph_error_is_masked_wherever_it_is_written(
    instance, url, sandbox, monkeypatch
) -> None:
    """Graph quotes a token it cannot parse. Masked in the history, the run's failure and its
    event log, even when its variable's name does not say it holds a secret."""
    setup(url, "meta_echo", 150, range(150))
    monkeypatch.setenv("META_ECHO_ACCESS", TOKEN)
    with psycopg.connect(url) as conn:
        register_destination(
            conn,
            Destination(
                "meta_echo_meta",
                "meta_echo",
                "meta",
                ACCOUNT,
                credential_refs={"access_token": "META_ECHO_ACCESS"},
            ),
        )
    sandbox.inject("token_echo", path_contains="/customaudiences")
    result = push(instance, url, sandbox, "meta_echo")
    assert not result.success
    with psycopg.connect(url) as conn:
        (history,) = runs(conn, "meta_echo_meta")
    assert "Malformed access token ***" in history["reason"]
    written = [history["reason"], *(e.user_message for e in instance.all_logs(result.run_id))]
    written += [str(e.step_failure_data.error) for e in result.all_events if e.is_step_failure]
    assert not [text for text in written if TOKEN in text]


def sent_users(sandbox: MetaSandbox, tenant_id: str) -> int:
    return len(user_requests(sandbox, tenant_id))


def test_a_diff_after_a_full_replace_waits_while_meta_processes_the_replace(
    instance, url, sandbox
) -> None:
    setup(url, "meta_locked", 300, range(150))
    assert push(instance, url, sandbox, "meta_locked").success
    sandbox.set_limits(GraphLimits(replace_lock_seconds=3600))  # hours, as in production
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_locked", range(100, 260))
    replaced = push(instance, url, sandbox, "meta_locked", full_replace=True, force=True)
    assert outcome(replaced)["status"] == "synced"
    sent = sent_users(sandbox, "meta_locked")
    with psycopg.connect(url) as conn:
        set_members(conn, "meta_locked", range(100, 290))
    waiting = push(instance, url, sandbox, "meta_locked")
    assert waiting.success
    row = outcome(waiting)
    assert row["status"] == "skipped" and "Replace in progress" in row["reason"], row
    assert sent_users(sandbox, "meta_locked") == sent  # nothing sent, nothing refused
    assert member_keys(sandbox, "meta_locked") == matchable("meta_locked", range(100, 260))


def test_a_2650_met_anyway_is_waited_out_not_a_failure(url, sandbox) -> None:
    meta = MetaAudiences(ACCOUNT, TOKEN, graph_url=sandbox.graph_url, retry_base_seconds=0.05)
    destination = setup(url, "meta_raced", 10, range(10))
    platform_id = meta.ensure_audience(DestinationAudience(destination, AUDIENCE, {}, None))
    row = ["meta_raced-1", "", "", "", "", ""]
    meta.replace(platform_id, [[row]])  # processed for 0.2 s by default
    meta.add(platform_id, [["meta_raced-2", "", "", "", "", ""]])
    answers = [
        r.status for r in sandbox.requests(f"/{platform_id}/users") if "replace" not in r.path
    ]
    assert answers[0] == 400 and answers[-1] == 200 and meta.retries == len(answers) - 1
    assert {m["EXTERN_ID"] for m in sandbox.members(platform_id)} == {
        "meta_raced-1",
        "meta_raced-2",
    }
    # A replace Meta is still processing hours later: the failure says so, code first.
    sandbox.set_limits(GraphLimits(replace_lock_seconds=3600))
    meta.replace(platform_id, [[row]])
    quick = MetaAudiences(
        ACCOUNT, TOKEN, graph_url=sandbox.graph_url, attempts=2, retry_base_seconds=0.01
    )
    with pytest.raises(MetaError, match=r"^code=2650 subcode=1870145 HTTP 400: Audience update"):
        quick.add(platform_id, [["meta_raced-3", "", "", "", "", ""]])
    assert "Replace in progress" in (quick.busy(platform_id) or "")


def test_an_audience_on_the_third_page_of_a_crowded_account_is_found_not_duplicated(
    instance, url, sandbox
) -> None:
    session = FacebookSession(access_token=TOKEN)
    session.GRAPH = sandbox.graph_url
    account = AdAccount(f"act_{CROWDED_ACCOUNT}", api=FacebookAdsApi(session))
    create = {"subtype": "CUSTOM", "customer_file_source": "USER_PROVIDED_ONLY"}
    for n in range(52):
        account.create_custom_audience(params={"name": f"other {n}", **create})
    ours = account.create_custom_audience(params={"name": f"meta_crowded: {AUDIENCE}", **create})
    for n in range(52, 59):
        account.create_custom_audience(params={"name": f"other {n}", **create})
    destination = Destination(
        "meta_crowded_meta",
        "meta_crowded",
        "meta",
        CROWDED_ACCOUNT,
        credential_refs={"access_token": TOKEN_REF},
    )
    with psycopg.connect(url) as conn:  # the audience's id is not known here: it was lost
        add_tenant_with_customers(conn, "meta_crowded", 200)
        set_members(conn, "meta_crowded", range(200))
        register_destination(conn, destination)
    assert push(instance, url, sandbox, "meta_crowded").success
    audiences = sandbox.audiences(CROWDED_ACCOUNT)
    assert len(audiences) == 60
    assert {row["EXTERN_ID"] for row in sandbox.members(ours["id"])} == matchable(
        "meta_crowded", range(200)
    )
    listings = [
        r for r in sandbox.requests(f"/act_{CROWDED_ACCOUNT}/customaudiences") if r.method == "GET"
    ]
    assert len(listings) == 3


def crowded_meta(sandbox: MetaSandbox, **settings) -> MetaAudiences:
    return MetaAudiences(ACCOUNT, TOKEN, graph_url=sandbox.graph_url, **settings)


def test_a_push_near_the_rate_limit_slows_down_instead_of_being_throttled(url, sandbox) -> None:
    destination = setup(url, "meta_paced", 10, range(10))
    meta = crowded_meta(sandbox, pace_seconds=1.0, retry_base_seconds=0.01)
    platform_id = meta.ensure_audience(DestinationAudience(destination, AUDIENCE, {}, None))
    sandbox.set_limits(GraphLimits(calls_per_window=10, window_seconds=1.0, throttle_seconds=600))
    for n in range(15):
        meta.add(platform_id, [[f"meta_paced-{n}", "", "", "", "", ""]])
    answers = [r.status for r in sandbox.requests(f"/{platform_id}/users")]
    assert answers == [200] * 15 and meta.retries == 0
    assert meta.paced_seconds > 0
    assert len(sandbox.members(platform_id)) == 15


def test_a_throttled_account_waits_as_long_as_meta_says_or_fails_at_once(url, sandbox) -> None:
    destination = setup(url, "meta_throttled", 10, range(10))
    meta = crowded_meta(sandbox, retry_base_seconds=0.01, deadlines=Deadlines(total_seconds=30))
    platform_id = meta.ensure_audience(DestinationAudience(destination, AUDIENCE, {}, None))
    sandbox.set_limits(GraphLimits(calls_per_window=5, throttle_seconds=300))
    sandbox.use(ACCOUNT, 5)
    with pytest.raises(MetaError, match=r"^code=80003 .*a wait of 300 s, past this call's"):
        meta.add(platform_id, [["meta_throttled-1", "", "", "", "", ""]])
    assert meta.retries == 0  # not six blind retries into a throttle that lasts minutes
    assert len(sandbox.requests(f"/{platform_id}/users")) == 1
