"""Privacy requests, end to end: a person of store A known under several identity records (their
Master Data document, an order with another e-mail and their CPF, a guest order with their
e-mail typed differently, an order with their phone alone) is synced, resolved, put in
audiences and sent to Meta and Google with the platform's own jobs; store B holds the same
e-mail, CPF and phone. `cdp privacy erase` on A then leaves no trace of them in A's
warehouse (raw values, normalized forms and their hashes, in every text and JSON column of
every table), keeps A's order totals, takes them out of every audience view and of both
platforms, and records each step; B keeps them. A full re-sync of A from the sandbox, which
still has them, brings them back into no audience and no destination.

On the synthetic audience warehouse: a destination receives exactly the members its consent
policy allows, and suppressed people are not sent until their suppression is lifted.
"""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import dagster as dg
import orjson
import psycopg
import pytest
from click.testing import CliRunner
from support import months_ago, run_dbt
from support.activation import (
    activation_warehouse,
    add_tenant_with_customers,
    register_destination,
    set_members,
)

from cdp_assets.activation.audiences import audience_members
from cdp_assets.activation.destinations import (
    Destination,
    add_audience,
    add_destination,
    destination_audiences,
)
from cdp_assets.activation.identifiers import (
    google_email,
    meta_row,
    normalize_email,
    normalize_phone,
    sha256_hex,
)
from cdp_assets.activation.jobs import activation_push
from cdp_assets.analytics.jobs import ANALYTICS_JOB, AUDIENCES_JOB
from cdp_assets.cli import main
from cdp_assets.definitions import defs
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.partitions import order_months, tenant_month_range_tags, tenants
from cdp_assets.privacy.audit import get_request
from cdp_assets.privacy.definitions import PRIVACY_REQUESTS_JOB
from cdp_assets.privacy.erase import STEPS
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

HISTORY_START = months_ago(6)
STORES = {
    "prv_a": StoreSpec("prva", 401, 80, 400, 12, history_start=HISTORY_START),
    "prv_b": StoreSpec("prvb", 402, 60, 300, 12, history_start=HISTORY_START),
}
ERASED, OTHER = "prv_a", "prv_b"
META_ACCOUNTS = {"prv_a": "4501", "prv_b": "4502"}
GOOGLE_CUSTOMER = "4501450145"


@dataclass
class Person:
    email: str
    alt_email: str
    document: str
    phone: str
    user_id: str
    customer_keys: list[str] = field(default_factory=list)

    def needles(self) -> set[str]:
        """Their identifiers as stored, normalized, and hashed as any destination hashes them."""
        emails = {normalize_email(self.email), normalize_email(self.alt_email)}
        e164 = normalize_phone(self.phone, "BR")
        assert None not in emails and e164 is not None
        clear = {self.email, self.alt_email, self.phone, e164, e164[1:], self.document}
        hashed = {sha256_hex(v) for v in emails | {e164, e164[1:], self.document}}
        hashed |= {sha256_hex(google_email(e)) for e in emails}
        return {v.lower() for v in clear | emails} | hashed


@dataclass
class Platforms:
    """What the Meta and Google sandboxes hold: member rows per Meta account, Google members."""

    meta: dict[str, list[dict[str, str]]]
    google: set[str]


@dataclass
class Story:
    person: Person
    audiences: dict[str, str]
    request_id: int = 0
    erase_output: str = ""
    status_output: str = ""
    dry_run_output: str = ""
    requests_after_dry_run: int = 0
    # Snapshots, by moment: before the erase, after it, after the rebuild, after a re-sync.
    totals: dict[str, tuple] = field(default_factory=dict)
    revenue: dict[str, float] = field(default_factory=dict)
    holdings: dict[str, list[str]] = field(default_factory=dict)
    in_audiences: dict[str, list[str]] = field(default_factory=dict)
    platforms: dict[str, Platforms] = field(default_factory=dict)
    other_tenant: dict[str, tuple] = field(default_factory=dict)


BY_TENANT = "tenant_id = %(tenant_id)s AND"
BY_DESTINATION = (
    "destination_id IN (SELECT destination_id FROM cdp.destinations"
    " WHERE tenant_id = %(tenant_id)s) AND"
)
TEXT_TYPES = ("text", "character varying", "json", "jsonb", "text[]", "character")


