"""Crashes: the run process is killed with SIGKILL at seeded points of an ingestion or an
activation, then the run is repeated; the final state must be exactly right.

The killed run is a `run_worker` process: a Dagster materialization on a Postgres-backed
instance, as a run worker does it. The VTEX and Meta sandboxes belong to the test process, so
they outlive it.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field

import psycopg
import pytest
from run_worker import WORKER_BATCH, Worker, push_audience
from support import THIS_MONTH, months_ago, register, sync
from support.activation import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    register_destination,
    set_members,
)
from truth import (
    compare,
    cursor_gaps,
    cursors,
    landed_rows,
    load_truth,
    moved_back,
    partial_batches,
    truth_counts,
    wrong_rows,
)

from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.identifiers import META_SCHEMA, sha256_hex
from cdp_assets.partitions import order_months
from cdp_devkit.sandbox import MetaSandbox, SandboxProcess, StoreSpec

# Nine months of orders: a kill falls between the commits of months, or inside one.
STORE = StoreSpec(
    account="crashes",
    seed=31,
    customers=200,
    orders=800,
    products=20,
    history_start=months_ago(9),
    history_end=THIS_MONTH,
)
MONTHS = (STORE.history_start.isoformat(), order_months.get_last_partition_key())

META_ACCOUNT = "5151"
TOKEN_REF = "META_CRASH_TEST_TOKEN"
TOKEN = "meta-crash-test-token"
CUSTOMERS = 3000
FIRST_MEMBERS, SECOND_MEMBERS = range(2500), range(500, 2800)
CHANGED_MEMBER = 1000  # stays in the audience with a new e-mail: a removal and an addition

INGESTION_SEEDS, INGESTION_SEEDS_LONG = [1, 2], range(3, 13)
# 6 kills the first push right after its 8th batch reached Meta, 7 the second push right
# after its second removal batch: both while the answer travels back, the narrowest window.
ACTIVATION_SEEDS = [6, 7]
ACTIVATION_SEEDS_LONG = [seed for seed in range(1, 17) if seed not in ACTIVATION_SEEDS]


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([STORE]) as server:
        yield server


def crash_ingestion(conn, warehouse_url, instance, sandbox, reliability_report, seed: int) -> None:
    tenant_id = f"crash_ingest_{seed}"
    register(conn, tenant_id, STORE.account, history_start=STORE.history_start)
    load_truth(conn, sandbox, STORE.account)
    counts = truth_counts(conn)
    total = sum(counts.values())
    # Customers land last: a threshold before them leaves the worker work to be killed in.
    rng = random.Random(seed)
    threshold, delay = rng.randint(1, total - counts["customers"]), rng.uniform(0, 0.3)
    with psycopg.connect(warehouse_url, autocommit=True) as poll:
        worker = Worker("ingest", tenant_id, str(sandbox.port), MONTHS[0])
        killed = worker.kill_when(lambda: landed_rows(poll, tenant_id) >= threshold, delay)
    landed = landed_rows(conn, tenant_id)
    # What the killed run left: whole batches of correct rows, cursors only behind them.
    partial, wrong = partial_batches(conn, tenant_id), wrong_rows(conn, tenant_id)
    gaps = cursor_gaps(conn, tenant_id)
    at_kill = cursors(conn, tenant_id)
    conn.commit()

    rerun = sync(instance, sandbox, tenant_id, months=MONTHS)
    comparison = compare(conn, sandbox, tenant_id, STORE.account)
    back = moved_back(at_kill, cursors(conn, tenant_id))
    succeeded = all(result.success for result in rerun.values())
    reliability_report.record(
        f"crash: SIGKILL during ingestion (seed {seed})",
        faults=f"SIGKILL with {landed} of {total} rows landed ({threshold} + {delay:.2f} s)",
        checked=comparison.checked,
        lost=comparison.lost + gaps,
        duplicates=comparison.duplicates,
        passed=killed and succeeded and comparison.exact and not (partial or wrong or gaps),
    )
    assert killed and landed < total
    assert partial == [] and wrong == 0 and gaps == 0
    assert succeeded
    assert comparison.exact, comparison
    assert not back


@pytest.mark.parametrize("seed", INGESTION_SEEDS)
def test_an_ingestion_killed_at_a_random_point_reruns_to_the_exact_state(
    conn, warehouse_url, instance, sandbox, reliability_report, seed
):
    crash_ingestion(conn, warehouse_url, instance, sandbox, reliability_report, seed)


@pytest.mark.long
@pytest.mark.parametrize("seed", INGESTION_SEEDS_LONG)
def test_ingestion_kills_long(conn, warehouse_url, instance, sandbox, reliability_report, seed):
    crash_ingestion(conn, warehouse_url, instance, sandbox, reliability_report, seed)


@pytest.fixture(scope="module")
def audience_url():
    with activation_warehouse() as url:
        yield url


@pytest.fixture(scope="module")
def meta():
    os.environ[TOKEN_REF] = TOKEN
    with MetaSandbox({TOKEN: [META_ACCOUNT]}) as server:
        yield server


def matchable(tenant_id: str, numbers: range) -> set[str]:
    """Members with an e-mail or a phone (every tenth synthetic customer has neither)."""
    return {f"{tenant_id}-{i}" for i in numbers if i % 10 != 9}


def audience_ids(meta: MetaSandbox, tenant_id: str) -> list[str]:
    name = f"{tenant_id}: {AUDIENCE}"
    return [a["id"] for a in meta.audiences(META_ACCOUNT) if a["name"] == name]


Row = tuple[str, ...]  # identifiers in META_SCHEMA order, as sent and as recorded


def held(meta: MetaSandbox, tenant_id: str) -> dict[str, dict[str, str]]:
    """What Meta holds for the tenant's audience: member key -> row without empty values."""
    ids = audience_ids(meta, tenant_id)
    return {row["EXTERN_ID"]: row for audience in ids for row in meta.members(audience)}


