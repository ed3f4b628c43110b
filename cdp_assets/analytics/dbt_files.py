"""The dbt project's files and folders, its output, and the environment its commands connect
with: what the platform's dbt steps, the maintenance and `cdp dbt` share. No Dagster here, so
that `cdp dbt` starts dbt without importing it (dbt_project.py makes the nodes assets)."""

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
import yaml

from cdp_assets.framework.dbt_parse import PARTIAL_PARSE, kept_parse_name, seed_parse
from cdp_assets.lib import settings

DBT_PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt_project"
# The dbt installed beside this interpreter, whether or not its folder is on PATH.
DBT_EXECUTABLE = str(Path(sys.executable).parent / "dbt")
# A run's variables, a JSON object, read by macro run_var.
RUN_VARS_ENV = "CDP_DBT_RUN_VARS"
# The target writing the production schemas (profiles.yml): every dbt command of the
# platform's, whatever DBT_TARGET says. A person's default is `dev`, schemas of their own.
PRODUCTION_TARGET = "prod"

# dbt's output: each run leaves a folder of its own in target/, thousands of files over time.
DBT_OUTPUT_FOLDERS = {"target", "logs"}
# Where the platform's dbt invocations write: a folder each, named by dagster-dbt
# `<step>-<run id>-<random>`, holding its dbt.log and compiled SQL, until the nightly
# maintenance removes it (CDP_RETENTION_DBT_OUTPUT_DAYS).
# dbt's output folder: its default target-path, which the project keeps.
DBT_TARGET_DIR = DBT_PROJECT_DIR / "target"
INVOCATION_FOLDER = re.compile(r"[a-z][a-z0-9_]*-[0-9a-f]{7}-[0-9a-f]{7}")


def invocation_folders(target: Path = DBT_TARGET_DIR) -> Iterator[Path]:
    """The platform's dbt invocation folders in `target` (not production's state, a parse's
    folder, or anything a person's dbt wrote there)."""
    if target.is_dir():
        for path in target.iterdir():
            if path.is_dir() and INVOCATION_FOLDER.fullmatch(path.name):
                yield path


def project_files() -> Iterator[Path]:
    """The project's own files, without walking dbt's output folders."""
    for folder, subfolders, files in os.walk(DBT_PROJECT_DIR):
        if folder == str(DBT_PROJECT_DIR):
            subfolders[:] = [name for name in subfolders if name not in DBT_OUTPUT_FOLDERS]
        yield from (Path(folder) / name for name in files)


# The manifest the definitions load: a file of its own, replaced whole. A plain `dbt` command
# in the project (an analyst's, `cdp dbt`, a test's) rewrites target/manifest.json in place,
# and a process loading the definitions meanwhile read half of it (seen once in CI: a Celery
# worker's import failed on truncated JSON).
MANIFEST_PATH = DBT_TARGET_DIR / "dagster_manifest.json"


# Production's folder in dbt's output, which no person's dbt command writes (theirs go to
# target/): the project's own parse, which each of the platform's invocations starts from and
# leaves its own in, and production's manifest, which `cdp dbt` defers to.
PRODUCTION_STATE = DBT_TARGET_DIR / "production"
# Parses kept, the newest, one per database (kept_parse_name).
KEPT_PARSES = 8


def keep_parse(invocation_target: Path, env: Mapping[str, str]) -> None:
    """Make an invocation's parse the project's, for the database of `env` (the environment
    `dbt_connection_env` gives). dagster-dbt gives each invocation a fresh target folder and
    copies the project's parse into it, so dbt re-reads only the files that changed since, half
    the start-up of a full parse. Replaced atomically, as concurrent runs may finish together.
    Moved, not copied: the invocation's folder, kept for its log, need not keep a parse too
    (most of its size)."""
    parsed = invocation_target / PARTIAL_PARSE
    kept = PRODUCTION_STATE / kept_parse_name(env)
    kept.parent.mkdir(parents=True, exist_ok=True)
    incoming = kept.with_name(f".{kept.name}.{uuid.uuid4().hex}")
    try:
        shutil.move(parsed, incoming)
    except FileNotFoundError:  # dbt wrote none, or the folder is gone (maintenance)
        return
    os.replace(incoming, kept)
    # One database is production's; more are a test suite's, each session on new ones.
    parses = sorted(PRODUCTION_STATE.glob("partial_parse-*.msgpack"), key=modified_at)
    for stale in parses[:-KEPT_PARSES]:
        stale.unlink(missing_ok=True)


