"""The Dagster instance folder, with its storage in the same Postgres as the warehouse."""

import os
import shutil
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from cdp_assets.lib import settings
from cdp_assets.lib.database import cdp_home, sqlalchemy_url

if TYPE_CHECKING:
    import dagster as dg


def prepare_dagster_home(warehouse_url: str) -> Path:
    """Point this process (and its children) at the instance folder, creating it if needed.

    A `DAGSTER_HOME` set by the user keeps its own `dagster.yaml` when it has one.
    """
    home = Path(settings.value("DAGSTER_HOME") or cdp_home() / "dagster")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if "DAGSTER_HOME" not in os.environ or not config.exists():
        template = files("cdp_assets.lib") / "dagster.yaml"
        with template.open("rb") as source, open(config, "wb") as target:
            shutil.copyfileobj(source, target)
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ["CDP_DAGSTER_PG_URL"] = sqlalchemy_url(warehouse_url)
    return home


# dbt runs one at a time. Two builds at once are safe (their own rows of the shared tables,
# indexes looked up before they lock, views replaced under names of their own), but a run's
# cost follows its models and tests far more than its tenants: two runs on the same cores each
# take about as long as one run for both, so a single run for every due tenant finishes first.
# API pools are per account in spirit, and the instance's default limit covers them.
DBT_POOL = "dbt"
VTEX_API_POOL = "vtex_api"
META_API_POOL = "meta_api"
GOOGLE_API_POOL = "google_api"
POOL_LIMITS = {DBT_POOL: 1}
DEFAULT_LIMIT_POOLS = (VTEX_API_POOL, META_API_POOL, GOOGLE_API_POOL)


def apply_pool_limits(instance: "dg.DagsterInstance") -> None:
    """Create the platform's pools on an instance, with their limits; safe to repeat.

    dbt's limit is the platform's (its runs share views); an API pool takes the instance's
    default unless an operator set its limit (see `dagster_storage`'s upsert)."""
    for pool, limit in POOL_LIMITS.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
    for pool in DEFAULT_LIMIT_POOLS:
        instance.event_log_storage.initialize_concurrency_limit_to_default(pool)
