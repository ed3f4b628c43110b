"""Google Customer Match activation: the real asset and clients against the gRPC sandbox,
through the Data Manager API and through the Google Ads API."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest
from click.testing import CliRunner
from google.ads.googleads.v26.services.types.user_list_service import UserListOperation
from google.api_core import exceptions as gexc
from google.rpc import error_details_pb2
from support.activation import (
    GOOGLE_CUSTOMER,
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
from support.activation import push as push_activation

from cdp_assets.activation.cli import destinations
from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.google.data_manager import data_manager_clients, rejected_members
from cdp_assets.activation.google.google_ads import GoogleAdsAudiences, google_ads_services
from cdp_assets.activation.google.resources import GoogleResource
from cdp_assets.activation.identifiers import sha256_hex
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_devkit.sandbox.google.sandbox import GoogleSandbox


@pytest.fixture(scope="module")
def url():
    with activation_warehouse() as warehouse:
        yield warehouse


@pytest.fixture(scope="module")
def sandbox():
    os.environ[GOOGLE_TOKEN_REF] = "dev-token"
    with GoogleSandbox(job_seconds=0) as google:
        yield google


@pytest.fixture(autouse=True)
def no_faults(sandbox):
    sandbox.clear_faults()
    yield
    sandbox.clear_faults()


def held(sandbox: GoogleSandbox, name: str) -> set[str]:
    """The list's members once Google processed everything acknowledged so far."""
    sandbox.process_pending()
    return sandbox.members(name)


def test_data_manager_first_push_change_and_unchanged(instance, url, sandbox) -> None:
    add_google_destination(url, "g_dm", "google_data_manager", range(300))
    first = push_to_google(instance, url, sandbox, "g_dm")
    assert first.success
    row = outcome(first)
    assert (row["status"], row["added"], row["unmatchable"]) == ("synced", 270, 30)
    assert row["pending"] == 270  # acknowledged, not yet processed by Google
    name = google_user_list(url, "g_dm_google")
    assert held(sandbox, name) == google_member_keys(range(300))
    (ingest,) = sandbox.requests("IngestAudienceMembers")
    assert ingest.request["consent"] == {
        "ad_user_data": "CONSENT_GRANTED",
        "ad_personalization": "CONSENT_GRANTED",
    }
    member = ingest.request["audience_members"][0]["user_data"]["user_identifiers"]
    assert member[1]["phone_number"] == sha256_hex("+5511960000000")  # E.164 with '+'

    with psycopg.connect(url) as conn:
        set_members(conn, "g_dm", range(50, 320))
    second = outcome(push_to_google(instance, url, sandbox, "g_dm"))
    assert (second["removed"], second["added"]) == (45, 18)
    # The first request's verdict, read as the second push began.
    assert "upload_match_rate_range=MATCH_RATE_RANGE_71_TO_80" in second["match_info"]
    assert held(sandbox, name) == google_member_keys(range(50, 320))
    (removal,) = sandbox.requests("RemoveAudienceMembers")
    assert len(removal.request["audience_members"]) == 45

    third = outcome(push_to_google(instance, url, sandbox, "g_dm"))
    assert (third["added"], third["removed"], third["unchanged"]) == (0, 0, 243)
    assert third["pending"] == 0
    calls = len(sandbox.requests())
    fourth = outcome(push_to_google(instance, url, sandbox, "g_dm"))
    assert (fourth["added"], fourth["removed"], fourth["unchanged"]) == (0, 0, 243)
    assert sandbox.requests()[calls:] == []  # nothing pending, nothing to send: no call


