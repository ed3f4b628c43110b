"""Every environment variable the platform reads: its name, default and meaning, in one place.

Code reads a setting with `value(NAME)` (or `positive_number`), never `os.environ` directly,
so an undeclared name fails at once; docs/configuration.md is generated from SETTINGS
(`python -m cdp_assets.lib.settings > docs/configuration.md`) and a test keeps the two equal.
Credentials are not settings: tenants and destinations name the variables that hold them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None
    meaning: str
    group: str
    # Set by the platform for the processes it starts (dbt, Dagster's storage), not by users.
    internal: bool = False


def _retention(name: str, days: int, what: str) -> Setting:
    return Setting(f"CDP_RETENTION_{name.upper()}_DAYS", str(days), what, "Retention (days)")


SETTINGS: tuple[Setting, ...] = (
    # Database and home
    Setting(
        "DATABASE_URL",
        None,
        "Postgres URL of the warehouse, also Dagster's storage; unset: an embedded Postgres"
        " under CDP_HOME, started on demand.",
        "Database",
    ),
    Setting(
        "CDP_HOME", "~/.cdp", "Home of the embedded Postgres and the Dagster instance.", "Database"
    ),
    Setting(
        "CDP_DB_CONNECT_TIMEOUT_SECONDS",
        "10",
        "Deadline for connecting to Postgres.",
        "Database",
    ),
    Setting(
        "CDP_DB_STATEMENT_TIMEOUT_SECONDS",
        "1800",
        "Longest a statement of the platform may run before Postgres cancels it.",
        "Database",
    ),
    Setting(
        "PGOPTIONS",
        None,
        "libpq options; those set here come after the platform's own for dbt's connections.",
        "Database",
    ),
    # Dagster
    Setting(
        "DAGSTER_HOME",
        None,
        "Dagster instance folder; unset: $CDP_HOME/dagster, with the platform's dagster.yaml.",
        "Dagster",
    ),
    Setting(
        "CDP_DAGSTER_PG_URL",
        None,
        "Dagster's storage URL (psycopg2 driver), derived from DATABASE_URL for dagster.yaml.",
        "Dagster",
        internal=True,
    ),
    Setting(
        "DAGSTER_EVENT_BATCH_SIZE",
        "1000",
        "Dagster's own: events written per batch; the platform's event log sets it when unset.",
        "Dagster",
    ),
    Setting(
        "CDP_EXECUTOR",
        "multiprocess",
        "How a run executes its steps: multiprocess (in the run worker) or celery.",
        "Dagster",
    ),
    Setting("CDP_CELERY_BROKER", None, "Celery broker URL, with CDP_EXECUTOR=celery.", "Dagster"),
    Setting(
        "CDP_CELERY_BACKEND",
        None,
        "Celery result backend URL, with CDP_EXECUTOR=celery.",
        "Dagster",
    ),
    Setting(
        "CDP_STEP_STOP_GRACE_SECONDS",
        "30",
        "How long a step asked to stop (a run canceled or past its limit) gets before it is"
        " killed.",
        "Dagster",
    ),
    # Sources and destinations
    Setting(
        "VTEX_BASE_URL_TEMPLATE",
        "https://{account}.{environment}.com.br",
        "VTEX API origin per account ({account}, {environment}).",
        "VTEX",
    ),
    Setting(
        "VTEX_REQUESTS_PER_SECOND",
        "80",
        "Requests per second per VTEX account, shared by every run of the account.",
        "VTEX",
    ),
    Setting(
        "VTEX_COLLECTION_WRITES_PER_SECOND",
        "2",
        "Catalog collection writes per second (VTEX deadlocks on faster writes).",
        "VTEX",
    ),
    Setting(
        "REQUESTS_CA_BUNDLE",
        None,
        "CA bundle for HTTPS to VTEX (requests' own variable; CURL_CA_BUNDLE also read).",
        "VTEX",
    ),
    Setting("CURL_CA_BUNDLE", None, "CA bundle, when REQUESTS_CA_BUNDLE is not set.", "VTEX"),
    Setting(
        "META_GRAPH_URL",
        None,
        "Meta Graph API origin and version; unset: the SDK's (graph.facebook.com).",
        "Destinations",
    ),
    Setting(
        "GOOGLE_SANDBOX_ADDRESS",
        None,
        "host:port of a loopback Google API server (plaintext gRPC) instead of Google's.",
        "Destinations",
    ),
    # Analytics
    Setting(
        "CDP_AS_OF",
        None,
        "Day (YYYY-MM-DD) the analytics take as today; unset: the refresh's start.",
        "Analytics",
    ),
    Setting(
        "DBT_SCHEMA_PREFIX",
        None,
        "Prefix of an analyst's own dbt schemas; unset: dev_<user> for dbt run by hand.",
        "Analytics",
    ),
    Setting(
        "DBT_WRITE_JSON",
        "false",
        "dbt's own: write run_results.json and the manifest from the platform's runs.",
        "Analytics",
    ),
    Setting(
        "DBT_LOG_LEVEL_FILE",
        "info",
        "dbt's own: the level of the dbt.log the platform's runs leave (`debug` adds every"
        " query and connection event).",
        "Analytics",
    ),
    # Operations
    Setting(
        "CDP_ALERT_WEBHOOK_URL",
        None,
        "Where failed runs and metric crossings are posted (JSON); unset: no alerts.",
        "Operations",
    ),
    Setting(
        "CDP_UI_URL",
        None,
        "The Dagster UI's address, for links in alerts; `cdp dev` sets its own.",
        "Operations",
    ),
    Setting(
        "CDP_OPS_THRESHOLDS",
        None,
        "JSON overriding the operations metrics' alert thresholds.",
        "Operations",
    ),
    Setting(
        "CDP_HEARTBEAT_TOLERANCE_SECONDS",
        "120",
        "How old the daemon's heartbeat may be before the health check fails.",
        "Operations",
    ),
    _retention("rejects", 180, "Quarantined records (`raw_vtex.rejects`), by last seen."),
    _retention(
        "unreadable_orders",
        180,
        "Orders VTEX listed but would not serve (`raw_vtex.unreadable_orders`), by last attempt.",
    ),
    _retention(
        "orders_to_reread",
        180,
        "Orders the feed could not read (`raw_vtex.orders_to_reread`), by last failure.",
    ),
    _retention(
        "activation_runs",
        365,
        "Sync history (`cdp.activation_runs`, with its rejects), by end; each destination"
        " audience's latest synced run is kept.",
    ),
    _retention("activation_rejects", 90, "Members a platform refused (`cdp.activation_rejects`)."),
    _retention(
        "destination_requests",
        90,
        "Platform requests with their verdict (`cdp.destination_requests`), by settlement; one"
        " still awaiting its verdict is kept.",
    ),
    _retention("sync_errors", 180, "Failed runs (`cdp.sync_errors`), by occurrence."),
    _retention(
        "metric_states",
        90,
        "Operations metric states (`cdp.ops_metric_states`), by last evaluation.",
    ),
    _retention(
        "dagster_runs",
        90,
        "Finished Dagster runs that materialized nothing, with their event logs.",
    ),
    _retention(
        "dbt_output",
        7,
        "The folders the platform's dbt commands leave in `dbt_project/target/` (each one's"
        " `dbt.log` and compiled SQL), by the folder's last change (a command's end).",
    ),
    # Set for the processes the platform starts
    Setting(
        "CDP_DBT_RUN_VARS", None, "The refresh's dbt variables, for its dbt process.", "dbt", True
    ),
    Setting(
        "CDP_AUDIENCE_MODELS", None, "The audience models, for dbt's audience macros.", "dbt", True
    ),
    *(
        Setting(f"CDP_PG{part}", None, f"dbt's connection {part.lower()}.", "dbt", True)
        for part in ("HOST", "PORT", "USER", "PASSWORD", "DATABASE")
    ),
)
BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


class SettingError(ValueError):
    """A setting that is not declared, or whose value is not of its kind."""


def declared(name: str) -> Setting:
    try:
        return BY_NAME[name]
    except KeyError:
        raise SettingError(
            f"{name} is not a declared setting (cdp_assets/lib/settings.py)"
        ) from None


def value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The setting's value in `environ` (the process's by default), else its default; blank
    counts as unset."""
    setting = declared(name)
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    return raw or setting.default


