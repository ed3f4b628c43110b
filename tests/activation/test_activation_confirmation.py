"""What a sync records is what the platform confirmed: members of a request Google only
acknowledged are pending until its verdict, records that fail after the acknowledgement are
rejected and sent again, a full replace records the members it refused, and a Google Ads push
is one job that no second job races. Through the real asset and Google's clients against the
gRPC sandbox."""

from __future__ import annotations

import os

import psycopg
import pytest
from click.testing import CliRunner
from support.activation import (
    GOOGLE_TOKEN_REF,
    activation_warehouse,
    add_google_destination,
    google_member_keys,
    google_user_list,
    outcome,
    push_to_google,
    runs,
    set_members,
)

from cdp_assets.activation.cli import destinations
from cdp_assets.activation.identifiers import sha256_hex
from cdp_devkit.sandbox.google.sandbox import GoogleSandbox


@pytest.fixture(scope="module")
def url():
    with activation_warehouse() as warehouse:
        yield warehouse


@pytest.fixture(scope="module")
def sandbox():
    """Google as it behaves: a request is processed, and a job runs, an hour after its
    acknowledgement, until a test lets the time pass."""
    os.environ[GOOGLE_TOKEN_REF] = "dev-token"
    with GoogleSandbox(processing_seconds=3600, job_seconds=3600) as google:
        yield google


@pytest.fixture(autouse=True)
def no_faults(sandbox):
    sandbox.clear_faults()
    yield
    sandbox.clear_faults()


def state(url: str, destination_id: str) -> dict:
    """Members held (confirmed, pending), requests by status, and the stored signature."""
    with psycopg.connect(url) as conn:
        confirmed, pending = conn.execute(
            "SELECT count(*) FILTER (WHERE pending_request IS NULL),"
            " count(*) FILTER (WHERE pending_request IS NOT NULL)"
            " FROM cdp.destination_members WHERE destination_id = %s",
            (destination_id,),
        ).fetchone()
        requests = dict(
            conn.execute(
                "SELECT status, count(DISTINCT platform_request_id)"
                " FROM cdp.destination_requests WHERE destination_id = %s GROUP BY status",
                (destination_id,),
            ).fetchall()
        )
        (signature,) = conn.execute(
            "SELECT synced_signature FROM cdp.destination_audiences WHERE destination_id = %s",
            (destination_id,),
        ).fetchone()
    return {
        "confirmed": confirmed,
        "pending": pending,
        "requests": requests,
        "signature": signature,
    }


def rejects(url: str, destination_id: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT j.member_key, j.operation, j.reason FROM cdp.activation_rejects j"
            " JOIN cdp.activation_runs r USING (activation_run_id)"
            " WHERE r.destination_id = %s ORDER BY j.member_key",
            (destination_id,),
        ).fetchall()


def runs_of(url, destination_id):
    with psycopg.connect(url) as conn:
        return [
            (r["status"], r["added"], r["pending"], r["reason"]) for r in runs(conn, destination_id)
        ]


def test_data_manager_members_are_pending_until_google_confirms_them(
    instance, url, sandbox
) -> None:
    add_google_destination(url, "c_dm", "google_data_manager", range(150), min_audience_size=10)
    first = outcome(push_to_google(instance, url, sandbox, "c_dm"))
    assert (first["status"], first["added"], first["pending"]) == ("synced", 135, 135)
    assert state(url, "c_dm_google") == {
        "confirmed": 0,
        "pending": 135,
        "requests": {"pending": 1},
        "signature": None,
    }
    history = CliRunner().invoke(
        destinations, ["history", "c_dm_google"], env={"DATABASE_URL": url}
    )
    assert history.exit_code == 0, history.output
    assert "1 requests awaiting the platform's verdict" in history.output
    assert "135 members  sandbox-" in history.output

    # Still processing: asked, not confirmed, and nothing sent twice.
    ingests = len(sandbox.requests("IngestAudienceMembers"))
    second = outcome(push_to_google(instance, url, sandbox, "c_dm"))
    assert (second["added"], second["pending"]) == (0, 135)
    assert sandbox.requests("RetrieveRequestStatus")[-1].request["request_id"]
    assert len(sandbox.requests("IngestAudienceMembers")) == ingests
    assert state(url, "c_dm_google")["confirmed"] == 0

    sandbox.process_pending()
    third = outcome(push_to_google(instance, url, sandbox, "c_dm"))
    assert (third["added"], third["pending"], third["rejected"]) == (0, 0, 0)
    settled = state(url, "c_dm_google")
    assert settled["confirmed"] == 135 and settled["pending"] == 0
    assert settled["requests"] == {"confirmed": 1} and settled["signature"] is not None
    assert sandbox.members(google_user_list(url, "c_dm_google")) == google_member_keys(range(150))


