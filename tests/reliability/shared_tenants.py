"""Three small tenants whose stores share customers and ids, run once through the platform.

The synthetic stores already share SKU and product ids (every store numbers them from the
same range). They cannot share people, so crafted Master Data documents and orders are
landed for tenants B and C through the ingestion's own path (`records` + `upsert`) that reuse
tenant A's customers' e-mails, CPFs, phones and VTEX user ids, and even A's order ids.

`shared_pipeline` then runs what the demo runs, with the platform's own jobs: VTEX sync,
analytics (dbt, CLV, churn), audiences, and activation to the Meta and Google sandboxes and
to VTEX collections. It runs once per session (test_tenant_isolation.py and
test_secrets_and_pii.py both read it) and keeps what the sandboxes received and everything
written to stdout, stderr and the logging module meanwhile.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import dagster as dg
import orjson
import psycopg
from support import months_ago

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.jobs import activation_push
from cdp_assets.analytics.jobs import ANALYTICS_JOB, AUDIENCES_JOB
from cdp_assets.definitions import defs
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.partitions import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    order_months,
    tenant_month_range_tags,
    tenants,
)
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.jobs import ORDERS_SYNC_JOB, TENANT_SYNC_JOB
from cdp_assets.vtex.records import customer_row, order_row
from cdp_assets.vtex.sync import CUSTOMERS, ORDERS
from cdp_devkit.sandbox import (
    GoogleSandbox,
    MetaSandbox,
    SandboxProcess,
    StoreSpec,
    credentials_for,
)
from cdp_devkit.sandbox.vtex.generator import format_ticks, to_ticks

HISTORY_START = months_ago(18)
STORES = {
    "iso_a": StoreSpec("isoa", 201, 90, 450, 15, history_start=HISTORY_START),
    "iso_b": StoreSpec("isob", 202, 70, 350, 15, history_start=HISTORY_START),
    "iso_c": StoreSpec("isoc", 203, 60, 300, 15, history_start=HISTORY_START),
}
SOURCE = "iso_a"  # whose customers the others' crafted documents reuse
# Who each crafted person in B and C is: (index into A's shared customers, what is reused).
# "all" reuses e-mail, CPF, phone and VTEX user id; the others one key alone.
CRAFTED = {
    "iso_b": [(i, "all") for i in range(0, 4)]
    + [(i, "email") for i in range(4, 7)]
    + [(i, "document") for i in range(7, 10)],
    "iso_c": [(i, "all") for i in range(2, 6)]
    + [(i, "phone") for i in range(6, 8)]
    + [(i, "email") for i in range(8, 12)],
}
ORDERS_PER_PERSON = 3
META_ACCOUNTS = {"iso_a": "2001", "iso_b": "2002", "iso_c": "2003"}
GOOGLE_CUSTOMERS = {"iso_b": "1234567801", "iso_c": "1234567802"}
Identity = tuple[str, str, str, str, str]  # (mode, e-mail, CPF, phone, VTEX user id)


@dataclass
class Pipeline:
    """What the run left behind, for the tests to check."""

    tenant_ids: list[str]
    # tenant -> the identities of A's customers its crafted people reuse (all of them for A)
    crafted: dict[str, list[Identity]]
    # tenant -> the audience pushed to its destinations
    audiences: dict[str, str]
    # tenant -> its Meta ad account's audience members (rows as uploaded)
    meta_members: dict[str, list[dict[str, str]]]
    meta_requests: list = field(default_factory=list)
    google_requests: list = field(default_factory=list)
    google_members: dict[str, set[str]] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # name -> value
    raw_emails: set[str] = field(default_factory=set)
    raw_phones: set[str] = field(default_factory=set)
    run_ids: list[str] = field(default_factory=list)
    output: str = ""  # stdout and stderr, file descriptors and Python streams
    log_records: list[str] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)  # (job and key, seconds)
    seconds: float = 0.0


_BUILT: dict[str, Pipeline] = {}


def shared_pipeline(warehouse_url: str, instance: dg.DagsterInstance) -> Pipeline:
    """The pipeline over this session's database, built on first use."""
    if warehouse_url not in _BUILT:
        _BUILT[warehouse_url] = _build(warehouse_url, instance)
    return _BUILT[warehouse_url]