def required(name: str, environ: Mapping[str, str] | None = None) -> str:
    """A setting that has a default, so always a value."""
    text = value(name, environ)
    if text is None:
        raise SettingError(f"{name} is not set")
    return text


def positive_number(name: str, environ: Mapping[str, str] | None = None) -> float:
    """A setting that is a positive number (seconds, a rate)."""
    raw = value(name, environ)
    try:
        seconds = float(raw) if raw is not None else math.nan
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise SettingError(f"{name}={raw!r}: expected a positive number")
    return seconds


def configuration_markdown() -> str:
    """docs/configuration.md: one table per group, the platform's own variables last."""
    lines = [
        "# Configuration",
        "",
        "Every environment variable the platform reads, generated from"
        " `cdp_assets/lib/settings.py` (`python -m cdp_assets.lib.settings >"
        " docs/configuration.md`). Credentials are not listed: tenants and destinations name"
        " the variables holding theirs (`cdp tenants add`, `cdp destinations add`).",
    ]
    groups: dict[tuple[bool, str], list[Setting]] = {}
    for setting in SETTINGS:
        groups.setdefault((setting.internal, setting.group), []).append(setting)
    for (internal, group), settings in sorted(groups.items(), key=lambda item: item[0][0]):
        title = "Set by the platform for the processes it starts" if internal else group
        lines += ["", f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for setting in settings:
            default = f"`{setting.default}`" if setting.default is not None else ""
            lines.append(f"| `{setting.name}` | {default} | {setting.meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(configuration_markdown(), end="")