def test_data_manager_refused_members_are_set_aside_and_sent_again(instance, url, sandbox) -> None:
    add_google_destination(url, "g_refused", "google_data_manager", range(150))
    refused = sha256_hex("cliente.33@exemplo.com.br")
    sandbox.refuse([refused])
    first = outcome(push_to_google(instance, url, sandbox, "g_refused"))
    assert (first["added"], first["rejected"]) == (134, 1)
    ingests = sandbox.requests("IngestAudienceMembers")[-2:]
    assert [c.code.name for c in ingests] == ["INVALID_ARGUMENT", "OK"]
    assert len(ingests[1].request["audience_members"]) == 134  # the rest, re-sent at once
    name = google_user_list(url, "g_refused_google")
    assert "email:" + refused not in held(sandbox, name)
    sandbox.clear_faults()
    second = outcome(push_to_google(instance, url, sandbox, "g_refused"))
    assert (second["added"], second["unchanged"]) == (1, 134)
    assert held(sandbox, name) == google_member_keys(range(150))


def test_data_manager_quota_errors_are_retried(instance, url, sandbox) -> None:
    add_google_destination(url, "g_quota", "google_data_manager", range(150))
    sandbox.inject("IngestAudienceMembers", "quota", times=2)
    result = push_to_google(instance, url, sandbox, "g_quota")
    assert result.success
    codes = [c.code.name for c in sandbox.requests("IngestAudienceMembers")[-3:]]
    assert codes == ["RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", "OK"]
    assert held(sandbox, google_user_list(url, "g_quota_google")) == google_member_keys(range(150))


def test_data_manager_daily_quota_fails_without_losing_state(instance, url, sandbox) -> None:
    add_google_destination(url, "g_daily", "google_data_manager", range(150))
    sandbox.inject("IngestAudienceMembers", "daily_quota")
    result = push_to_google(instance, url, sandbox, "g_daily")
    assert not result.success
    with psycopg.connect(url) as conn:
        (history,) = runs(conn, "g_daily_google")
        assert history["status"] == "failed" and "ResourceExhausted" in history["reason"]
        assert conn.execute(
            "SELECT count(*) FROM cdp.destination_members WHERE destination_id = 'g_daily_google'"
        ).fetchone() == (0,)
    assert push_to_google(instance, url, sandbox, "g_daily").success


def test_data_manager_full_replace_keeps_re_sent_members(instance, url) -> None:
    hours_ago = [2.0]  # the sandbox's clock: the first push happens two hours earlier
    with GoogleSandbox(clock=lambda: time.time() - 3600 * hours_ago[0]) as sandbox:
        add_google_destination(url, "g_replace", "google_data_manager", range(200))
        assert push_to_google(instance, url, sandbox, "g_replace").success
        sandbox.process_pending()
        hours_ago[0] = 0.0
        with psycopg.connect(url) as conn:
            set_members(conn, "g_replace", range(100, 300))
        result = push_to_google(instance, url, sandbox, "g_replace", full_replace=True, force=True)
        assert outcome(result)["status"] == "synced"
        (remove_all,) = sandbox.requests("RemoveAllAudienceMembers")
        assert remove_all.request["remove_as_of_time"]
        name = google_user_list(url, "g_replace_google")
        # Members re-sent by the replace survive the removal as of its start; the rest go.
        assert held(sandbox, name) == google_member_keys(range(100, 300))


