"""Privacy requests under faults: an erase whose process is killed while Meta holds its removal
unanswered is resumed and completes, each step done once; a suppressed person stays out of
the destination through later pushes.

The warehouse is the synthetic audience warehouse, with the person's raw documents landed
through the ingestion's own path and the identity table identity resolution would have
built for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import orjson
import psycopg
import pytest
from click.testing import CliRunner
from run_worker import push_audience
from support.activation import (
    activation_warehouse,
    add_tenant_with_customers,
    register_destination,
    set_members,
)

from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.identifiers import normalize_email, sha256_hex
from cdp_assets.cli import main
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.privacy.audit import get_request
from cdp_assets.privacy.erase import STEPS
from cdp_assets.vtex.records import customer_row, order_row
from cdp_assets.vtex.sync import CUSTOMERS, ORDERS
from cdp_devkit.sandbox import MetaSandbox

TENANT = "privacy_crash"
META_ACCOUNT = "6161"
TOKEN_REF, TOKEN = "META_PRIVACY_CRASH_TOKEN", "meta-privacy-crash-token"
CUSTOMERS_IN_STORE = 40
ERASED_NUMBER, SUPPRESSED_NUMBER = 5, 7
# The identity table as identity resolution builds it, for the customers of the synthetic marts.
IDENTITY_TABLE = """
CREATE SCHEMA IF NOT EXISTS intermediate;
CREATE TABLE IF NOT EXISTS intermediate.int_identity__customer_keys (
    tenant_id text, record_id text, customer_key text, user_profile_id text,
    email_normalized text, document_type text, document_normalized text, phone_e164 text)
"""
IDENTITY_ROWS = """
INSERT INTO intermediate.int_identity__customer_keys
SELECT tenant_id, 'cl:' || customer_key, customer_key, NULL, lower(btrim(email)), NULL, NULL,
       NULL
