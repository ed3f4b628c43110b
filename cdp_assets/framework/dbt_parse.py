"""The project's parse, kept between dbt commands: dbt re-reads only the files changed since
the parse it finds in its target folder (a whole parse is the larger part of a small command's
start). No Dagster here: `cdp dbt` reads it too."""

import contextlib
import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path

# The parse dbt saves in its target folder, and reads there.
PARTIAL_PARSE = "partial_parse.msgpack"
# What profiles.yml connects with, but the password.
CONNECTION_VARIABLES = ("CDP_PGHOST", "CDP_PGPORT", "CDP_PGUSER", "CDP_PGDATABASE")


def kept_parse_name(env: Mapping[str, str]) -> str:
    """The file keeping the project's parse for the database `env` connects to (its CDP_PG*
    variables): dbt discards a parse made with another profile, so processes on several
    databases (a test suite's workers) would each discard the others' parse."""
    where = "|".join(env.get(name, "") for name in CONNECTION_VARIABLES)
    return f"partial_parse-{hashlib.sha256(where.encode()).hexdigest()[:16]}.msgpack"


def seed_parse(kept_parses: Path, target_path: Path, env: Mapping[str, str]) -> None:
    """Copy the project's kept parse for the database of `env` (kept_parse_name) from
    `kept_parses` into `target_path`, if there is one: dbt re-reads only the files changed
    since."""
    kept = kept_parses / kept_parse_name(env)
    if kept.exists():
        target_path.mkdir(parents=True, exist_ok=True)
        # Another process may have pruned it since (keep_parse): dbt then parses whole.
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(kept, target_path / PARTIAL_PARSE)