def holdings(conn: psycopg.Connection, tenant_id: str, needles: set[str]) -> list[str]:
    """Every table and materialized view (but the suppression list, which holds the hashes by
    design) with rows holding any needle in a text or JSON column: the tenant's rows where the
    relation has a tenant_id (or a destination id), every row elsewhere."""
    relations = conn.execute(
        """
        SELECT n.nspname, c.relname,
               array_agg(a.attname::text) FILTER (WHERE format_type(a.atttypid, NULL) = ANY(%s)),
               CASE WHEN bool_or(a.attname = 'tenant_id') THEN %s
                    WHEN bool_or(a.attname = 'destination_id') THEN %s ELSE '' END
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname !~ '^(pg_|information_schema)'
          AND (n.nspname, c.relname) <> ('cdp', 'privacy_suppressions')
        GROUP BY 1, 2 ORDER BY 1, 2
        """,
        (list(TEXT_TYPES), BY_TENANT, BY_DESTINATION),
    ).fetchall()
    patterns = [f"%{needle}%" for needle in sorted(needles)]
    found = []
    for schema, table, columns, tenant in relations:
        if not columns:
            continue
        holds = " OR ".join(f'lower("{c}"::text) LIKE ANY(%(patterns)s)' for c in columns)
        (count,) = conn.execute(
            f'SELECT count(*) FROM "{schema}"."{table}" WHERE {tenant} ({holds})',
            {"patterns": patterns, "tenant_id": tenant_id},
        ).fetchone()
        if count:
            found.append(f"{schema}.{table}: {count}")
    return found


def audience_hits(conn: psycopg.Connection, tenant_id: str, person: Person) -> list[str]:
    """Audiences holding the person: one of their customer keys or hashed identifiers."""
    hashes = [h for h in person.needles() if len(h) == 64]
    views = [
        name
        for (name,) in conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'audiences' AND table_type = 'BASE TABLE' ORDER BY 1"
        )
    ]
    hits = []
    for view in views:
        (count,) = conn.execute(
            f"SELECT count(*) FROM audiences.{view} WHERE tenant_id = %s AND (customer_key"
            " = ANY(%s) OR email_sha256 = ANY(%s) OR phone_sha256 = ANY(%s))",
            (tenant_id, person.customer_keys, hashes, hashes),
        ).fetchone()
        if count:
            hits.append(view)
    return hits


def order_totals(conn: psycopg.Connection, tenant_id: str) -> tuple:
    return conn.execute(
        "SELECT count(*), sum((payload ->> 'value')::numeric), min(creation_date),"
        " max(creation_date) FROM raw_vtex.orders WHERE tenant_id = %s",
        (tenant_id,),
    ).fetchone()


def platform_state(meta: MetaSandbox, google: GoogleSandbox) -> Platforms:
    return Platforms(
        {
            tenant_id: [
                row for audience in meta.audiences(account) for row in meta.members(audience["id"])
            ]
            for tenant_id, account in META_ACCOUNTS.items()
        },
        {
            member
            for user_list in google.user_lists()
            for member in google.members(user_list.list_id)
        },
    )


def on_platforms(state: Platforms, tenant_id: str, person: Person) -> list[str]:
    """Where the platforms hold the person for a tenant: a Meta row with one of their hashes or
    keys, a Google member holding one of their hashes."""
    needles = person.needles()
    places = [
        f"meta {row.get('EXTERN_ID')}"
        for row in state.meta[tenant_id]
        if row.get("EXTERN_ID") in person.customer_keys or needles & set(row.values())
    ]
    if tenant_id == ERASED:
        places += [f"google {m}" for m in state.google if any(n in m for n in needles)]
    return places


def _run(instance: dg.DagsterInstance, job: str, **run) -> None:
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, raise_on_error=False, **run
    )
    assert result.success, f"{job} failed for {run}"


def _months(tenant_id: str) -> dict[str, str]:
    first = order_months.get_partition_key_for_timestamp(
        datetime.combine(HISTORY_START, datetime.min.time()).timestamp()
    )
    return tenant_month_range_tags(tenant_id, first, order_months.get_last_partition_key())