FROM marts.customers WHERE tenant_id = %s
"""


def _email(number: int) -> str:
    return f" Cliente.{number}@Exemplo.COM.br "


def _land_person(conn: psycopg.Connection) -> str:
    """The erased customer's Master Data document and an order of theirs; the order's id."""
    moment = (datetime.now(UTC) - timedelta(days=3)).isoformat().replace("+00:00", "Z")
    email = normalize_email(_email(ERASED_NUMBER))
    order = {
        "orderId": "1400000000005-01",
        "status": "invoiced",
        "value": 12345,
        "creationDate": moment,
        "lastChange": moment,
        "items": [
            {"id": "1", "productId": "1", "quantity": 1, "price": 12345, "sellingPrice": 12345}
        ],
        "clientProfileData": {"email": email, "firstName": "José", "phone": "+5511960050005"},
        "shippingData": {
            "address": {"street": "Rua Augusta", "number": "1500", "city": "São Paulo"}
        },
    }
    document = {
        "id": f"cl-{TENANT}-{ERASED_NUMBER}",
        "email": email,
        "firstName": "José",
        "createdIn": moment,
        "updatedIn": moment,
    }
    upsert_documents(conn, ORDERS, TENANT, [order_row(order, orjson.dumps(order))])
    upsert_documents(conn, CUSTOMERS, TENANT, [customer_row(document)])
    conn.commit()
    return order["orderId"]


def _meta_holds(meta: MetaSandbox, number: int) -> bool:
    key = f"{TENANT}-{number}"
    email_hash = sha256_hex(normalize_email(_email(number)))
    return any(
        row.get("EXTERN_ID") == key or row.get("EMAIL") == email_hash
        for audience in meta.audiences(META_ACCOUNT)
        for row in meta.members(audience["id"])
    )


@pytest.fixture(scope="module")
def store() -> tuple[str, MetaSandbox]:
    os.environ[TOKEN_REF] = TOKEN
    with activation_warehouse() as url, MetaSandbox({TOKEN: [META_ACCOUNT]}) as meta:
        with psycopg.connect(url) as conn:
            add_tenant_with_customers(conn, TENANT, CUSTOMERS_IN_STORE)
            conn.execute(IDENTITY_TABLE)
            conn.execute(IDENTITY_ROWS, (TENANT,))
            conn.commit()
            set_members(conn, TENANT, range(CUSTOMERS_IN_STORE))
            register_destination(
                conn,
                Destination(
                    f"{TENANT}_meta",
                    TENANT,
                    "meta",
                    META_ACCOUNT,
                    credential_refs={"access_token": TOKEN_REF},
                    min_audience_size=1,
                ),
            )
        yield url, meta


def _erase_process(url: str, graph_url: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-c",
        "from cdp_assets.cli import main; main()",
        "privacy",
        "erase",
        "--tenant",
        TENANT,
        "--email",
        _email(ERASED_NUMBER),
    ]
    env = {**os.environ, "DATABASE_URL": url, "META_GRAPH_URL": graph_url}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.05)


def test_an_erase_killed_while_meta_holds_its_removal_is_resumed_and_completes(
    store: tuple[str, MetaSandbox], instance: dg.DagsterInstance, reliability_report
) -> None:
    url, meta = store
    with psycopg.connect(url) as conn:
        order_id = _land_person(conn)
    assert push_audience(instance, url, meta.graph_url, TENANT).success
    assert _meta_holds(meta, ERASED_NUMBER)
    removals_before = len(meta.requests("/users"))
    meta.inject("never_answer", path_contains="/users")

    erase = _erase_process(url, meta.graph_url)
    with psycopg.connect(url, autocommit=True) as poll:

        def removal_held() -> bool:
            row = poll.execute(
                "SELECT completed_at IS NULL FROM cdp.privacy_request_steps"
                " WHERE step = 'destinations'"
            ).fetchone()
            return bool(row and row[0]) and len(meta.requests("/users")) > removals_before

        _wait_for(removal_held, "the erase to wait on Meta's answer")
        erase.send_signal(signal.SIGKILL)
        erase.wait(timeout=30)
    meta.clear_faults()

    with psycopg.connect(url) as conn:
        (request_id,) = conn.execute("SELECT max(request_id) FROM cdp.privacy_requests").fetchone()
        cut_short = get_request(conn, request_id)
        assert cut_short is not None and cut_short.status == "running"
        done_at_kill = [s.step for s in cut_short.steps if s.completed_at is not None]
        assert done_at_kill == list(STEPS[:-1])
        conn.commit()

        with temporary_environment({"DATABASE_URL": url, "META_GRAPH_URL": meta.graph_url}):
            resumed = CliRunner().invoke(main, ["privacy", "resume"])
        assert resumed.exit_code == 0, resumed.output

        request = get_request(conn, request_id)
        assert request is not None and request.status == "completed"
        assert [s.step for s in request.steps] == list(STEPS)
        # Steps done before the kill were not done again: their completion times stand.
        for before, after in zip(cut_short.steps, request.steps, strict=False):
            if before.completed_at is not None:
                assert after.completed_at == before.completed_at
        places = {
            "meta": _meta_holds(meta, ERASED_NUMBER),
            "sync state": conn.execute(
                "SELECT count(*) FROM cdp.destination_members WHERE member_key = %s",
                (f"{TENANT}-{ERASED_NUMBER}",),
            ).fetchone()[0]
            > 0,
            "order": conn.execute(
                "SELECT payload::text ILIKE %s OR payload::text ILIKE '%%Rua Augusta%%'"
                " FROM raw_vtex.orders WHERE tenant_id = %s AND order_id = %s",
                (f"%{normalize_email(_email(ERASED_NUMBER))}%", TENANT, order_id),
            ).fetchone()[0],
            "master data": conn.execute(
                "SELECT count(*) FROM raw_vtex.customers WHERE tenant_id = %s", (TENANT,)
            ).fetchone()[0]
            > 0,
        }
        kept = conn.execute(
            "SELECT (payload ->> 'value')::int, payload ->> 'creationDate' FROM raw_vtex.orders"
            " WHERE tenant_id = %s AND order_id = %s",
            (TENANT, order_id),
        ).fetchone()
    others_still_there = _meta_holds(meta, ERASED_NUMBER + 1)
    left = [place for place, holds in places.items() if holds]
    reliability_report.record(
        "privacy: erase killed (SIGKILL) mid-removal, resumed",
        faults="Meta never answers the removal; SIGKILL",
        checked=len(places),
        lost=len(left),
        duplicates=0,
        passed=not left and others_still_there and kept[0] == 12345,
    )
    assert left == []
    assert kept[0] == 12345 and kept[1] is not None
    assert others_still_there


def test_a_suppressed_person_stays_out_of_the_destination_through_later_pushes(
    store: tuple[str, MetaSandbox], instance: dg.DagsterInstance, reliability_report
) -> None:
    url, meta = store
    assert push_audience(instance, url, meta.graph_url, TENANT).success
    assert _meta_holds(meta, SUPPRESSED_NUMBER)

    with temporary_environment({"DATABASE_URL": url}):
        suppressed = CliRunner().invoke(
            main,
            ["privacy", "suppress", "--tenant", TENANT, "--email", _email(SUPPRESSED_NUMBER)],
        )
    assert suppressed.exit_code == 0, suppressed.output
    pushes = []
    with psycopg.connect(url) as conn:
        for _ in range(2):
            # The store sends them again: their row is rebuilt in the marts, as it was.
            conn.execute(
                "UPDATE marts.customers SET first_name = 'José' WHERE customer_key = %s",
                (f"{TENANT}-{SUPPRESSED_NUMBER}",),
            )
            set_members(conn, TENANT, range(CUSTOMERS_IN_STORE))
            pushes.append(push_audience(instance, url, meta.graph_url, TENANT).success)
            pushes.append(not _meta_holds(meta, SUPPRESSED_NUMBER))
    reliability_report.record(
        "privacy: suppressed person re-sent by the store",
        faults="the person's row rebuilt before each of 2 pushes",
        checked=2,
        lost=0,
        duplicates=pushes.count(False),
        passed=all(pushes),
    )
    assert all(pushes), pushes
    assert _meta_holds(meta, SUPPRESSED_NUMBER + 1)