def test_google_ads_jobs_with_partial_failure(instance, url, sandbox) -> None:
    add_google_destination(url, "g_ads", "google_ads", range(120), min_audience_size=10)
    sandbox.refuse([sha256_hex("cliente.5@exemplo.com.br")])
    first = push_to_google(instance, url, sandbox, "g_ads")
    assert first.success
    row = outcome(first)
    assert (row["added"], row["rejected"], row["pending"]) == (107, 1, 107)
    name = google_user_list(url, "g_ads_google")
    assert sandbox.members(name) == google_member_keys(range(120)) - google_member_keys([5])
    with psycopg.connect(url) as conn:
        (reject,) = conn.execute(
            "SELECT j.member_key, j.reason FROM cdp.activation_rejects j"
            " JOIN cdp.activation_runs r USING (activation_run_id)"
            " WHERE r.destination_id = 'g_ads_google'"
        ).fetchall()
    assert reject == ("g_ads-5", "The value is not acceptable.")
    sandbox.clear_faults()
    retried = outcome(push_to_google(instance, url, sandbox, "g_ads"))
    assert (retried["added"], retried["unchanged"]) == (1, 107)
    assert "match_rate_range=MATCH_RANGE_71_TO_80" in retried["match_info"]
    assert sandbox.members(name) == google_member_keys(range(120))
    job = sandbox.requests("CreateOfflineUserDataJob")[0].request
    assert job["job"]["customer_match_user_list_metadata"]["consent"] == {
        "ad_user_data": "GRANTED",
        "ad_personalization": "GRANTED",
    }
    ops = sandbox.requests("AddOfflineUserDataJobOperations")
    assert [len(c.request["operations"]) for c in ops] == [108, 1]
    assert all(c.request["enable_partial_failure"] is True for c in ops)
    assert all(c.metadata.get("developer-token") == "dev-token" for c in ops)

    with psycopg.connect(url) as conn:
        set_members(conn, "g_ads", range(20, 120))
    second = outcome(push_to_google(instance, url, sandbox, "g_ads"))
    assert second["removed"] == 18
    remove_job = sandbox.requests("CreateOfflineUserDataJob")[-1].request
    assert "consent" not in remove_job["job"]["customer_match_user_list_metadata"]
    assert sandbox.members(name) == google_member_keys(range(20, 120))


def test_google_ads_not_allowlisted_fails_clearly(instance, url, sandbox) -> None:
    add_google_destination(url, "g_denied", "google_ads", range(120), min_audience_size=10)
    sandbox.inject("CreateOfflineUserDataJob", "not_allowlisted")
    result = push_to_google(instance, url, sandbox, "g_denied")
    assert not result.success
    with psycopg.connect(url) as conn:
        (history,) = runs(conn, "g_denied_google")
    assert history["status"] == "failed"
    assert history["reason"].startswith(
        "GoogleAdsRefusal: not_allowlisted_error=CUSTOMER_NOT_ALLOWLISTED_FOR_THIS_FEATURE"
    )


# A process that loaded the code location, then built a destination's Google client: whether
# Google Ads' generated clients were imported.
_CLIENT_IMPORTS = """
import sys
import cdp_assets.definitions
from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.google.resources import GoogleResource
GoogleResource(sandbox_address="127.0.0.1:1").audiences_for(
    Destination("d1", "t1", sys.argv[1], "1234567890", credential_refs={"developer_token": "T"})
)
print(any(name.startswith("google.ads.googleads") for name in sys.modules))
"""


@pytest.mark.parametrize(
    ("platform", "imports_google_ads"), [("google_data_manager", False), ("google_ads", True)]
)
def test_a_push_imports_only_its_own_platforms_google_clients(platform, imports_google_ads):
    """Google Ads' generated clients take 0.8 s to import, on the critical path of every Data
    Manager push's run, which never uses them."""
    result = subprocess.run(
        [sys.executable, "-c", _CLIENT_IMPORTS, platform],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "T": "dev-token"},
    )
    assert result.stdout.strip() == str(imports_google_ads)


def remove_on_google(sandbox: GoogleSandbox, platform: str, name: str) -> None:
    """What removing the list in Google Ads does, through each API's own call for it."""
    if platform == "google_ads":
        services = google_ads_services("dev-token", None, sandbox.address)
        services.user_lists.mutate_user_lists(
            customer_id=GOOGLE_CUSTOMER, operations=[UserListOperation(remove=name)]
        )
    else:
        data_manager_clients(sandbox.address).user_lists.delete_user_list(name=name)


def test_a_lost_data_manager_list_id_finds_the_list_by_name(instance, url, sandbox) -> None:
    add_google_destination(
        url, "g_dm_lost", "google_data_manager", range(120), min_audience_size=10
    )
    assert push_to_google(instance, url, sandbox, "g_dm_lost").success
    name = google_user_list(url, "g_dm_lost_google")
    lists = len(sandbox.user_lists())
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE cdp.destination_audiences SET platform_audience_id = NULL"
            " WHERE destination_id = 'g_dm_lost_google'"
        )
    assert push_to_google(instance, url, sandbox, "g_dm_lost").success
    assert google_user_list(url, "g_dm_lost_google") == name
    assert len(sandbox.user_lists()) == lists