def _sync(instance: dg.DagsterInstance, tenant_id: str, full_refresh: bool = False) -> None:
    refresh = {"config": {"full_refresh": full_refresh}}
    _run(
        instance,
        TENANT_SYNC_JOB,
        partition_key=tenant_id,
        run_config={"ops": {"vtex_customers": refresh}} if full_refresh else None,
    )
    _run(
        instance,
        ORDERS_SYNC_JOB,
        tags=_months(tenant_id),
        run_config={"ops": {"vtex_orders": refresh}},
    )


def _refresh(instance: dg.DagsterInstance, tenant_ids: list[str]) -> None:
    for tenant_id in tenant_ids:
        _run(instance, ANALYTICS_JOB, partition_key=tenant_id)
        _run(instance, AUDIENCES_JOB, partition_key=tenant_id)


def _push(instance: dg.DagsterInstance, tenant_ids: list[str]) -> None:
    for tenant_id in tenant_ids:
        _run(instance, activation_push.name, partition_key=tenant_id)


def _pick_person(conn: psycopg.Connection) -> dict:
    """A buyer of store A with a Master Data document and a phone the platforms can match."""
    for (payload,) in conn.execute(
        """
        SELECT c.payload FROM raw_vtex.customers c
        WHERE c.tenant_id = %s AND c.payload ->> 'userId' IN (
              SELECT o.payload -> 'clientProfileData' ->> 'userProfileId'
              FROM raw_vtex.orders o
              WHERE o.tenant_id = %s AND o.payload ->> 'status' = 'invoiced')
        ORDER BY c.customer_id
        """,
        (ERASED, ERASED),
    ):
        if normalize_phone(payload["phone"], "BR") and normalize_email(payload["email"]):
            return payload
    raise AssertionError("store A has no buyer with a CL document and a valid phone")


def _craft(conn: psycopg.Connection, cl: dict, rng: random.Random) -> Person:
    """Land in A the person's other identity records, and in B the same person."""
    person = Person(
        email=cl["email"],
        alt_email=f"alt.{uuid.UUID(int=rng.getrandbits(128)).hex[:10]}@example.org",
        document=cl["document"],
        phone=cl["phone"],
        user_id=cl["userId"],
    )
    end = STORES[ERASED].history_end
    templates = {
        tenant_id: [
            payload
            for (payload,) in conn.execute(
                "SELECT payload FROM raw_vtex.orders WHERE tenant_id = %s"
                " AND payload ->> 'status' = 'invoiced' ORDER BY order_id LIMIT 3",
                (tenant_id,),
            )
        ]
        for tenant_id in STORES
    }

    def order(tenant_id: str, number: int, **profile) -> dict:
        document = copy.deepcopy(templates[tenant_id][number])
        moment = format_ticks(to_ticks(end - timedelta(days=3 + number)))
        document["clientProfileData"].update(profile)
        document.update(
            orderId=f"PRV{number}-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}-01",
            creationDate=moment,
            lastChange=moment,
        )
        return document

    def new_profile() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    a_orders = [
        # Another e-mail, with their CPF.
        order(
            ERASED,
            0,
            email=person.alt_email,
            document=person.document,
            phone=None,
            userProfileId=new_profile(),
        ),
        # A guest order with their e-mail typed differently.
        order(
            ERASED,
            1,
            email=f"  {person.email.upper()} ",
            document=None,
            phone=None,
            userProfileId=None,
        ),
        # Their phone alone.
        order(
            ERASED, 2, email=None, document=None, phone=person.phone, userProfileId=new_profile()
        ),
    ]
    b_cl = {
        **cl,
        "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "accountName": STORES[OTHER].account,
    }
    b_orders = [
        order(
            OTHER,
            0,
            email=person.email,
            document=person.document,
            phone=person.phone,
            userProfileId=person.user_id,
        )
    ]
    upsert_documents(conn, ORDERS, ERASED, [order_row(o, orjson.dumps(o)) for o in a_orders])
    upsert_documents(conn, ORDERS, OTHER, [order_row(o, orjson.dumps(o)) for o in b_orders])
    upsert_documents(conn, CUSTOMERS, OTHER, [customer_row(b_cl)])
    # A record of theirs the landing quarantined, as it keeps the refused text.
    conn.execute(
        "INSERT INTO raw_vtex.rejects (tenant_id, entity, natural_key, reason, raw_text, raw_md5)"
        " VALUES (%s, 'customers', 'bad-doc', 'createdIn unreadable', %s, md5(%s))",
        (ERASED, f'{{"email": "{person.email}"}}', person.email),
    )
    conn.commit()
    return person


