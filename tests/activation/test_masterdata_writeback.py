"""Segments, CLV tiers and churn bands written back to VTEX Master Data CL documents, against
the sandbox's Master Data API: only changed documents are written, within the account's
shared request budget, never to a document the store does not have, with the fields checked
on the CL entity, the mass-change guard, and the CLV quality gate."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import psycopg
import pytest
import requests
from click.testing import CliRunner
from openapi_schema_validator import OAS30Validator
from support import register, vtex_for
from support.activation import outcome, push, runs

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.vtex_masterdata.assets import vtex_masterdata_fields
from cdp_assets.cli import main as cli
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_devkit.sandbox import SandboxProcess, StoreSpec, credentials_for
from cdp_devkit.sandbox.audience_warehouse import CUSTOMERS, activation_warehouse

ACCOUNTS = ("mdfirst", "mdchange", "mdguard", "mdgate", "mdcheck", "mdspec", "mddeleted")
CUSTOMER_COUNT = 30
WITHOUT_DOCUMENT = 4  # the last customers have no CL document
FIELDS = {"cdpSegment": "Varchar 50", "cdpClvTier": "Varchar 10", "cdpChurnBand": "Varchar 10"}
UPDATED_AT = "cdpUpdatedAt"
SPEC = Path("/work/shared/reference/vtex-openapi/masterdata-v1-api.json")

ANALYTICS = """
CREATE SCHEMA IF NOT EXISTS intermediate;
CREATE TABLE intermediate.int_identity__customer_keys (
    tenant_id text, record_id text, customer_key text);