def test_a_google_ads_job_google_does_not_find_is_not_a_success(sandbox) -> None:
    destination = Destination("g_nojob_google", "g_nojob", "google_ads", GOOGLE_CUSTOMER)
    platform = GoogleAdsAudiences(
        destination, google_ads_services("dev-token", None, sandbox.address)
    )
    job = f"customers/{GOOGLE_CUSTOMER}/offlineUserDataJobs/1"
    verdict = platform.request_verdicts([job])[job]
    assert verdict.failed == f"Google Ads has no job {job}"


def test_a_data_manager_violation_outside_the_batch_names_no_member() -> None:
    violations = [
        error_details_pb2.BadRequest.FieldViolation(field=f"audience_members[{i}]", description=d)
        for i, d in ((1, "bad hash"), (7, "not sent"))
    ]
    error = gexc.InvalidArgument(
        "refused", details=[error_details_pb2.BadRequest(field_violations=violations)]
    )
    assert rejected_members(error, sent=2) == {1: "bad hash"}


# What each API answers for a list that no longer exists.
GONE = {
    "google_data_manager": "INVALID_USER_LIST_ID",
    "google_ads": "offline_user_data_job_error=INVALID_USER_LIST_ID",
}


@pytest.mark.parametrize("platform", ["google_data_manager", "google_ads"])
def test_a_list_removed_in_google_is_created_again_with_every_member(
    instance, url, sandbox, platform
) -> None:
    tenant_id = f"g_gone_{platform[7:]}"
    add_google_destination(url, tenant_id, platform, range(120), min_audience_size=10)
    assert push_to_google(instance, url, sandbox, tenant_id).success
    removed = google_user_list(url, f"{tenant_id}_google")
    remove_on_google(sandbox, platform, removed)
    with psycopg.connect(url) as conn:
        set_members(conn, tenant_id, range(130))

    result = push_to_google(instance, url, sandbox, tenant_id)
    assert result.success
    row = outcome(result)
    recreated = google_user_list(url, f"{tenant_id}_google")
    assert recreated != removed
    assert (row["status"], row["added"], row["unchanged"]) == ("synced", 117, 0)
    assert held(sandbox, recreated) == google_member_keys(range(130))
    assert removed in row["reason"] and GONE[platform] in row["reason"]
    assert f"created {recreated}" in row["reason"]
    with psycopg.connect(url) as conn:
        last = runs(conn, f"{tenant_id}_google")[-1]
    assert (last["status"], last["reason"]) == ("synced", row["reason"])