@contextlib.contextmanager
def _captured(pipeline: Pipeline) -> Iterator[None]:
    """Everything written meanwhile, at every level: file descriptors 1 and 2 (dbt and other
    child processes), sys.stdout/stderr, and records reaching the root logger."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    streams = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        logging.getLogger().addHandler(handler)
        try:
            with contextlib.redirect_stdout(streams), contextlib.redirect_stderr(streams):
                yield
        except BaseException:
            failed = True
            raise
        else:
            failed = False
        finally:
            logging.getLogger().removeHandler(handler)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            pipeline.output = sink.read().decode("utf-8", "replace") + streams.getvalue()
            pipeline.log_records = [handler.format(record) for record in records]
            if failed:  # what the run printed is the way to its error
                sys.stderr.write(pipeline.output[-20_000:])


def _run(pipeline: Pipeline, instance: dg.DagsterInstance, job: str, **run) -> None:
    started = time.monotonic()
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, raise_on_error=False, **run
    )
    tags = run.get("tags", {})
    label = run.get("partition_key") or "..".join(
        tags[tag] for tag in (RANGE_START_TAG, RANGE_END_TAG) if tag in tags
    )
    pipeline.timings.append((f"{job} {label}", time.monotonic() - started))
    pipeline.run_ids.append(result.run_id)
    if not result.success:
        raise AssertionError(f"{job} failed for {run}: see run {result.run_id}")


def _shared_people(conn: psycopg.Connection) -> list[dict]:
    """A's CL documents of customers who bought (so they are customers in A too)."""
    rows = conn.execute(
        """
        SELECT c.payload FROM raw_vtex.customers c
         WHERE c.tenant_id = %s AND c.payload ->> 'userId' IN (
               SELECT o.payload -> 'clientProfileData' ->> 'userProfileId'
                 FROM raw_vtex.orders o
                WHERE o.tenant_id = %s AND o.payload ->> 'status' = 'invoiced')
         ORDER BY c.customer_id LIMIT 12
        """,
        (SOURCE, SOURCE),
    ).fetchall()
    assert len(rows) == 12, "store A has too few buyers with a CL document"
    return [payload for (payload,) in rows]


def _craft(
    conn: psycopg.Connection, tenant_id: str, people: list[dict], rng: random.Random
) -> list[Identity]:
    """Land CL documents and orders for `tenant_id` reusing A's people and order ids; the
    identities of A's people they reuse."""
    spec = STORES[tenant_id]
    own_orders = [
        payload
        for (payload,) in conn.execute(
            "SELECT payload FROM raw_vtex.orders WHERE tenant_id = %s ORDER BY order_id",
            (tenant_id,),
        )
    ]
    a_order_ids = [
        key
        for (key,) in conn.execute(
            "SELECT order_id FROM raw_vtex.orders WHERE tenant_id = %s ORDER BY order_id",
            (SOURCE,),
        )
    ]
    end = spec.history_end
    customers, orders, crafted = [], [], []
    for number, (index, mode) in enumerate(CRAFTED[tenant_id]):
        person = people[index]
        own = {
            "email": f"{tenant_id}.crafted{number}@example.org",
            "document": f"{rng.randrange(10**10, 10**11):011d}",
            "phone": f"+55119{rng.randrange(10**7, 10**8)}",
            "userId": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        }
        reused = {"all": ("email", "document", "phone", "userId")}.get(mode, (mode,))
        identity = {key: person[key] if key in reused else own[key] for key in own}
        # The same address typed differently in this store: normalization must still match.
        if "email" in reused and number % 2:
            identity["email"] = f"  {identity['email'].upper()} "
        crafted.append(
            (mode, person["email"], person["document"], person["phone"], person["userId"])
        )
        updated = format_ticks(to_ticks(end - timedelta(days=number + 1)), zulu=True)
        customers.append(
            {
                **person,
                **identity,
                "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "accountName": spec.account,
                "firstName": person["firstName"] if mode == "all" else f"Crafted{number}",
                "createdIn": updated,
                "updatedIn": updated,
            }
        )
        for repeat in range(ORDERS_PER_PERSON):
            order = copy.deepcopy(rng.choice(own_orders))
            moment = format_ticks(to_ticks(end - timedelta(days=5 + 9 * repeat + number)))
            profile = order["clientProfileData"]
            profile.update(
                userProfileId=identity["userId"],
                document=identity["document"],
                phone=identity["phone"],
                firstName=customers[-1]["firstName"],
            )
            order.update(
                orderId=a_order_ids[len(orders)],  # A's order ids, reused in this tenant
                status="invoiced",
                creationDate=moment,
                lastChange=moment,
            )
            orders.append(order)
    rows = [customer_row(doc) for doc in customers]
    upsert_documents(conn, CUSTOMERS, tenant_id, rows)
    upsert_documents(conn, ORDERS, tenant_id, [order_row(o, orjson.dumps(o)) for o in orders])
    conn.commit()
    return crafted