def _customer_keys(conn: psycopg.Connection, tenant_id: str, person: Person) -> list[str]:
    return [
        key
        for (key,) in conn.execute(
            "SELECT DISTINCT customer_key FROM intermediate.int_identity__customer_keys"
            " WHERE tenant_id = %s AND (email_normalized = ANY(%s) OR document_normalized = %s"
            " OR phone_e164 = %s)",
            (
                tenant_id,
                [normalize_email(person.email), normalize_email(person.alt_email)],
                person.document,
                normalize_phone(person.phone, "BR"),
            ),
        )
    ]


def _pick_audience(conn: psycopg.Connection, tenant_id: str, keys: list[str]) -> str:
    """The largest audience holding the person."""
    for (name,) in conn.execute(
        "SELECT audience FROM audiences.audience_catalog WHERE tenant_id = %s ORDER BY members"
        " DESC, audience",
        (tenant_id,),
    ).fetchall():
        (held,) = conn.execute(
            f"SELECT count(*) FROM audiences.{name} WHERE tenant_id = %s AND customer_key"
            " = ANY(%s)",
            (tenant_id, keys),
        ).fetchone()
        if held:
            return name
    raise AssertionError(f"no audience of {tenant_id} holds the person")


def _destinations(conn: psycopg.Connection, audiences: dict[str, str]) -> dict[str, str]:
    env = {}
    for tenant_id, account in META_ACCOUNTS.items():
        env[f"META_{tenant_id.upper()}_TOKEN"] = f"meta-token-{tenant_id}"
        add_destination(
            conn,
            Destination(
                f"{tenant_id}_meta",
                tenant_id,
                "meta",
                account,
                credential_refs={"access_token": f"META_{tenant_id.upper()}_TOKEN"},
                min_audience_size=1,
            ),
        )
        add_audience(conn, f"{tenant_id}_meta", audiences[tenant_id])
    add_destination(
        conn,
        Destination(
            "prv_a_google",
            ERASED,
            "google_data_manager",
            GOOGLE_CUSTOMER,
            ad_user_data_consent="GRANTED",
            ad_personalization_consent="GRANTED",
            min_audience_size=1,
        ),
    )
    add_audience(conn, "prv_a_google", audiences[ERASED])
    conn.commit()
    return env


def _snapshot(story: Story, moment: str, conn: psycopg.Connection, meta, google) -> None:
    needles = story.person.needles()
    story.totals[moment] = order_totals(conn, ERASED)
    story.holdings[moment] = holdings(conn, ERASED, needles)
    story.in_audiences[moment] = audience_hits(conn, ERASED, story.person)
    story.platforms[moment] = platform_state(meta, google)
    b_person = Person(**{**story.person.__dict__, "customer_keys": []})
    b_person.customer_keys = _customer_keys(conn, OTHER, story.person)
    story.other_tenant[moment] = (
        len(holdings(conn, OTHER, needles)),
        tuple(audience_hits(conn, OTHER, b_person)),
        len(on_platforms(story.platforms[moment], OTHER, b_person)),
    )