CREATE TABLE marts.rfm_segments (tenant_id text, customer_key text, segment text);
CREATE TABLE marts.churn_risk (tenant_id text, customer_key text, churn_band text);
"""


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    stores = [StoreSpec(a, seed=48, customers=40, orders=20, products=5) for a in ACCOUNTS]
    with SandboxProcess(stores) as running:
        yield running


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with activation_warehouse() as warehouse:
        with psycopg.connect(warehouse) as conn:
            conn.execute(ANALYTICS)
        yield warehouse


def add_fields(sandbox: SandboxProcess, account: str, names: list[str]) -> None:
    for name in names:
        kind = "Date and Time" if name == UPDATED_AT else FIELDS[name]
        answer = requests.post(
            f"{sandbox.base_url}/_sandbox/{account}/masterdata/fields",
            json={"name": name, "type": kind},
            timeout=10,
        )
        answer.raise_for_status()


def written(sandbox: SandboxProcess, account: str) -> dict:
    answer = requests.get(f"{sandbox.base_url}/_sandbox/{account}/masterdata/written", timeout=10)
    answer.raise_for_status()
    return answer.json()


def patches(sandbox: SandboxProcess, account: str) -> int:
    return sandbox.stats()["accounts"][account]["requests"].get("patch_document", 0)


def segment(i: int, changed: set[int]) -> str:
    return ("champions", "loyal_customers", "at_risk")[i % 3] + ("_moved" if i in changed else "")


def setup(
    url: str, sandbox: SandboxProcess, account: str, params: dict | None = None, **settings
) -> list[str]:
    """A tenant on the account with CUSTOMER_COUNT customers, all but the last few with a CL
    document of the store, its analytics, and a Master Data destination; the document ids."""
    documents = [d["key"] for d in sandbox.export(account, "customers", "id")]
    tenant_id = account
    with psycopg.connect(url) as conn:
        register(conn, tenant_id, account)
        conn.execute(CUSTOMERS, {"tenant": tenant_id, "first": 0, "last": CUSTOMER_COUNT - 1})
        conn.execute(
            "INSERT INTO intermediate.int_identity__customer_keys"
            " SELECT %s, 'cl:' || d, %s || '-' || i FROM unnest(%s::text[]) WITH ORDINALITY"
            " AS u (d, n), LATERAL (SELECT n - 1 AS i) AS k",
            (tenant_id, tenant_id, documents[: CUSTOMER_COUNT - WITHOUT_DOCUMENT]),
        )
        conn.execute(
            "INSERT INTO marts.churn_risk SELECT %s, %s || '-' || i,"
            " (ARRAY['low', 'medium', 'high', 'lost'])[i %% 4 + 1]"
            " FROM generate_series(0, %s - 1) i",
            (tenant_id, tenant_id, CUSTOMER_COUNT),
        )
        conn.execute(
            "INSERT INTO analytics_python.customer_predictions (tenant_id, customer_key, as_of,"
            " frequency_x, recency_t_x_days, age_t_days, mean_repeat_spend, p_alive,"
            " p_no_purchase_90d, expected_purchases_1y, expected_purchases_3y,"
            " expected_purchases_5y, clv_1y, clv_3y, clv_5y, model)"
            " SELECT %s, %s || '-' || i, current_date, 1, 10, 100, 50, 0.5, 0.5, 1, 2, 3,"
            " i + 1, i + 2, i + 3, 'bgnbd_gamma_gamma' FROM generate_series(0, %s - 1) i",
            (tenant_id, tenant_id, CUSTOMER_COUNT),
        )
        set_segments(conn, tenant_id, set())
        destination = Destination(
            f"{tenant_id}_md", tenant_id, "vtex_masterdata", min_audience_size=1, **settings
        )
        add_destination(conn, destination)
        add_audience(conn, destination.destination_id, "customers", params or {})
        conn.commit()
    return documents[: CUSTOMER_COUNT - WITHOUT_DOCUMENT]


def set_segments(conn: psycopg.Connection, tenant_id: str, changed: set[int]) -> None:
    conn.execute("DELETE FROM marts.rfm_segments WHERE tenant_id = %s", (tenant_id,))
    conn.execute(
        "INSERT INTO marts.rfm_segments SELECT %s, %s || '-' || i, s"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS u (s, n), LATERAL (SELECT n - 1 AS i) k",
        (tenant_id, tenant_id, [segment(i, changed) for i in range(CUSTOMER_COUNT)]),
    )
    conn.commit()


def write(instance, url: str, sandbox: SandboxProcess, tenant_id: str, **config):
    resources = {"warehouse": WarehouseResource(url=url), "vtex": vtex_for(sandbox)}
    return push(vtex_masterdata_fields, instance, tenant_id, resources, config)


def clv_tier(i: int) -> str:
    """Customer i's predicted 1-year CLV is i + 1: the top 20 % are high, the next 30 %
    medium."""
    top_share = (CUSTOMER_COUNT - i) / CUSTOMER_COUNT
    return "high" if top_share <= 0.2 else "medium" if top_share <= 0.5 else "low"


def test_first_write_then_unchanged_rerun_sends_nothing(instance, url, sandbox) -> None:
    add_fields(sandbox, "mdfirst", [*FIELDS, UPDATED_AT])
    documents = setup(url, sandbox, "mdfirst")

    first = write(instance, url, sandbox, "mdfirst")

    row = outcome(first)
    assert (row["status"], row["added"], row["removed"]) == ("synced", len(documents), 0)
    assert patches(sandbox, "mdfirst") == len(documents)
    state = written(sandbox, "mdfirst")
    assert state["created"] == []  # customers without a CL document got none
    assert set(state["values"]) == set(documents)
    for i, document_id in enumerate(documents):
        values = state["values"][document_id]
        assert set(values) == {*FIELDS, UPDATED_AT}  # nothing else leaves: no e-mail, no name
        assert values["cdpSegment"] == segment(i, set())
        assert values["cdpChurnBand"] == ("low", "medium", "high", "lost")[i % 4]
        assert values["cdpClvTier"] == clv_tier(i)
    # Every write was taken from the account's budget shared with ingestion.
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        budget = conn.execute(
            "SELECT count(*) FROM cdp.vtex_request_budget WHERE account = 'mdfirst'"
        ).fetchone()
    assert budget == (1,)

    again = write(instance, url, sandbox, "mdfirst")

    row = outcome(again)
    assert (row["status"], row["added"], row["unchanged"], row["requests"]) == (
        "synced",
        0,
        len(documents),
        0,
    )
    assert patches(sandbox, "mdfirst") == len(documents)


def test_a_change_of_segment_writes_only_those_customers(instance, url, sandbox) -> None:
    add_fields(sandbox, "mdchange", [*FIELDS, UPDATED_AT])
    documents = setup(url, sandbox, "mdchange")
    write(instance, url, sandbox, "mdchange")
    before = written(sandbox, "mdchange")["values"]
    sent = patches(sandbox, "mdchange")
    moved = {1, 5, 8}
    with psycopg.connect(url) as conn:
        set_segments(conn, "mdchange", moved)

    result = write(instance, url, sandbox, "mdchange")

    row = outcome(result)
    assert (row["status"], row["added"], row["removed"]) == ("synced", len(moved), 0)
    assert patches(sandbox, "mdchange") - sent == len(moved)  # one PATCH each, no clearing
    after = written(sandbox, "mdchange")["values"]
    changed = {d for d in documents if after[d] != before[d]}
    assert changed == {documents[i] for i in moved}
    assert all(after[documents[i]]["cdpSegment"].endswith("_moved") for i in moved)


def api_session(account: str) -> requests.Session:
    key, token = credentials_for(account)
    session = requests.Session()
    session.headers.update({"X-VTEX-API-AppKey": key, "X-VTEX-API-AppToken": token})
    return session


def test_a_document_deleted_in_the_store_is_rejected_not_created(instance, url, sandbox) -> None:
    add_fields(sandbox, "mddeleted", [*FIELDS, UPDATED_AT])
    documents = setup(url, sandbox, "mddeleted")
    gone = documents[3:5]
    session = api_session("mddeleted")
    base = sandbox.account_url("mddeleted") + "/api/dataentities/CL/documents"
    for document_id in gone:  # deleted in VTEX after ingestion read them
        assert session.delete(f"{base}/{document_id}", timeout=10).status_code == 204
        assert session.get(f"{base}/{document_id}", timeout=10).status_code == 404

    result = write(instance, url, sandbox, "mddeleted")

    row = outcome(result)
    kept = [d for d in documents if d not in gone]
    assert (row["status"], row["added"], row["rejected"]) == ("synced", len(kept), len(gone))
    state = written(sandbox, "mddeleted")
    assert state["created"] == []  # no document made anew
    assert set(state["values"]) == set(kept)
    assert patches(sandbox, "mddeleted") == len(kept)
    with psycopg.connect(url) as conn:
        rejects = conn.execute(
            "SELECT r.member_key, r.reason FROM cdp.activation_rejects r"
            " JOIN cdp.activation_runs a USING (activation_run_id)"
            " WHERE a.destination_id = 'mddeleted_md'"
        ).fetchall()
    assert {key for key, _ in rejects} == set(gone)
    assert all("no longer exists in the store" in reason for _, reason in rejects)


def test_the_guard_refuses_a_mass_change_until_forced(instance, url, sandbox) -> None:
    add_fields(sandbox, "mdguard", [*FIELDS, UPDATED_AT])
    documents = setup(url, sandbox, "mdguard", max_removal_share=0.5)
    write(instance, url, sandbox, "mdguard")
    sent = patches(sandbox, "mdguard")
    with psycopg.connect(url) as conn:
        set_segments(conn, "mdguard", set(range(20)))  # most documents change

    refused = write(instance, url, sandbox, "mdguard")

    assert outcome(refused)["status"] == "refused"
    assert "re-run with force" in outcome(refused)["reason"]
    assert patches(sandbox, "mdguard") == sent

    forced = write(instance, url, sandbox, "mdguard", force=True)

    assert outcome(forced)["status"] == "synced"
    assert patches(sandbox, "mdguard") - sent == len([i for i in range(20) if i < len(documents)])


def score(conn: psycopg.Connection, tenant_id: str, days_ago: int, beats: bool) -> None:
    # The gate reads the verdict; the figures behind it are the scorecard's own business.
    conn.execute(
        "INSERT INTO analytics_python.clv_scorecard (tenant_id, calibration_date, beats_baseline,"
        " computed_at, holdout_days, customers, model, actual_purchases, baseline_purchases,"
        " baseline_purchases_mae, actual_spend, baseline_spend, baseline_spend_mae)"
        " VALUES (%s, %s, %s, now(), 90, 40, 'bgnbd', 0, 0, 0, 0, 0, 0)",
        (tenant_id, date.today() - timedelta(days=days_ago), beats),
    )
    conn.commit()


def test_the_gate_skips_a_tenant_whose_clv_scorecard_fails(instance, url, sandbox) -> None:
    add_fields(sandbox, "mdgate", [*FIELDS, UPDATED_AT])
    documents = setup(url, sandbox, "mdgate", params={"requires_clv_quality": True})

    unscored = write(instance, url, sandbox, "mdgate")

    assert outcome(unscored)["status"] == "skipped"
    assert "no CLV holdout scorecard" in outcome(unscored)["reason"]
    with psycopg.connect(url) as conn:
        score(conn, "mdgate", 14, True)
        score(conn, "mdgate", 7, False)  # the latest calibration is the one that counts

    failing = write(instance, url, sandbox, "mdgate")

    assert outcome(failing)["status"] == "skipped"
    assert "does not beat the naive baseline" in outcome(failing)["reason"]
    assert patches(sandbox, "mdgate") == 0
    with psycopg.connect(url) as conn:
        history = runs(conn, "mdgate_md")
        assert [r["status"] for r in history] == ["skipped", "skipped"]
        assert "baseline" in history[-1]["reason"]
        score(conn, "mdgate", 0, True)

    passing = write(instance, url, sandbox, "mdgate")

    assert outcome(passing)["status"] == "synced"
    assert patches(sandbox, "mdgate") == len(documents)


def test_check_reports_a_missing_field_and_how_to_create_it(
    instance, url, sandbox, monkeypatch
) -> None:
    add_fields(sandbox, "mdcheck", ["cdpSegment", "cdpClvTier", UPDATED_AT])
    setup(url, sandbox, "mdcheck")
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("VTEX_BASE_URL_TEMPLATE", sandbox.base_url + "/{account}")

    missing = CliRunner().invoke(cli, ["destinations", "check", "mdcheck_md"])

    assert missing.exit_code != 0
    assert "no field cdpChurnBand:" in missing.output
    assert "Data Structure > CL" in missing.output
    assert "cdpSegment," not in missing.output.split("no field")[1]
    monkeypatch.undo()
    # A run does not write a document with a field the entity lacks.
    refused = write(instance, url, sandbox, "mdcheck")
    assert outcome(refused)["status"] == "failed"
    assert "cdpChurnBand" in outcome(refused)["reason"]
    assert patches(sandbox, "mdcheck") == 0

    add_fields(sandbox, "mdcheck", ["cdpChurnBand"])
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("VTEX_BASE_URL_TEMPLATE", sandbox.base_url + "/{account}")
    complete = CliRunner().invoke(cli, ["destinations", "check", "mdcheck_md"])

    assert complete.exit_code == 0, complete.output
    assert "has every field" in complete.output


def test_the_sandbox_validates_partial_updates_as_master_data_does(sandbox) -> None:
    add_fields(sandbox, "mdspec", ["cdpSegment"])
    (document_id, *_) = [d["key"] for d in sandbox.export("mdspec", "customers", "id")]
    session = api_session("mdspec")
    base = sandbox.account_url("mdspec") + "/api/dataentities/CL"

    def patch(body: object) -> requests.Response:
        return session.patch(f"{base}/documents/{document_id}", data=json.dumps(body), timeout=10)

    spec = json.loads(SPEC.read_text())
    structure = session.get(base, timeout=10).json()
    OAS30Validator(
        {**spec["components"]["schemas"]["Getdataentityfields"], "components": spec["components"]}
    ).validate(structure)
    assert "cdpSegment" in {field["name"] for field in structure["fields"]}
    assert patch({"cdpSegment": "champions"}).status_code == 204
    assert patch({"cdpUnknown": "x"}).status_code == 400
    assert patch(["cdpSegment"]).status_code == 400
    assert patch({"cdpSegment": "x" * 51}).status_code == 400
    assert patch({"cdpSegment": 3}).status_code == 400
    assert patch({"createdIn": "2024-01-01T00:00:00Z"}).status_code == 400
    document = session.get(f"{base}/documents/{document_id}?_fields=cdpSegment", timeout=10)
    assert document.json() == {"cdpSegment": "champions"}