def _pick_audience(conn: psycopg.Connection, tenant_id: str, keys: list[str]) -> str:
    """The audience holding most of these customers (then the largest), so pushing it
    sends the customers whose identities other tenants share."""
    audiences = [
        name
        for (name,) in conn.execute(
            "SELECT audience FROM audiences.audience_catalog WHERE tenant_id = %s AND members > 0"
            " ORDER BY audience",
            (tenant_id,),
        )
    ]
    best = max(
        audiences,
        key=lambda name: conn.execute(
            f"SELECT count(*) FILTER (WHERE customer_key = ANY(%s)), count(*)"
            f" FROM audiences.{name} WHERE tenant_id = %s",
            (keys, tenant_id),
        ).fetchone(),
    )
    return best


def shared_customer_keys(
    conn: psycopg.Connection, tenant_id: str, people: list[Identity]
) -> list[str]:
    """Customer keys, in `tenant_id`, of the customers holding any of these identities."""
    emails = [email.strip().lower() for _, email, *_ in people]
    documents = [document for _, _, document, *_ in people]
    users = [user for *_, user in people]
    return [
        key
        for (key,) in conn.execute(
            """
            SELECT DISTINCT k.customer_key
              FROM intermediate.int_identity__customer_keys k
              JOIN intermediate.int_identity__records r USING (tenant_id, record_id)
             WHERE k.tenant_id = %s
               AND (r.email_normalized = ANY(%s) OR r.document_normalized = ANY(%s)
                    OR r.user_profile_id = ANY(%s))
            """,
            (tenant_id, emails, documents, users),
        )
    ]


def _register_destinations(
    conn: psycopg.Connection, pipeline: Pipeline, meta_tokens: dict[str, str]
) -> dict[str, str]:
    env = {}
    for tenant_id in pipeline.tenant_ids:
        audience = pipeline.audiences[tenant_id]
        token_ref = f"META_{tenant_id.upper()}_TOKEN"
        env[token_ref] = pipeline.secrets[f"Meta token of {tenant_id}"] = meta_tokens[tenant_id]
        destinations = [
            Destination(
                f"{tenant_id}_meta",
                tenant_id,
                "meta",
                META_ACCOUNTS[tenant_id],
                credential_refs={"access_token": token_ref},
                min_audience_size=1,
            )
        ]
        if tenant_id == "iso_b":
            destinations.append(
                Destination(
                    "iso_b_google_dm",
                    tenant_id,
                    "google_data_manager",
                    GOOGLE_CUSTOMERS[tenant_id],
                    ad_user_data_consent="GRANTED",
                    ad_personalization_consent="GRANTED",
                    min_audience_size=1,
                )
            )
        if tenant_id == "iso_c":
            env["GOOGLE_ADS_ISO_C_DEVELOPER_TOKEN"] = f"dev-token-{uuid.uuid4().hex}"
            pipeline.secrets["Google developer token"] = env["GOOGLE_ADS_ISO_C_DEVELOPER_TOKEN"]
            destinations.append(
                Destination(
                    "iso_c_google_ads",
                    tenant_id,
                    "google_ads",
                    GOOGLE_CUSTOMERS[tenant_id],
                    credential_refs={"developer_token": "GOOGLE_ADS_ISO_C_DEVELOPER_TOKEN"},
                    ad_user_data_consent="GRANTED",
                    ad_personalization_consent="GRANTED",
                    min_audience_size=1,
                )
            )
        for destination in destinations:
            add_destination(conn, destination)
            add_audience(conn, destination.destination_id, audience)
        if tenant_id == SOURCE:
            add_destination(
                conn, Destination("iso_a_vtex", tenant_id, "vtex_collections", min_audience_size=1)
            )
            rule = {"audience": audience, "rank_by": "buyers", "days": 3650, "top_n": 5}
            add_audience(conn, "iso_a_vtex", "shared_best_sellers", rule)
    conn.commit()
    return env