def test_records_failing_after_the_acknowledgement_are_rejected_and_sent_again(
    instance, url, sandbox
) -> None:
    add_google_destination(url, "c_late", "google_data_manager", range(150), min_audience_size=10)
    failing = sha256_hex("cliente.33@exemplo.com.br")
    sandbox.fail_in_processing([failing])
    assert outcome(push_to_google(instance, url, sandbox, "c_late"))["pending"] == 135
    sandbox.process_pending()
    name = google_user_list(url, "c_late_google")
    assert "email:" + failing not in sandbox.members(name)

    ingests = len(sandbox.requests("IngestAudienceMembers"))
    second = outcome(push_to_google(instance, url, sandbox, "c_late"))
    # Google counts the failed record without naming it: the whole request is sent again.
    assert (second["rejected"], second["added"], second["pending"]) == (135, 135, 135)
    found = rejects(url, "c_late_google")
    assert len(found) == 135 and {operation for _, operation, _ in found} == {"add"}
    assert found[0][2] == "PARTIAL_SUCCESS (1 PROCESSING_ERROR_REASON_INVALID_FORMAT)"
    (again,) = sandbox.requests("IngestAudienceMembers")[ingests:]
    assert len(again.request["audience_members"]) == 135
    assert state(url, "c_late_google")["signature"] is None

    sandbox.clear_faults()
    sandbox.process_pending()
    third = outcome(push_to_google(instance, url, sandbox, "c_late"))
    assert (third["rejected"], third["pending"]) == (0, 0)
    assert state(url, "c_late_google")["confirmed"] == 135
    assert sandbox.members(name) == google_member_keys(range(150))


@pytest.mark.parametrize("platform", ["google_data_manager", "google_ads"])
def test_a_full_replace_records_refused_members_as_rejected(
    instance, url, sandbox, platform
) -> None:
    tenant_id = f"c_replace_{platform[7:]}"
    destination_id = f"{tenant_id}_google"
    add_google_destination(url, tenant_id, platform, range(120), min_audience_size=10)
    refused = sha256_hex("cliente.5@exemplo.com.br")
    sandbox.refuse([refused])
    result = outcome(
        push_to_google(instance, url, sandbox, tenant_id, full_replace=True, force=True)
    )
    assert (result["status"], result["added"], result["rejected"]) == ("synced", 107, 1)
    assert [(key, operation) for key, operation, _ in rejects(url, destination_id)] == [
        (f"{tenant_id}-5", "add")
    ]
    with psycopg.connect(url) as conn:
        held = {
            key
            for (key,) in conn.execute(
                "SELECT member_key FROM cdp.destination_members WHERE destination_id = %s",
                (destination_id,),
            )
        }
    assert len(held) == 107 and f"{tenant_id}-5" not in held
    assert state(url, destination_id)["signature"] is None

    sandbox.clear_faults()
    added = result["added"]
    for _ in range(8):  # until Google processed everything
        sandbox.process_pending()
        again = outcome(push_to_google(instance, url, sandbox, tenant_id))
        added += again["added"]
        if again["pending"] == 0:
            break
    assert added == 108 and state(url, destination_id)["confirmed"] == 108, (
        rejects(url, destination_id),
        runs_of(url, destination_id),
    )
    assert sandbox.members(google_user_list(url, destination_id)) == google_member_keys(range(120))