@pytest.fixture(scope="module")
def story(warehouse_url: str, instance: dg.DagsterInstance) -> Iterator[Story]:
    rng = random.Random(45)
    tokens = {f"meta-token-{t}": [a] for t, a in META_ACCOUNTS.items()}
    with (
        SandboxProcess(list(STORES.values())) as vtex,
        MetaSandbox(tokens) as meta,
        GoogleSandbox(job_seconds=0, processing_seconds=0) as google,
        psycopg.connect(warehouse_url, autocommit=True) as conn,
    ):
        env = {
            "VTEX_BASE_URL_TEMPLATE": vtex.base_url + "/{account}",
            "VTEX_REQUESTS_PER_SECOND": "5000",
            "META_GRAPH_URL": meta.graph_url,
            "GOOGLE_SANDBOX_ADDRESS": google.address,
        }
        for tenant_id, spec in STORES.items():
            key_ref, token_ref = f"PRV_{tenant_id.upper()}_KEY", f"PRV_{tenant_id.upper()}_TOKEN"
            env[key_ref], env[token_ref] = credentials_for(spec.account)
            add_tenant(
                conn,
                Tenant(tenant_id, spec.account, key_ref, token_ref, history_start=HISTORY_START),
            )
        conn.commit()
        instance.add_dynamic_partitions(tenants.name, list(STORES))
        with temporary_environment(env):
            for tenant_id in STORES:
                _sync(instance, tenant_id)
            person = _craft(conn, _pick_person(conn), rng)
            _refresh(instance, list(STORES))
            person.customer_keys = _customer_keys(conn, ERASED, person)
            audiences = {
                tenant_id: _pick_audience(conn, tenant_id, _customer_keys(conn, tenant_id, person))
                for tenant_id in STORES
            }
            env.update(_destinations(conn, audiences))
        with temporary_environment(env):
            _push(instance, list(STORES))
            story = Story(person, audiences)
            story.revenue["before"] = _revenue(conn)
            _snapshot(story, "before", conn, meta, google)

            dry_run = CliRunner().invoke(
                main,
                ["privacy", "erase", "--tenant", ERASED, "--email", person.email, "--dry-run"],
            )
            assert dry_run.exit_code == 0, dry_run.output
            story.dry_run_output = dry_run.output
            story.totals["dry_run"] = order_totals(conn, ERASED)
            story.holdings["dry_run"] = holdings(conn, ERASED, person.needles())
            (story.requests_after_dry_run,) = conn.execute(
                "SELECT count(*) FROM cdp.privacy_requests"
            ).fetchone()
            erased = CliRunner().invoke(
                main, ["privacy", "erase", "--tenant", ERASED, "--email", f" {person.email} "]
            )
            assert erased.exit_code == 0, erased.output
            story.request_id = conn.execute(
                "SELECT max(request_id) FROM cdp.privacy_requests WHERE tenant_id = %s",
                (ERASED,),
            ).fetchone()[0]
            story.erase_output = erased.output
            # Google processes removals later: the audiences' syncs read its verdicts, then
            # the hourly job completes the request.
            _push(instance, [ERASED])
            _run(instance, PRIVACY_REQUESTS_JOB)
            story.status_output = (
                CliRunner().invoke(main, ["privacy", "status", str(story.request_id)]).output
            )
            _snapshot(story, "erased", conn, meta, google)

            _refresh(instance, [ERASED])
            story.revenue["rebuilt"] = _revenue(conn)
            _snapshot(story, "rebuilt", conn, meta, google)

            _sync(instance, ERASED, full_refresh=True)
            _refresh(instance, [ERASED])
            _push(instance, [ERASED])
            _snapshot(story, "resynced", conn, meta, google)
        yield story


def _revenue(conn: psycopg.Connection) -> float:
    (revenue,) = conn.execute(
        "SELECT sum(revenue) FROM intermediate.int_customers__purchase_summary"
        " WHERE tenant_id = %s",
        (ERASED,),
    ).fetchone()
    return float(revenue)


def test_the_person_is_everywhere_before_the_erase(story: Story) -> None:
    """Every later absence could fail: the person was there, under several records."""
    assert len(story.person.customer_keys) >= 1
    assert story.holdings["before"]
    assert story.in_audiences["before"]
    assert any(
        p.startswith("meta") for p in on_platforms(story.platforms["before"], ERASED, story.person)
    )
    assert any(
        p.startswith("google")
        for p in on_platforms(story.platforms["before"], ERASED, story.person)
    )


def test_the_erase_stays_open_until_google_has_processed_its_removals(story: Story) -> None:
    """Google only acknowledges a removal: the request completes once its verdict is read (by
    the audiences' sync), through the hourly job, not on the acknowledgement."""
    assert f"request {story.request_id} open:" in story.erase_output, story.erase_output
    assert "await their platform's verdict" in story.erase_output
    assert "completed" not in story.erase_output


def test_a_dry_run_counts_what_the_erase_would_touch_and_changes_nothing(story: Story) -> None:
    # Their own orders, and the three other records' orders.
    orders = int(story.dry_run_output.split(" order_ids")[0].rsplit(" ", 1)[-1])
    assert orders >= 4, story.dry_run_output
    assert story.holdings["dry_run"] == story.holdings["before"]
    assert story.totals["dry_run"] == story.totals["before"]
    assert story.requests_after_dry_run == 0


