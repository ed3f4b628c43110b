"""An analyst's dbt, as a person runs it: builds of their own that never touch production,
deferral to production, concurrent builds, the analyst guide's add-an-audience recipe followed to
the Meta sandbox, an audience view no model declares never pushed, source freshness, and
plain dbt without the platform's connection."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from support import months_ago, register, sync

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.activation.push_requests import changed_audiences
from cdp_assets.analytics.assets import (
    AS_OF_ENV,
    as_of_day,
    customer_predictions,
    dbt_audiences,
    dbt_tenant_models,
    dbt_tenant_scoring,
    dbt_vars,
)
from cdp_assets.analytics.dbt_files import DBT_PROJECT_DIR, SCHEMA_PREFIX_ENV, person_schema_prefix
from cdp_assets.analytics.dbt_project import dbt_resource, ensure_manifest
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.freshness import FRESHNESS
from cdp_devkit.sandbox import MetaSandbox, SandboxProcess, StoreSpec

REPOSITORY = DBT_PROJECT_DIR.parent
CDP = str(Path(sys.executable).parent / "cdp")
TENANT = "acme"
STORE = StoreSpec(
    account="acmeanalyst",
    seed=17,
    customers=500,
    orders=2000,
    products=40,
    history_start=months_ago(35),  # its first months older than VTEX serves: unavailable
)
# A past day a person builds as of, with months of synced orders before it.
PAST_DAY = months_ago(18)
META_TOKEN_REF, META_TOKEN, META_ACCOUNT = "ACME_META_TOKEN", "acme-meta-token", "1234567890"
# What a build may never change: the platform's schemas.
PRODUCTION_SCHEMAS = (
    "staging",
    "intermediate",
    "marts",
    "audiences",
    "analytics_python",
    "raw_vtex",
    "cdp",
)
# The models a person rebuilds for one tenant (the purchase summary's delete-and-append).
TENANT_TABLES = ("intermediate.int_customers__purchase_summary", "marts.customers")
# The target that writes the production schemas.
PRODUCTION_TARGET = ("--target", "prod")


def cdp(
    *args: str, env: dict[str, str], cwd: Path = REPOSITORY, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """A `cdp` command as a person types it; its completed process (output in stdout)."""
    return subprocess.run(
        [CDP, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def person(warehouse_url: str, prefix: str) -> dict[str, str]:
    """A person's environment: the platform's database, schemas of their own."""
    return {**os.environ, "DATABASE_URL": warehouse_url, "DBT_SCHEMA_PREFIX": prefix}


@pytest.fixture(scope="module")
def production(warehouse_url, instance):
    """One tenant ingested and analysed by the platform's own assets, audiences refreshed,
    and a Meta destination of it, as the analyst guide's examples name them."""
    resources = {"dbt": dbt_resource(), "warehouse": WarehouseResource()}
    with (
        temporary_environment({AS_OF_ENV: as_of_day()}),
        SandboxProcess([STORE]) as sandbox,
        psycopg.connect(warehouse_url) as conn,
    ):
        register(conn, TENANT, STORE.account, history_start=STORE.history_start)
        sync(instance, sandbox, TENANT)
        dg.materialize(
            [dbt_tenant_models, customer_predictions, dbt_tenant_scoring],
            partition_key=TENANT,
            instance=instance,
            resources=resources,
        )
        dg.materialize(
            [dbt_audiences], partition_key=TENANT, instance=instance, resources=resources
        )
        os.environ[META_TOKEN_REF] = META_TOKEN
        add_destination(
            conn,
            Destination(
                f"{TENANT}_meta",
                TENANT,
                "meta",
                META_ACCOUNT,
                credential_refs={"access_token": META_TOKEN_REF},
                min_audience_size=1,
            ),
        )
        conn.commit()
    return warehouse_url


def relations(conn: psycopg.Connection, schemas: tuple[str, ...]) -> list[str]:
    rows = conn.execute(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'v', 'm', 'p') ORDER BY 1",
        (list(schemas),),
    )
    return [name for (name,) in rows]


def fingerprints(conn: psycopg.Connection, names: list[str]) -> dict[str, tuple[int, str]]:
    """Each relation's row count and a digest of its rows, in any order."""
    return {
        name: conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(md5(r::text), '' ORDER BY md5(r::text)),"
            f" '')) FROM {name} r"
        ).fetchone()
        for name in names
    }


def production_fingerprints(conn: psycopg.Connection) -> dict[str, tuple[int, str]]:
    return fingerprints(conn, relations(conn, PRODUCTION_SCHEMAS))