@pytest.mark.parametrize("platform", ["google_data_manager", "google_ads"])
def test_with_recreation_off_a_removed_list_fails_until_reset(
    instance, url, sandbox, platform
) -> None:
    tenant_id = f"g_kept_{platform[7:]}"
    destination_id = f"{tenant_id}_google"
    add_google_destination(
        url, tenant_id, platform, range(120), min_audience_size=10, recreate_deleted_audiences=False
    )
    assert push_to_google(instance, url, sandbox, tenant_id).success
    sandbox.process_pending()
    removed = google_user_list(url, destination_id)
    lists = len(sandbox.user_lists())
    remove_on_google(sandbox, platform, removed)
    with psycopg.connect(url) as conn:
        set_members(conn, tenant_id, range(130))

    failed = push_to_google(instance, url, sandbox, tenant_id)
    assert not failed.success
    assert len(sandbox.user_lists()) == lists - 1  # none created in its place
    (failure,) = [e for e in failed.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message
    assert removed in message and GONE[platform] in message
    assert f"cdp destinations reset {destination_id}" in message
    with psycopg.connect(url) as conn:
        history = runs(conn, destination_id)[-1]
    assert history["status"] == "failed" and GONE[platform] in history["reason"]

    reset = CliRunner().invoke(destinations, ["reset", destination_id], env={"DATABASE_URL": url})
    assert reset.exit_code == 0, reset.output
    assert removed in reset.output and "108 confirmed members" in reset.output
    result = push_to_google(instance, url, sandbox, tenant_id)
    assert result.success and outcome(result)["added"] == 117
    assert held(sandbox, google_user_list(url, destination_id)) == google_member_keys(range(130))


def test_a_google_ads_job_of_seconds_is_picked_up_by_a_later_run_without_a_second_job(
    instance, url
) -> None:
    """A job that takes its time (Google: 6 hours or more; here a few seconds): the push
    runs it and returns, the runs while it works leave the audience waiting, however often
    they read its status, and the first run after it ended confirms its members."""
    job_seconds = 6.0
    with GoogleSandbox(job_seconds=job_seconds) as slow:
        add_google_destination(url, "g_slow", "google_ads", range(120), min_audience_size=10)
        started = time.monotonic()
        first = outcome(push_to_google(instance, url, slow, "g_slow"))
        # The job ran between `started` and now: it ends between the two plus its time.
        returned = time.monotonic()
        assert (first["added"], first["pending"]) == (108, 108)
        name = google_user_list(url, "g_slow_google")
        assert slow.members(name) == set()  # returned with the job still running

        with psycopg.connect(url) as conn:
            set_members(conn, "g_slow", range(20, 120))
        while True:  # as many runs as fit in the job's time, each reading its status
            waiting = outcome(push_to_google(instance, url, slow, "g_slow"))
            assert waiting["status"] == "skipped" and "is still running" in waiting["reason"]
            if time.monotonic() > started + job_seconds - 2.5:
                break
        assert len(slow.requests("CreateOfflineUserDataJob")) == 1
        assert len(slow.requests("RunOfflineUserDataJob")) == 1

        time.sleep(max(0.0, returned + job_seconds - time.monotonic()) + 0.1)
        done = outcome(push_to_google(instance, url, slow, "g_slow"))
        assert (done["status"], done["removed"], done["pending"]) == ("synced", 18, 18)
        assert {c.code.name for c in slow.requests("RunOfflineUserDataJob")} == {"OK"}
        assert len(slow.requests("RunOfflineUserDataJob")) == 2
        with psycopg.connect(url) as conn:
            (confirmed,) = conn.execute(
                "SELECT count(*) FROM cdp.destination_members"
                " WHERE destination_id = 'g_slow_google' AND pending_request IS NULL"
            ).fetchone()
        assert confirmed == 90


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("platform", "method"),
    [("google_data_manager", "IngestAudienceMembers"), ("google_ads", "MutateUserLists")],
)
def test_a_google_call_that_never_answers_fails_within_its_deadline(
    instance, url, sandbox, platform, method
) -> None:
    tenant_id = f"g_silent_{platform.split('_')[-1]}"
    add_google_destination(url, tenant_id, platform, range(300))
    sandbox.inject(method, "never_answer", times=2)
    sandbox.clear_requests()
    resources = {
        "warehouse": WarehouseResource(url=url),
        "google": GoogleResource(
            sandbox_address=sandbox.address, attempts=2, retry_base_seconds=0.01, timeout_seconds=1
        ),
    }
    started = time.monotonic()
    result = push_activation(google_customer_match, instance, tenant_id, resources, {})
    assert time.monotonic() - started < 30
    assert not result.success
    assert "DeadlineExceeded" in outcome(result)["reason"]
    # The sandbox records a held call once its handler sees the client gone (it polls every
    # 50 ms), which on a busy machine can be after the client's retry has ended too.
    deadline = time.monotonic() + 10
    while len(sandbox.requests(method)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [call.code.name for call in sandbox.requests(method)] == ["DEADLINE_EXCEEDED"] * 2