def test_after_the_erase_no_table_of_the_tenant_holds_any_of_their_identifiers(
    story: Story,
) -> None:
    assert story.holdings["erased"] == []
    assert story.holdings["rebuilt"] == []


def test_the_store_keeps_its_order_totals(story: Story) -> None:
    assert story.totals["erased"] == story.totals["before"]
    assert story.revenue["rebuilt"] == pytest.approx(story.revenue["before"])


def test_they_are_gone_from_every_audience_view_and_from_meta_and_google(story: Story) -> None:
    for moment in ("erased", "rebuilt"):
        assert story.in_audiences[moment] == [], moment
        assert on_platforms(story.platforms[moment], ERASED, story.person) == [], moment


def test_the_audit_shows_each_step_completed_in_order(
    story: Story, conn: psycopg.Connection
) -> None:
    request = get_request(conn, story.request_id)
    assert request is not None
    assert (request.kind, request.given, request.status) == ("erase", "email", "completed")
    assert [step.step for step in request.steps] == list(STEPS)
    completions = [step.completed_at for step in request.steps]
    assert None not in completions and completions == sorted(completions)
    assert request.completed_at >= completions[-1]
    assert request.steps[-1].detail["members_removed"] >= 1
    for step in STEPS:
        assert step in story.status_output
    # The proof names no one: no clear identifier in the request or its steps.
    text = orjson.dumps([request.targets, [s.detail for s in request.steps]]).decode().lower()
    assert not any(needle in text for needle in story.person.needles())


def test_a_full_resync_from_the_store_does_not_bring_them_back(story: Story) -> None:
    # The store sent them again: they are in the raw documents...
    assert story.holdings["resynced"]
    # ...and in no audience, and on no platform.
    assert story.in_audiences["resynced"] == []
    assert on_platforms(story.platforms["resynced"], ERASED, story.person) == []


def test_the_purchase_summary_leaves_out_suppressed_customers_in_its_unit_tests(
    story: Story, warehouse_url: str
) -> None:
    """The SQL rule alone, on its own inputs (`dbt test`, over the relations the story built)."""
    output = run_dbt(
        warehouse_url, "test", "--select", "int_customers__purchase_summary,test_type:unit"
    )
    assert "PASS=2" in output and "ERROR=0" in output, output[-2000:]


def test_the_other_tenant_holding_the_same_person_is_untouched(story: Story) -> None:
    before = story.other_tenant["before"]
    assert before[0] >= 2 and before[1] and before[2] >= 1
    for moment in ("erased", "rebuilt", "resynced"):
        assert story.other_tenant[moment] == before, moment


# ---- suppression and consent, on the synthetic audience warehouse ---------------------------

TENANT = "consent_t"


@pytest.fixture
def synthetic() -> Iterator[str]:
    with activation_warehouse() as url:
        with psycopg.connect(url) as conn:
            add_tenant_with_customers(conn, TENANT, 30)
            set_members(conn, TENANT, range(30))
        yield url


def _sent_keys(conn: psycopg.Connection, policy: str) -> set[str]:
    return _sent_and_excluded(conn, policy)[0]


def _sent_and_excluded(conn: psycopg.Connection, policy: str) -> tuple[set[str], tuple[int, int]]:
    """The members a destination of `policy` is sent, and how many the sync reports left out
    as (suppressed, without consent)."""
    register_destination(
        conn,
        Destination(
            f"consent_{policy}",
            TENANT,
            "meta",
            "77",
            credential_refs={"access_token": "UNUSED_TOKEN"},
            consent_policy=policy,
        ),
    )
    (target,) = [
        t
        for t in destination_audiences(conn, TENANT, ("meta",))
        if t.destination.destination_id == f"consent_{policy}"
    ]
    source = audience_members(conn, target, "BR", meta_row)
    assert source.excluded is not None
    excluded = conn.execute(source.excluded, source.params).fetchone()
    return {key for key, _, _ in source.fresh()}, excluded