def test_a_persons_build_as_of_a_past_day_leaves_production_as_it_was(production, conn):
    before = production_fingerprints(conn)
    conn.commit()
    built = cdp(
        "dbt",
        "build",
        "--vars",
        json.dumps({"tenant_id": TENANT, "as_of": PAST_DAY.isoformat()}),
        env=person(production, "dev_alice"),
    )
    assert built.returncode == 0, built.stdout[-3000:]
    assert production_fingerprints(conn) == before
    # The build went to the person's own schemas, as of that day.
    (customers, as_of) = conn.execute(
        "SELECT count(*), min(as_of) FROM dev_alice_intermediate.int_customers__purchase_summary"
    ).fetchone()
    assert customers > 0 and as_of == PAST_DAY
    assert conn.execute("SELECT count(*) FROM dev_alice_audiences.audience_catalog").fetchone()[0]
    # Production's predictions are as of today: the mismatch is flagged, not silently mixed.
    assert re.search(r"WARN \d+ predictions_as_of_their_summary_churn_risk", built.stdout), (
        built.stdout[-3000:]
    )


def test_defer_builds_one_model_in_dev_on_top_of_production(production, conn):
    before = production_fingerprints(conn)
    conn.commit()
    built = cdp(
        "dbt",
        "build",
        "-s",
        "rfm_segments",
        "--defer",
        "--vars",
        json.dumps({"tenant_id": TENANT}),
        env=person(production, "dev_bob"),
    )
    assert built.returncode == 0, built.stdout[-3000:]
    assert production_fingerprints(conn) == before
    # Built from production's purchase summary, nothing upstream of it in dev.
    assert relations(conn, ("dev_bob_marts", "dev_bob_intermediate", "dev_bob_staging")) == [
        "dev_bob_marts.rfm_segments"
    ]
    segments = "SELECT * FROM {} WHERE tenant_id = %s".format
    dev = conn.execute(segments("dev_bob_marts.rfm_segments"), (TENANT,)).fetchall()
    assert dev and sorted(dev) == sorted(
        conn.execute(segments("marts.rfm_segments"), (TENANT,)).fetchall()
    )


def _waiting_on_locks(conn: psycopg.Connection) -> int:
    (waiting,) = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ).fetchone()
    return waiting