@pytest.mark.timeout(300)
def test_a_google_ads_push_is_one_job_and_no_second_job_runs_beside_it(
    instance, url, sandbox
) -> None:
    add_google_destination(
        url, "c_big", "google_ads", range(35_000), customers=35_000, min_audience_size=10
    )
    sandbox.clear_requests()
    first = outcome(push_to_google(instance, url, sandbox, "c_big"))
    assert (first["added"], first["pending"]) == (31_500, 31_500)
    assert len(sandbox.requests("CreateOfflineUserDataJob")) == 1
    adds = sandbox.requests("AddOfflineUserDataJobOperations")
    assert [len(c.request["operations"]) for c in adds] == [10_000, 10_000, 10_000, 1_500]
    assert len({c.request["resource_name"] for c in adds}) == 1
    assert len(sandbox.requests("RunOfflineUserDataJob")) == 1

    # While the job runs, a change waits: no second job, no CONCURRENT_MODIFICATION.
    with psycopg.connect(url) as conn:
        set_members(conn, "c_big", range(34_900))
    waiting = push_to_google(instance, url, sandbox, "c_big")
    assert waiting.success
    row = outcome(waiting)
    assert row["status"] == "skipped" and "is still running" in row["reason"]
    assert len(sandbox.requests("CreateOfflineUserDataJob")) == 1
    assert len(sandbox.requests("RunOfflineUserDataJob")) == 1

    for _ in range(3):  # until the job is done
        sandbox.process_pending()
        done = outcome(push_to_google(instance, url, sandbox, "c_big"))
        if done["status"] == "synced":
            break
    assert (done["status"], done["removed"]) == ("synced", 90)
    assert state(url, "c_big_google")["confirmed"] == 31_410
    assert len(sandbox.requests("CreateOfflineUserDataJob")) == 2
    assert {c.code.name for c in sandbox.requests("RunOfflineUserDataJob")} == {"OK"}


def test_a_lost_google_ads_list_id_finds_the_list_by_name(instance, url, sandbox) -> None:
    add_google_destination(url, "c_lost", "google_ads", range(120), min_audience_size=10)
    assert push_to_google(instance, url, sandbox, "c_lost").success
    name = google_user_list(url, "c_lost_google")
    lists = len(sandbox.user_lists())
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE cdp.destination_audiences SET platform_audience_id = NULL"
            " WHERE destination_id = 'c_lost_google'"
        )
    for _ in range(4):  # until the first job is done
        sandbox.process_pending()
        result = push_to_google(instance, url, sandbox, "c_lost")
        assert result.success, outcome(result)["reason"]
        if outcome(result)["status"] == "synced":
            break
    assert google_user_list(url, "c_lost_google") == name
    assert len(sandbox.user_lists()) == lists
    assert all(c.code.name == "OK" for c in sandbox.requests("MutateUserLists"))


def test_the_google_ads_daily_quota_fails_at_once_with_its_code(instance, url, sandbox) -> None:
    add_google_destination(url, "c_daily", "google_ads", range(120), min_audience_size=10)
    sandbox.inject("CreateOfflineUserDataJob", "daily_quota", times=3)
    calls = len(sandbox.requests("CreateOfflineUserDataJob"))
    result = push_to_google(instance, url, sandbox, "c_daily")
    assert not result.success
    assert len(sandbox.requests("CreateOfflineUserDataJob")) == calls + 1
    with psycopg.connect(url) as conn:
        (history,) = runs(conn, "c_daily_google")
    assert history["reason"].startswith("GoogleAdsRefusal: quota_error=RESOURCE_EXHAUSTED")