def _build(warehouse_url: str, instance: dg.DagsterInstance) -> Pipeline:
    started = time.monotonic()
    pipeline = Pipeline(list(STORES), {}, {}, {})
    rng = random.Random(7)
    # Each tenant's token opens its own ad account only.
    meta_tokens = {tenant_id: f"meta-token-{tenant_id}-{uuid.uuid4().hex}" for tenant_id in STORES}
    with (
        _captured(pipeline),
        SandboxProcess(list(STORES.values())) as vtex,
        MetaSandbox({meta_tokens[t]: [META_ACCOUNTS[t]] for t in STORES}) as meta,
        GoogleSandbox(job_seconds=0) as google,
        psycopg.connect(warehouse_url) as conn,
    ):
        env = {
            "VTEX_BASE_URL_TEMPLATE": vtex.base_url + "/{account}",
            "VTEX_REQUESTS_PER_SECOND": "5000",
            "VTEX_COLLECTION_WRITES_PER_SECOND": "200",
            "META_GRAPH_URL": meta.graph_url,
            "GOOGLE_SANDBOX_ADDRESS": google.address,
        }
        for tenant_id, spec in STORES.items():
            key_ref, token_ref = f"VTEX_{tenant_id.upper()}_KEY", f"VTEX_{tenant_id.upper()}_TOKEN"
            env[key_ref], env[token_ref] = credentials_for(spec.account)
            pipeline.secrets[f"VTEX app key of {tenant_id}"] = env[key_ref]
            pipeline.secrets[f"VTEX app token of {tenant_id}"] = env[token_ref]
            add_tenant(
                conn,
                Tenant(tenant_id, spec.account, key_ref, token_ref, history_start=HISTORY_START),
            )
        conn.commit()
        instance.add_dynamic_partitions(tenants.name, pipeline.tenant_ids)
        first_month = order_months.get_partition_key_for_timestamp(
            datetime.combine(HISTORY_START, datetime.min.time()).timestamp()
        )
        last_month = order_months.get_last_partition_key()
        with temporary_environment(env):
            for tenant_id in pipeline.tenant_ids:
                _run(pipeline, instance, TENANT_SYNC_JOB, partition_key=tenant_id)
                tags = tenant_month_range_tags(tenant_id, first_month, last_month)
                _run(pipeline, instance, ORDERS_SYNC_JOB, tags=tags)
            people = _shared_people(conn)
            for tenant_id in CRAFTED:
                pipeline.crafted[tenant_id] = _craft(conn, tenant_id, people, rng)
            pipeline.crafted[SOURCE] = [
                ("all", p["email"], p["document"], p["phone"], p["userId"]) for p in people
            ]
            # A's run of its own, then B's and C's in one run over both (a backfill's): one
            # set-based build over tenants who share people keeps them apart as well.
            together = {RANGE_START_TAG: "iso_b", RANGE_END_TAG: "iso_c"}
            for job in (ANALYTICS_JOB, AUDIENCES_JOB):
                _run(pipeline, instance, job, partition_key=SOURCE)
                _run(pipeline, instance, job, tags=together)
            for tenant_id in pipeline.tenant_ids:
                keys = shared_customer_keys(conn, tenant_id, pipeline.crafted[tenant_id])
                pipeline.audiences[tenant_id] = _pick_audience(conn, tenant_id, keys)
            env.update(_register_destinations(conn, pipeline, meta_tokens))
            with temporary_environment(env):
                for tenant_id in pipeline.tenant_ids:
                    _run(pipeline, instance, activation_push.name, partition_key=tenant_id)
        for tenant_id, account in META_ACCOUNTS.items():
            pipeline.meta_members[tenant_id] = [
                row for audience in meta.audiences(account) for row in meta.members(audience["id"])
            ]
        pipeline.meta_requests = meta.requests()
        pipeline.google_requests = google.requests()
        pipeline.google_members = {
            user_list.account_id: google.members(user_list.list_id)
            for user_list in google.user_lists()
        }
        for column in ("payload ->> 'email'", "payload -> 'clientProfileData' ->> 'email'"):
            pipeline.raw_emails |= _values(conn, column)
        for column in ("payload ->> 'phone'", "payload -> 'clientProfileData' ->> 'phone'"):
            pipeline.raw_phones |= _values(conn, column)
    pipeline.seconds = time.monotonic() - started
    return pipeline


def _values(conn: psycopg.Connection, expression: str) -> set[str]:
    """Distinct non-empty values of an expression over the tenants' raw customers and orders."""
    found: set[str] = set()
    for table in ("raw_vtex.customers", "raw_vtex.orders"):
        found |= {
            value
            for (value,) in conn.execute(
                f"SELECT DISTINCT {expression} FROM {table} WHERE tenant_id = ANY(%s)",
                (list(STORES),),
            )
            if value
        }
    return found