def test_two_builds_of_one_tenant_at_once_neither_duplicate_nor_differ(production, conn, tmp_path):
    """The purchase summary and `customers` are a tenant's delete-and-append: two builds
    meeting there (here held until both wait at the summary, then let go together) must leave
    what one build leaves."""
    env = person(production, "dev_carol")
    command = ("dbt", "run", "-s", "int_customers__purchase_summary", "customers")
    command += (*PRODUCTION_TARGET, "--vars", json.dumps({"tenant_id": TENANT}))
    single = cdp(*command, "--target-path", str(tmp_path / "single"), env=env)
    assert single.returncode == 0, single.stdout[-3000:]
    once = fingerprints(conn, list(TENANT_TABLES))
    conn.commit()

    # The watcher outside any transaction: one would see a single snapshot of the sessions.
    with (
        psycopg.connect(production, autocommit=True) as holder,
        psycopg.connect(production, autocommit=True) as watcher,
    ):
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {TENANT_TABLES[0]} IN SHARE MODE")
        builds = [
            subprocess.Popen(
                [CDP, *command, "--target-path", str(tmp_path / name)],
                env=env,
                cwd=REPOSITORY,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name in ("first", "second")
        ]
        try:
            deadline = time.monotonic() + 180
            while _waiting_on_locks(watcher) < 2:
                assert time.monotonic() < deadline, "the builds never reached the summary"
                assert all(b.poll() is None for b in builds), "a build ended before the summary"
                time.sleep(0.2)
        finally:
            holder.execute("COMMIT")
            try:
                outputs = [b.communicate(timeout=300)[0] for b in builds]
            finally:
                for build in builds:
                    if build.poll() is None:
                        build.kill()
    assert [b.returncode for b in builds] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    for table in TENANT_TABLES:
        (rows, keys) = conn.execute(
            f"SELECT count(*), count(DISTINCT (tenant_id, customer_key)) FROM {table}"
        ).fetchone()
        assert rows == keys, table
    assert fingerprints(conn, list(TENANT_TABLES)) == once


def _recipe(readme: str) -> list[tuple[str, str, str]]:
    """The analyst guide's add-an-audience recipe: (language, path named before it, code) per
    block."""
    section = readme.split("### Add an audience", 1)[1].split("\n### ", 1)[0]
    blocks = re.finditer(
        r"(?P<before>[^\n]*)\n+```(?P<language>\w+)\n(?P<code>.*?)```", section, re.S
    )
    steps = []
    for block in blocks:
        named = re.findall(r"`(dbt_project/[^`]+)`", block["before"])
        steps.append((block["language"], named[-1] if named else "", block["code"]))
    return steps


def _copy_of_the_repository(destination: Path) -> Path:
    """The package and the dbt project (without dbt's output), and the virtualenv beside."""
    shutil.copytree(REPOSITORY / "cdp_assets", destination / "cdp_assets")
    shutil.copytree(
        DBT_PROJECT_DIR,
        destination / "dbt_project",
        ignore=shutil.ignore_patterns("target", "logs", "__pycache__"),
    )
    (destination / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return destination


PLATFORM_RUN = textwrap.dedent(
    """
    import json, sys
    import dagster as dg
    from cdp_assets.analytics.assets import dbt_audiences
    from cdp_assets.analytics.dbt_project import (
        dbt_project, dbt_resource, ensure_manifest, translator
    )
    from cdp_assets.definitions import defs
    from cdp_assets.lib.warehouse import WarehouseResource
    from cdp_assets.activation.meta.assets import meta_custom_audiences
    from cdp_assets.activation.meta.resources import MetaResource

    audience = dg.AssetKey(sys.argv[1])
    listed = audience in defs.resolve_asset_graph().get_all_asset_keys()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("tenants", [sys.argv[2]])
        dbt = {"dbt": dbt_resource()}
        built = dg.materialize(
            [dbt_audiences], partition_key=sys.argv[2], instance=instance, resources=dbt
        )
        pushed = dg.materialize(
            [meta_custom_audiences],
            partition_key=sys.argv[2],
            instance=instance,
            resources={"warehouse": WarehouseResource(), "meta": MetaResource()},
        )
    # The job wrote the destinations into the project: the audience's asset names them.
    manifest = json.loads(ensure_manifest().read_text())
    spec = translator.get_asset_spec(manifest, f"model.cdp.{sys.argv[1]}", dbt_project)
    print(json.dumps({"listed": listed, "built": built.success, "pushed": pushed.success,
                      "destinations": spec.metadata.get("destinations")}))
    """
)


def test_the_analyst_guides_recipe_adds_an_audience_dagster_lists_and_activation_pushes(
    production, conn, tmp_path
):
    steps = _recipe((REPOSITORY / "docs" / "analyst.md").read_text())
    assert [language for language, _, _ in steps] == ["sql", "yaml", "bash"]
    copy = _copy_of_the_repository(tmp_path / "repository")
    (_, model_path, model), (_, properties_path, properties), (_, _, commands) = steps
    audience = Path(model_path).stem
    (copy / model_path).write_text(model)
    with (copy / properties_path).open("a") as yaml_file:
        yaml_file.write(properties)
    env = {**person(production, "dev_dana"), "PYTHONPATH": str(copy)}
    for line in commands.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            done = subprocess.run(
                line, shell=True, cwd=copy, env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
    # Built in the person's schemas, on production's marts.
    assert conn.execute(f"SELECT count(*) FROM dev_dana_audiences.{audience}").fetchone()[0] > 0

    with MetaSandbox({META_TOKEN: [META_ACCOUNT]}) as meta:
        run = subprocess.run(
            [sys.executable, "-c", PLATFORM_RUN, audience, TENANT],
            cwd=copy,
            env={**env, "META_GRAPH_URL": meta.graph_url, META_TOKEN_REF: META_TOKEN},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.splitlines()[-1]) == {
            "listed": True,
            "built": True,
            "pushed": True,
            "destinations": f"{TENANT}_meta: meta {META_ACCOUNT}",
        }
        (pushed,) = [
            a for a in meta.audiences(META_ACCOUNT) if a["name"] == f"{TENANT}: {audience}"
        ]
        members = {row["EXTERN_ID"] for row in meta.members(pushed["id"])}
    (expected,) = conn.execute(
        f"SELECT count(*) FROM audiences.{audience} a JOIN marts.customers c"
        " USING (tenant_id, customer_key)"
        " WHERE a.tenant_id = %s AND (c.email IS NOT NULL OR c.phone_e164 IS NOT NULL)",
        (TENANT,),
    ).fetchone()
    assert expected > 0 and len(members) == expected
    # The audiences job wrote the destinations into the project as dbt exposures.
    exposures = copy / "dbt_project" / "models" / "_destinations__exposures.yml"
    assert f"name: {TENANT}_meta" in exposures.read_text()
    assert f"ref('{audience}')" in exposures.read_text()
    exposures.unlink()
    written = cdp("dbt", "exposures", env=env, cwd=copy)
    assert written.stdout.strip() == "exposures written", written.stderr[-2000:]
    assert f"ref('{audience}')" in exposures.read_text()


def test_source_freshness_reports_the_vtex_sources_on_the_platforms_thresholds(production):
    checked = cdp("dbt", "source", "freshness", env=person(production, "dev_erin"))
    assert checked.returncode == 0, checked.stdout[-3000:]
    for table in ("orders", "products", "skus", "customers"):
        assert re.search(rf"PASS freshness of raw_vtex\.{table}\b", checked.stdout), table
    sources = json.loads(ensure_manifest().read_text())["sources"]
    hours = {
        source["name"]: source["freshness"]["error_after"]["count"]
        for source in sources.values()
        if source["source_name"] == "raw_vtex"
    }
    assert hours == {
        table: FRESHNESS[f"vtex_{table}"].total_seconds() / 3600
        for table in ("orders", "products", "skus", "customers")
    }


def test_plain_dbt_without_the_platforms_connection_says_what_to_run_instead(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDP_PG", "DBT_"))}
    checked = subprocess.run(
        [str(Path(sys.executable).parent / "dbt"), "debug", "--profiles-dir", "."],
        cwd=DBT_PROJECT_DIR,
        env={**env, "DBT_TARGET_PATH": str(tmp_path), "DBT_LOG_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode != 0
    assert "cdp dbt" in checked.stdout, checked.stdout[-2000:]


def test_a_refreshs_steps_share_the_day_its_run_started():
    """A refresh starting before midnight (UTC) builds its marts, fits and scores as of that
    day, even when a later step runs after midnight."""
    started = datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)
    with temporary_environment({AS_OF_ENV: ""}):
        assert json.loads(dbt_vars([TENANT], started))["as_of"] == "2026-03-01"


def test_an_audience_view_no_model_of_production_declares_is_never_pushed(
    production, conn, instance
):
    """A view dbt built for a model production does not have (a branch's, built with
    `--target prod`, or an audience since dropped from the project) lingers in the audiences
    schema: activation pushes none of it, and its run says why."""
    branch = "audience_from_a_branch"
    conn.execute(
        f"CREATE MATERIALIZED VIEW audiences.{branch} AS"
        " SELECT tenant_id, customer_key FROM marts.customers"
    )
    conn.execute(f"COMMENT ON MATERIALIZED VIEW audiences.{branch} IS 'dbt_sql_md5:{'0' * 32}'")
    destination = Destination(
        f"{TENANT}_branch_meta",
        TENANT,
        "meta",
        META_ACCOUNT,
        credential_refs={"access_token": META_TOKEN_REF},
        min_audience_size=1,
    )
    add_destination(conn, destination)
    add_audience(conn, destination.destination_id, branch)
    conn.commit()
    assert not any(
        signature.startswith(f"{branch}=")
        for signature in changed_audiences(conn).get(TENANT, {}).get("meta", ())
    )
    with MetaSandbox({META_TOKEN: [META_ACCOUNT]}) as meta:
        pushed = dg.materialize(
            [meta_custom_audiences],
            partition_key=TENANT,
            instance=instance,
            resources={
                "warehouse": WarehouseResource(),
                "meta": MetaResource(graph_url=meta.graph_url, retry_base_seconds=0.01),
            },
            run_config={
                "ops": {
                    "meta_custom_audiences": {
                        "config": {"destinations": [destination.destination_id]}
                    }
                }
            },
            raise_on_error=False,
        )
        assert not meta.audiences(META_ACCOUNT)
    assert not pushed.success
    (failure,) = [e for e in pushed.all_events if e.is_step_failure]
    assert f"audiences.{branch}" in failure.step_failure_data.error.message


def test_a_persons_schemas_are_named_after_them_unless_they_choose(monkeypatch):
    monkeypatch.delenv(SCHEMA_PREFIX_ENV, raising=False)
    monkeypatch.setenv("LOGNAME", "Alice.Smith")  # the first name getpass reads
    assert person_schema_prefix() == "dev_alice_smith"
    monkeypatch.setenv(SCHEMA_PREFIX_ENV, "ci_1234")
    assert person_schema_prefix() == "ci_1234"