def modified_at(path: Path) -> float:
    """When `path` was last written; 0 when another process removed it meanwhile."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def refresh_production_state(env: Mapping[str, str]) -> Path:
    """Production's manifest (the project parsed with the prod target, on the database of
    `env`, the environment `dbt_connection_env` gives), in PRODUCTION_STATE: the folder to give
    dbt as `--state`, so that `--defer` reads production's relations for what a person's
    command does not build. Parsed in a folder of its own, from the platform's kept parse, and
    replaced whole. A parse that fails (dbt says why) raises CalledProcessError."""
    PRODUCTION_STATE.mkdir(parents=True, exist_ok=True)
    parsed = PRODUCTION_STATE / f".parse-{uuid.uuid4().hex}"
    parsed.mkdir()
    try:
        seed_parse(PRODUCTION_STATE, parsed, env)
        command = [DBT_EXECUTABLE, "parse", "--quiet", "--target", PRODUCTION_TARGET]
        command += ["--profiles-dir", str(DBT_PROJECT_DIR), "--target-path", str(parsed)]
        subprocess.run(command, cwd=DBT_PROJECT_DIR, env=env, check=True)
        os.replace(parsed / "manifest.json", PRODUCTION_STATE / "manifest.json")
    finally:
        shutil.rmtree(parsed, ignore_errors=True)
    return PRODUCTION_STATE


# Settings of dbt's sessions. JIT: the planner over-estimates the recursive and JSONB-heavy
# models by orders of magnitude, so JIT compiled every large query, for seconds each, for
# queries it does not speed up. work_mem: Postgres' default 4 MB spilled the identity and
# staging sorts and hashes to disk.
DBT_SESSION_SETTINGS = "-c jit=off -c work_mem=64MB"
# Read by macro audience_models: the audiences the project holds.
AUDIENCE_MODELS_ENV = "CDP_AUDIENCE_MODELS"
# Read by profiles.yml: the dev target's schema, every dev schema's prefix.
SCHEMA_PREFIX_ENV = "DBT_SCHEMA_PREFIX"


def dbt_connection_env(url: str) -> dict[str, str]:
    """What the project reads from the environment: the CDP_PG* variables `profiles.yml`
    connects with, from a `postgresql://` URL (a Unix socket directory given as `?host=` works
    too); the prefix of a person's schemas (dev target); the audience models; and the sessions'
    settings (PGOPTIONS, which libpq reads: options already in the environment come after ours
    and win)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    options = settings.value("PGOPTIONS") or ""
    if DBT_SESSION_SETTINGS not in options:  # a caller may put the result in os.environ
        options = f"{DBT_SESSION_SETTINGS} {options}".strip()
    return {
        "CDP_PGHOST": query.get("host", [parts.hostname or "localhost"])[0],
        "CDP_PGPORT": str(parts.port or 5432),
        "CDP_PGUSER": unquote(parts.username or "postgres"),
        "CDP_PGPASSWORD": unquote(parts.password or ""),
        "CDP_PGDATABASE": parts.path.lstrip("/") or "postgres",
        SCHEMA_PREFIX_ENV: person_schema_prefix(),
        AUDIENCE_MODELS_ENV: ",".join(audience_model_names()),
        "PGOPTIONS": options,
    }


def person_schema_prefix() -> str:
    """DBT_SCHEMA_PREFIX, else dev_ and the user's name as an identifier (dev_alice): the
    schemas a person's builds write (the dev target), e.g. dev_alice_marts."""
    prefix = settings.value(SCHEMA_PREFIX_ENV)
    if prefix:
        return prefix
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment nor in the password file
        user = "analyst"
    return "dev_" + re.sub(r"[^a-z0-9_]", "_", user.lower())[:36]


AUDIENCES_FOLDER = DBT_PROJECT_DIR / "models" / "audiences"
# The one model of the audiences folder that is not an audience.
AUDIENCE_CATALOG = "audience_catalog"