@pytest.mark.parametrize(
    ("policy", "consented"),
    [
        ("none", lambda opt_in: True),
        ("newsletter_opt_in", lambda opt_in: opt_in is True),
        ("not_opted_out", lambda opt_in: opt_in is not False),
    ],
)
def test_a_destination_receives_exactly_the_members_its_consent_policy_allows(
    synthetic: str, policy: str, consented
) -> None:
    with psycopg.connect(synthetic) as conn:
        choices = dict(
            conn.execute(
                "SELECT customer_key, is_newsletter_opt_in FROM marts.customers"
                " WHERE tenant_id = %s",
                (TENANT,),
            ).fetchall()
        )
        expected = {key for key, opt_in in choices.items() if consented(opt_in)}
        assert 0 < len(expected) <= len(choices)
        sent, (suppressed, without_consent) = _sent_and_excluded(conn, policy)
    assert sent == expected
    assert (suppressed, without_consent) == (0, len(choices) - len(expected))


def test_consent_policies_are_listed_per_destination(synthetic: str) -> None:
    with temporary_environment({"DATABASE_URL": synthetic}), psycopg.connect(synthetic) as conn:
        _sent_keys(conn, "none")
        changed = CliRunner().invoke(main, ["privacy", "consent", "consent_none", "not_opted_out"])
        listed = CliRunner().invoke(main, ["privacy", "consent"])
        destinations = CliRunner().invoke(main, ["destinations", "list"])
        unknown = CliRunner().invoke(main, ["privacy", "consent", "no_such_dest", "none"])
    assert changed.exit_code == 0, changed.output
    (line,) = [row for row in listed.output.splitlines() if row.startswith("consent_none")]
    assert line.split()[-1] == "not_opted_out"
    (row,) = [r for r in destinations.output.splitlines() if r.startswith("consent_none ")]
    assert row.endswith("[consent: not_opted_out]")
    assert unknown.exit_code != 0 and "no destination" in unknown.output
    # Saving the destination again (cdp destinations add) keeps its policy.
    with psycopg.connect(synthetic) as conn:
        register_destination(
            conn,
            Destination(
                "consent_none", TENANT, "meta", "77", credential_refs={"access_token": "UNUSED"}
            ),
        )
        (policy,) = conn.execute(
            "SELECT consent_policy FROM cdp.destinations WHERE destination_id = 'consent_none'"
        ).fetchone()
    assert policy == "not_opted_out"


def test_suppressed_people_are_not_sent_and_unsuppressed_ones_are_again(synthetic: str) -> None:
    runner = CliRunner()
    with temporary_environment({"DATABASE_URL": synthetic}), psycopg.connect(synthetic) as conn:
        everyone = _sent_keys(conn, "none")
        by_email = runner.invoke(
            main,
            ["privacy", "suppress", "--tenant", TENANT, "--email", "cliente.3@EXEMPLO.com.br"],
        )
        by_phone = runner.invoke(
            main, ["privacy", "suppress", "--tenant", TENANT, "--phone", "+55 11 96004-0004"]
        )
        assert by_email.exit_code == 0 and by_phone.exit_code == 0, (
            by_email.output + by_phone.output
        )
        assert _sent_and_excluded(conn, "none") == (
            everyone - {f"{TENANT}-3", f"{TENANT}-4"},
            (2, 0),
        )
        # A suppressed member without consent is counted once, as suppressed.
        opted_in = _sent_and_excluded(conn, "newsletter_opt_in")[1]
        assert opted_in[0] == 2

        lifted = runner.invoke(
            main,
            ["privacy", "unsuppress", "--tenant", TENANT, "--email", " Cliente.3@exemplo.com.br"],
        )
        assert lifted.exit_code == 0, lifted.output
        assert _sent_keys(conn, "none") == everyone - {f"{TENANT}-4"}
        kinds = conn.execute(
            "SELECT kind, given, status FROM cdp.privacy_requests WHERE tenant_id = %s"
            " ORDER BY request_id",
            (TENANT,),
        ).fetchall()
        assert kinds == [
            ("suppress", "email", "completed"),
            ("suppress", "phone", "completed"),
            ("unsuppress", "email", "completed"),
        ]
        stored = {
            h for (h,) in conn.execute("SELECT identifier_sha256 FROM cdp.privacy_suppressions")
        }
        assert stored == {sha256_hex("+5511960040004")}


def test_an_identifier_that_normalizes_to_nothing_is_refused(synthetic: str) -> None:
    with temporary_environment({"DATABASE_URL": synthetic}):
        refused = CliRunner().invoke(
            main, ["privacy", "suppress", "--tenant", TENANT, "--email", "not an address"]
        )
    assert refused.exit_code != 0
    assert "not a usable email" in refused.output