def as_held(row: Row) -> dict[str, str]:
    return {key: value for key, value in zip(META_SCHEMA, row, strict=True) if value}


def confirmed(conn: psycopg.Connection, destination_id: str) -> dict[str, Row]:
    """`cdp.destination_members`: member key -> the row recorded as confirmed."""
    rows = conn.execute(
        "SELECT member_key, identifiers FROM cdp.destination_members WHERE destination_id = %s",
        (destination_id,),
    )
    return {key: tuple(identifiers) for key, identifiers in rows}


@dataclass
class History:
    """Every member-carrying request Meta applied to the audience, replayed in order."""

    added: set[tuple[str, Row]] = field(default_factory=set)  # every (member, row) added
    resent: int = 0  # rows sent again without changing anything
    overwrote: int = 0  # additions that replaced a different row of a present member


def replay(meta: MetaSandbox, tenant_id: str) -> History:
    history, members = History(), {}
    for audience in audience_ids(meta, tenant_id):
        for request in meta.requests(f"/{audience}/users"):
            if request.status != 200 or not request.payload:
                continue
            remove = request.method == "DELETE" or request.form.get("method") == "DELETE"
            for row in map(tuple, request.payload["data"]):
                key = row[0]
                if remove:
                    history.resent += key not in members
                    members.pop(key, None)
                else:
                    history.resent += members.get(key) == row
                    history.overwrote += key in members and members[key] != row
                    members[key] = row
                    history.added.add((key, row))
    return history