def audience_model_names() -> list[str]:
    """The audiences as the project's files hold them: every model of models/audiences/ but
    the catalog."""
    return sorted(p.stem for p in AUDIENCES_FOLDER.rglob("*.sql") if p.stem != AUDIENCE_CATALOG)


def manifest_audiences(manifest_path: Path) -> list[str]:
    """The audiences a manifest holds, by the same rule: MANIFEST_PATH for those of the
    definitions the platform runs, `ensure_manifest()` for those of the project on disk."""
    nodes = json.loads(manifest_path.read_text())["nodes"].values()
    return sorted(
        node["name"]
        for node in nodes
        if node["resource_type"] == "model"
        and node["fqn"][1:2] == ["audiences"]
        and node["name"] != AUDIENCE_CATALOG
    )


# dbt exposures (docs: which audience goes to which destination), generated; not in git.
EXPOSURES_PATH = DBT_PROJECT_DIR / "models" / "_destinations__exposures.yml"
EXPOSURES_HEADER = """\
# Generated by `cdp dbt exposures` and every audiences refresh from cdp.destinations and
# cdp.destination_audiences (active destinations, active audiences): do not edit.
"""
DESTINATIONS_SQL = """
SELECT d.destination_id, d.tenant_id, d.platform, d.account_id,
       array_agg(DISTINCT CASE WHEN d.platform = 'vtex_collections'
                               THEN a.params ->> 'audience' ELSE a.audience END)
  FROM cdp.destinations d
  JOIN cdp.destination_audiences a USING (destination_id)
  JOIN cdp.tenants t USING (tenant_id)
 WHERE d.active AND a.active AND t.active
 GROUP BY 1, 2, 3, 4
 ORDER BY 1
"""
# What a VTEX collection rule reads beside its audience (activation/vtex_collections/rules.py).
COLLECTION_RULE_MODELS = ("int_orders__purchases", "stg_vtex__order_items")


def refresh_exposures(conn: psycopg.Connection) -> bool:
    """Write one exposure per active destination, depending on the audiences it is sent;
    whether the file changed."""
    exposures = []
    for destination_id, tenant_id, platform, account_id, audiences in conn.execute(
        DESTINATIONS_SQL
    ):
        models = [*audiences, *(COLLECTION_RULE_MODELS if platform == "vtex_collections" else ())]
        exposures.append(
            {
                "name": destination_id,
                "label": f"{destination_id}: {platform} {account_id}".strip(),
                "type": "application",
                "maturity": "high",
                "owner": {"name": "team:marketing-ops"},
                "description": f"Tenant {tenant_id}'s {platform} destination"
                + (f", account {account_id}" if account_id else "")
                + ", which activation sends these audiences.",
                "depends_on": [f"ref('{model}')" for model in sorted(m for m in models if m)],
                "meta": {"tenant_id": tenant_id, "platform": platform, "account_id": account_id},
            }
        )
    return write_exposures(exposures)


def prune_exposures() -> bool:
    """The exposures file without what no longer exists: an audience dropped from the project
    while a destination still sends it would otherwise fail every parse."""
    if not EXPOSURES_PATH.exists():
        return False
    return write_exposures(
        (yaml.safe_load(EXPOSURES_PATH.read_text()) or {}).get("exposures") or []
    )


def write_exposures(exposures: Iterable[Mapping[str, Any]]) -> bool:
    """`exposures`, each without the models the project lacks (and gone when none is left),
    as the exposures file; whether that changed it (a change is a new parse)."""
    models = {path.stem for path in (DBT_PROJECT_DIR / "models").rglob("*.sql")}
    kept = []
    for exposure in exposures:
        refs = [ref for ref in exposure["depends_on"] if ref[len("ref('") : -2] in models]
        if any(ref[len("ref('") : -2] not in COLLECTION_RULE_MODELS for ref in refs):
            kept.append({**exposure, "depends_on": refs})
    text = EXPOSURES_HEADER + yaml.safe_dump(
        {"version": 2, "exposures": kept}, sort_keys=False, width=100
    )
    if EXPOSURES_PATH.exists() and EXPOSURES_PATH.read_text() == text:
        return False
    incoming = EXPOSURES_PATH.with_name(f".{EXPOSURES_PATH.name}.{uuid.uuid4().hex}")
    incoming.write_text(text)
    os.replace(incoming, EXPOSURES_PATH)
    return True