def crash_activation(audience_url, meta, instance, reliability_report, seed: int) -> None:
    tenant_id = f"crash_act_{seed}"
    destination = Destination(
        f"{tenant_id}_meta",
        tenant_id,
        "meta",
        META_ACCOUNT,
        credential_refs={"access_token": TOKEN_REF},
    )
    with psycopg.connect(audience_url) as conn:
        add_tenant_with_customers(conn, tenant_id, CUSTOMERS)
        set_members(conn, tenant_id, FIRST_MEMBERS)
        register_destination(conn, destination)

    def change_audience(conn: psycopg.Connection) -> None:
        set_members(conn, tenant_id, SECOND_MEMBERS)
        conn.execute(
            "UPDATE marts.customers SET email = 'Moved.Away@Exemplo.com'"
            " WHERE tenant_id = %s AND customer_key = %s",
            (tenant_id, f"{tenant_id}-{CHANGED_MEMBER}"),
        )
        conn.commit()

    # Requests of each push: the audience looked up by name and created, the additions and
    # the match info; then the removals (leavers and the changed member's old row), the
    # additions (joiners and its new row) and the match info.
    first, second = matchable(tenant_id, FIRST_MEMBERS), matchable(tenant_id, SECOND_MEMBERS)
    requests = {
        "first push": 3 + math.ceil(len(first) / WORKER_BATCH),
        "push of the changed audience": 1
        + math.ceil((len(first - second) + 1) / WORKER_BATCH)
        + math.ceil((len(second - first) + 1) / WORKER_BATCH),
    }
    # The seed picks the push to kill (odd: the second), the request after which
    # it dies, mostly while Meta's answer travels back, and a little delay.
    killed_push = list(requests)[seed % len(requests)]
    rng = random.Random(seed)
    after = rng.randint(1, requests[killed_push] - 2)  # before the last batch and match info
    delay = rng.choice([0.0, 0.01, 0.05])
    pushes = []
    with psycopg.connect(audience_url) as conn:
        for push_name in requests:
            if push_name != "first push":
                change_audience(conn)
            if push_name == killed_push:
                before = len(meta.requests())
                worker = Worker("activate", tenant_id, audience_url, meta.graph_url)
                killed = worker.kill_when(
                    lambda before=before: len(meta.requests()) - before >= after, delay
                )
                assert killed
                state = confirmed(conn, destination.destination_id)
                platform, added = held(meta, tenant_id), replay(meta, tenant_id).added
                unconfirmed = sum((key, row) not in added for key, row in state.items())
                # Applied by Meta, not yet recorded: what the re-run has to send again.
                in_flight = sum(key not in platform for key in state) + sum(
                    key not in state or as_held(state[key]) != row for key, row in platform.items()
                )
                conn.commit()
            pushes.append(push_audience(instance, audience_url, meta.graph_url, tenant_id))
        state, platform = confirmed(conn, destination.destination_id), held(meta, tenant_id)

    history = replay(meta, tenant_id)
    audiences = len(audience_ids(meta, tenant_id))
    recorded_as_held = {key: as_held(row) for key, row in state.items()} == platform
    exact = recorded_as_held and set(platform) == second
    succeeded = all(result.success for result in pushes)
    reliability_report.record(
        f"crash: SIGKILL during activation to Meta (seed {seed})",
        faults=f"{killed_push} killed after request {after}/{requests[killed_push]} + {delay} s;"
        f" {history.resent} rows re-sent unchanged",
        checked=len(second),
        lost=len(second - set(platform)) + unconfirmed,
        duplicates=history.overwrote + audiences - 1,
        passed=succeeded and exact,
    )
    assert unconfirmed == 0  # nothing was recorded as confirmed without Meta's confirmation
    assert succeeded
    assert audiences == 1  # an audience whose id was lost to a kill is found, not recreated
    assert exact
    changed = platform[f"{tenant_id}-{CHANGED_MEMBER}"]["EMAIL"]
    assert changed == sha256_hex("moved.away@exemplo.com")
    assert history.overwrote == 0
    # The re-run sent again only what was in flight at the kill: at most one batch.
    assert in_flight <= history.resent <= WORKER_BATCH


@pytest.mark.parametrize("seed", ACTIVATION_SEEDS)
def test_an_activation_killed_mid_push_reruns_to_the_desired_audience(
    audience_url, meta, instance, reliability_report, seed
):
    crash_activation(audience_url, meta, instance, reliability_report, seed)


@pytest.mark.long
@pytest.mark.parametrize("seed", ACTIVATION_SEEDS_LONG)
def test_activation_kills_long(audience_url, meta, instance, reliability_report, seed):
    crash_activation(audience_url, meta, instance, reliability_report, seed)
