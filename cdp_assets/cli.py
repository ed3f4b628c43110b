"""`cdp`: open the Dagster UI, manage tenants, destinations and privacy requests, check status;
the development kit adds the demo, the sandboxes, the benchmark and the reliability suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from contextlib import AbstractContextManager, ExitStack
from datetime import date
from importlib import import_module, metadata
from pathlib import Path

import click
import psycopg

from cdp_assets.lib import settings
from cdp_assets.lib.database import DatabaseUrlError
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.lib.redaction import redact
from cdp_assets.tenants.registry import (
    Tenant,
    TenantError,
    add_tenant,
    default_history_start,
    get_tenant,
    list_tenants,
    set_active,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# platformdirs warns about XDG_RUNTIME_DIR on servers: not actionable by a user of the CLI.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


# Command groups imported only when they run (or `--help` lists them): they import Dagster,
# which `cdp dbt` and `cdp status` do without (seconds of a command's start).
LAZY_GROUPS = {
    "destinations": "cdp_assets.activation.cli:destinations",
    "privacy": "cdp_assets.privacy.cli:privacy",
}


class _Cli(click.Group):
    """The common mistakes of a deployment end in one line naming the cause and the fix, not a
    traceback: a database that cannot be reached, a malformed DATABASE_URL. The groups of
    LAZY_GROUPS are imported when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_GROUPS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_GROUPS and cmd_name not in self.commands:
            module, name = LAZY_GROUPS[cmd_name].split(":")
            self.add_command(getattr(import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except DatabaseUrlError as error:
            raise click.ClickException(str(error)) from None
        except Exception as error:
            if not _unreachable_database(error):
                raise
            cause = redact(" ".join(str(error).split()))[:300]
            raise click.ClickException(
                f"cannot reach the database ({cause}); check DATABASE_URL, or unset it for the"
                " embedded server"
            ) from None


def _unreachable_database(error: BaseException) -> bool:
    """psycopg's connection failures, and SQLAlchemy's around psycopg2's (Dagster's storage)."""
    if isinstance(error, psycopg.OperationalError):
        return True
    import sqlalchemy.exc

    return isinstance(error, sqlalchemy.exc.OperationalError)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Customer data platform for VTEX stores on Dagster, dbt and Postgres.

    The database is DATABASE_URL, or an embedded PostgreSQL under CDP_HOME (default ~/.cdp).
    """


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def maintenance(dry_run: bool) -> None:
    """Delete the records past their retention and refresh the planner's statistics, as the
    nightly maintenance job does."""
    from cdp_assets.ops.maintenance import report_maintenance

    report_maintenance(dry_run)


@main.command()
def migrate() -> None:
    """Apply pending database migrations."""
    url = migrated_url()
    click.echo(f"database schema is up to date ({url.split('@')[-1]})")


@main.command()
def pools() -> None:
    """Create the platform's pools on the Dagster instance of DAGSTER_HOME (default
    $CDP_HOME/dagster), with their limits (dbt one at a time, the API pools at the instance's
    default unless an operator set theirs). Safe to repeat."""
    from cdp_assets.lib.dagster_home import DEFAULT_LIMIT_POOLS, POOL_LIMITS, apply_pool_limits
    from cdp_assets.ops.status import platform_instance

    with platform_instance(migrated_url()) as instance:
        apply_pool_limits(instance)
        for pool in [*POOL_LIMITS, *DEFAULT_LIMIT_POOLS]:
            limit = instance.event_log_storage.get_concurrency_info(pool).slot_count
            click.echo(f"pool {pool}: {limit} at once")


@main.command()
@click.option(
    "--check",
    is_flag=True,
    help="Exit 1 when anything is unhealthy: an active tenant's asset stale, never"
    " materialized or failed after its last success, a metric past its alert threshold, the"
    " daemon silent, a schedule or sensor not ticking, the operations metrics stale. The same"
    " verdict as `cdp health`'s endpoint.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--tenant", "tenant_ids", multiple=True, metavar="TENANT", help="Only this tenant (repeatable)."
)
@click.option(
    "--all",
    "every_row",
    is_flag=True,
    help="Every tenant's row even when there are many (over 20 tenants the text output is a"
    " summary: counts by state and the tenants with the most problems).",
)
@click.pass_context
def status(
    ctx: click.Context, check: bool, as_json: bool, tenant_ids: tuple[str, ...], every_row: bool
) -> None:
    """Per active tenant and asset: last success, staleness, last error; the run queue, the
    operations metrics and the platform's health (daemon, schedules, sensors)."""
    import json
    from contextlib import nullcontext

    from cdp_assets.ops.status import collect_status, platform_instance, render_text, status_json

    url = migrated_url()
    # Tests pass their instance as `obj`; otherwise the one the UI uses, from DAGSTER_HOME.
    given = (ctx.obj or {}).get("dagster_instance")
    with (
        nullcontext(given) if given else platform_instance(url) as instance,
        psycopg.connect(url) as conn,
    ):
        try:
            result = collect_status(instance, conn, tenant_ids=tenant_ids)
        except TenantError as error:
            raise click.BadParameter(str(error), param_hint="--tenant") from None
    text = render_text(result, full=True if every_row else None)
    click.echo(json.dumps(status_json(result), indent=2) if as_json else text)
    if check and not result.healthy:
        ctx.exit(1)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=3001, show_default=True)
def health(host: str, port: int) -> None:
    """Serve the HTTP health endpoint for uptime probes: GET /health answers 200 when the
    platform is healthy and 503 with the reasons as JSON otherwise (`cdp status --check`'s
    verdict: Postgres reachable, daemon heartbeats fresh, schedules and sensors ticking, no
    metric past its alert threshold, every active tenant's assets fresh)."""
    from cdp_assets.ops.health_server import serve

    url = migrated_url()
    click.echo(f"health endpoint on http://{host}:{port}/health")
    serve(url, host, port)


@main.command()
@click.option("--port", default=3000, show_default=True, help="Dagster webserver port.")
@click.option(
    "--health-port",
    default=3001,
    show_default=True,
    help="Port of the HTTP health endpoint (`cdp health`).",
)
@click.option(
    "--sandbox/--no-sandbox",
    default=None,
    help="Also serve the demo stores and the Meta and Google sandboxes on loopback, and point"
    " the demo tenants and destinations at them (the development kit's; on by default when it"
    " is installed).",
)
def dev(port: int, health_port: int, sandbox: bool | None) -> None:
    """Open the Dagster UI (webserver + daemon) on the platform's Postgres, with the health
    endpoint beside it. Safe to start again and again on the same home."""
    import dagster as dg

    from cdp_assets.lib.dagster_home import apply_pool_limits, prepare_dagster_home
    from cdp_assets.ops.webhook import UI_URL_ENV

    url = migrated_url()
    home = prepare_dagster_home(url)
    with dg.DagsterInstance.get() as instance:
        apply_pool_limits(instance)
    click.echo(f"DAGSTER_HOME={home}")
    # Alerts link to runs in this UI unless a deployment says where its UI is.
    os.environ.setdefault(UI_URL_ENV, f"http://127.0.0.1:{port}")
    if sandbox is None:
        sandbox = _dev_sandbox_hook() is not None
    with ExitStack() as stack:
        try:
            if sandbox:
                stack.enter_context(_dev_sandboxes(url))
            workspace = str(PROJECT_ROOT / "workspace.yaml")
            bin_dir = Path(sys.executable).parent
            processes: list[subprocess.Popen[bytes]] = []
            # Stopped before the sandboxes they were pointed at.
            stack.callback(_interrupt_and_wait, processes)
            for command in (
                [
                    str(bin_dir / "dagster-webserver"),
                    "-w",
                    workspace,
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                ],
                [str(bin_dir / "dagster-daemon"), "run", "-w", workspace],
                [str(bin_dir / "cdp"), "health", "--port", str(health_port)],
            ):
                processes.append(subprocess.Popen(command, cwd=PROJECT_ROOT))
            click.echo(
                f"Dagster UI on http://127.0.0.1:{port}, health on"
                f" http://127.0.0.1:{health_port}/health (Ctrl-C stops everything)"
            )
            while all(p.poll() is None for p in processes):
                time.sleep(1)
        except KeyboardInterrupt:
            pass


def _interrupt_and_wait(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ctrl-C to each process still running, then each one's end awaited."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        process.wait(timeout=30)


@main.group()
def tenants() -> None:
    """List, add, activate and deactivate tenants (rows of cdp.tenants)."""


def _connect() -> psycopg.Connection:
    return psycopg.connect(migrated_url())


@tenants.command("list")
def tenants_list() -> None:
    """Show every tenant."""
    with _connect() as conn:
        rows = list_tenants(conn)
    click.echo(f"{'tenant':<20}{'account':<24}{'active':<8}{'priority':>8}  history start")
    for t in rows:
        click.echo(
            f"{t.tenant_id:<20}{t.account_name:<24}{'yes' if t.active else 'no':<8}"
            f"{t.priority:>8}  {t.history_start}"
        )


@tenants.command("add")
@click.argument("tenant_id")
@click.option(
    "--account", required=True, help="VTEX account name ({account}.vtexcommercestable.com.br)."
)
@click.option("--app-key-ref", required=True, help="Name of the env var holding the app key.")
@click.option("--app-token-ref", required=True, help="Name of the env var holding the app token.")
@click.option("--environment", default="vtexcommercestable", show_default=True)
@click.option("--priority", default=100, show_default=True, help="Lower syncs first.")
@click.option(
    "--history-start",
    help="First day of order history to sync (YYYY-MM-DD). Default: as far back as VTEX"
    " serves orders (two years); older orders are imported with `tenants import-orders`.",
)
@click.option("--country", default="BR", show_default=True, help="Default ISO-3166 country.")
@click.option("--inactive", is_flag=True, help="Register without syncing yet.")
def tenants_add(
    tenant_id: str,
    account: str,
    app_key_ref: str,
    app_token_ref: str,
    environment: str,
    priority: int,
    history_start: str | None,
    country: str,
    inactive: bool,
) -> None:
    """Add (or update) a tenant. Credentials are given as env var names, never values."""
    try:
        start = date.fromisoformat(history_start) if history_start else default_history_start()
    except ValueError:
        raise click.BadParameter(
            f"{history_start!r} is not YYYY-MM-DD", param_hint="--history-start"
        ) from None
    tenant = Tenant(
        tenant_id,
        account,
        app_key_ref,
        app_token_ref,
        environment=environment,
        active=not inactive,
        priority=priority,
        history_start=start,
        default_country=country,
    )
    try:
        tenant.validate()
        with _connect() as conn:
            add_tenant(conn, tenant)
    except TenantError as error:
        raise click.ClickException(str(error)) from None
    missing = [ref for ref in (app_key_ref, app_token_ref) if not os.environ.get(ref)]
    click.echo(f"tenant {tenant_id!r} saved; its partition appears within one sensor tick")
    if missing:
        click.echo(f"note: {', '.join(missing)} not set here; runs need them in their environment")


@tenants.command("import-orders")
@click.argument("tenant_id")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def tenants_import_orders(tenant_id: str, path: Path) -> None:
    """Import orders older than the two years VTEX serves from PATH: Get order documents,
    one JSON document a line (NDJSON, gzip accepted). They are checked, quarantined and
    upserted like synced orders, so importing a file again changes nothing."""
    from cdp_assets.vtex.import_orders import import_orders

    try:
        with _connect() as conn:
            get_tenant(conn, tenant_id)
            run_id = f"import-{time.strftime('%Y%m%dT%H%M%S')}"
            landing = import_orders(conn, tenant_id, path, run_id)
    except TenantError as error:
        raise click.ClickException(str(error)) from None
    counts = landing.counts
    click.echo(
        f"imported {path.name}: {landing.received} orders read, {counts.inserted} inserted,"
        f" {counts.updated} updated, {counts.unchanged} unchanged, {landing.rejected} rejected"
        " (raw_vtex.rejects)"
    )


@tenants.command("deactivate")
@click.argument("tenant_id")
def tenants_deactivate(tenant_id: str) -> None:
    """Stop syncing a tenant (its partition is removed on the next sensor tick; data stays)."""
    _set_active(tenant_id, False)


@tenants.command("activate")
@click.argument("tenant_id")
def tenants_activate(tenant_id: str) -> None:
    """Resume syncing a deactivated tenant."""
    _set_active(tenant_id, True)


def _set_active(tenant_id: str, active: bool) -> None:
    try:
        with _connect() as conn:
            set_active(conn, tenant_id, active)
    except TenantError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"tenant {tenant_id!r} {'activated' if active else 'deactivated'}")


@tenants.command("feed")
@click.argument("tenant_id")
@click.option(
    "--on/--off",
    "on",
    required=True,
    help="Configure the tenant's VTEX orders feed (v3) and drain it every 30 seconds, or stop"
    " draining it and delete it on VTEX.",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    help="Only changes into this status (repeatable; VTEX does not check the names)."
    " Default: every status change.",
)
def tenants_feed(tenant_id: str, on: bool, statuses: tuple[str, ...]) -> None:
    """Turn a tenant's VTEX orders feed on or off (needs the app key's "Feed v3 and Hook
    Admin" role; VTEX keeps one feed per app key, so the key must be ours alone)."""
    from cdp_assets.vtex.client import VtexError
    from cdp_assets.vtex.feed import FeedSettings, turn_feed_off, turn_feed_on
    from cdp_assets.vtex.resources import VtexResource

    try:
        with _connect() as conn:
            tenant = get_tenant(conn, tenant_id)
            client = VtexResource().client_for(tenant)
            if on:
                turn_feed_on(conn, client, tenant_id, FeedSettings(statuses or None))
            else:
                turn_feed_off(conn, client, tenant_id)
    except (TenantError, VtexError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"orders feed of tenant {tenant_id!r} {'on' if on else 'off'}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def dbt(args: tuple[str, ...]) -> None:
    """Run dbt in dbt_project/ against the platform's database, e.g.
    `cdp dbt build --vars '{tenant_id: acme}'`. Keeps an embedded server up while dbt runs.

    The target is `dev` unless `--target prod`: schemas of your own (DBT_SCHEMA_PREFIX, default
    dev_<user name>), never the ones activation reads. `--defer` reads production's relations
    for what the command does not build, by production's manifest (dbt_project/target/
    production/). `cdp dbt exposures` writes the destinations into the project as dbt
    exposures."""
    from cdp_assets.analytics.dbt_files import (
        DBT_EXECUTABLE,
        DBT_PROJECT_DIR,
        PRODUCTION_TARGET,
        dbt_connection_env,
        prune_exposures,
        refresh_exposures,
        refresh_production_state,
    )

    url = migrated_url()
    if args == ("exposures",):
        with psycopg.connect(url) as conn:
            changed = refresh_exposures(conn)
        click.echo(f"exposures {'written' if changed else 'unchanged'}")
        return
    env = {**os.environ, **dbt_connection_env(url), "DO_NOT_TRACK": "1"}
    prune_exposures()
    target = (_option_values(args, "--target", "-t") or [env.get("DBT_TARGET", "")])[-1]
    if target == PRODUCTION_TARGET:
        click.echo("target prod: the production schemas, which activation reads", err=True)
    state_given = _option_values(args, "--state", "--defer-state") or "DBT_STATE" in env
    deferring = "--defer" in args or env.get("DBT_DEFER", "").lower() in ("1", "true")
    if deferring and not state_given:
        try:
            env["DBT_STATE"] = str(refresh_production_state(env))
        except subprocess.CalledProcessError as failed:  # dbt printed why
            raise SystemExit(failed.returncode) from None
    # The project's profiles whatever DBT_PROFILES_DIR says elsewhere, unless the command
    # names others; in the environment, since dbt's global options (--version) take no such flag.
    env["DBT_PROFILES_DIR"] = str(DBT_PROJECT_DIR)
    command = [DBT_EXECUTABLE, *args]
    raise SystemExit(subprocess.call(command, cwd=DBT_PROJECT_DIR, env=env))


def _option_values(args: tuple[str, ...], *names: str) -> list[str]:
    """The values given to any of the options `names` (`--name value` or `--name=value`)."""
    values = []
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in names:
            values.append(value if equals else (args[index + 1 : index + 2] or [""])[0])
    return values


@main.group()
def db() -> None:
    """The platform's database: keep the embedded server up, print its URL, open psql."""


@db.command("up")
def db_up() -> None:
    """Keep the embedded PostgreSQL running until `cdp db down` (otherwise it stops with the
    last command using it), so that psql, dbt and BI tools connect between commands; prints
    its URL. Nothing to do when DATABASE_URL names a server."""
    from cdp_assets.lib.database import keep_embedded_server_up

    if settings.value("DATABASE_URL"):
        click.echo("DATABASE_URL names the server: nothing to keep up (`cdp db url` prints it)")
        return
    click.echo(keep_embedded_server_up())


@db.command("down")
def db_down() -> None:
    """Stop keeping the embedded server up: it stops now, or when the last command still
    using it (a `cdp dev`, a demo) ends."""
    from cdp_assets.lib.database import embedded_server_running, stop_keeping_embedded_server_up

    if not stop_keeping_embedded_server_up():
        click.echo("the embedded server was not kept up (`cdp db up`)")
    elif embedded_server_running():
        click.echo("no longer kept up; still used by other commands, it stops when they end")
    else:
        click.echo("embedded server stopped")


@db.command("url")
def db_url() -> None:
    """Print the database's URL, a libpq connection string for psql, dbt and BI tools:
    DATABASE_URL, or the embedded server's (a Unix socket) while `cdp db up` keeps it up."""
    from cdp_assets.lib.database import database_url, embedded_server_kept_up

    if not (settings.value("DATABASE_URL") or embedded_server_kept_up()):
        raise click.ClickException(
            "the embedded server stops with the last command using it: `cdp db up` keeps it"
            " running, then `cdp db url` prints its URL"
        )
    click.echo(database_url())


@db.command("shell")
def db_shell() -> None:
    """Open psql on the platform's database (the embedded server stays up meanwhile)."""
    from cdp_assets.lib.database import psql_executable

    raise SystemExit(subprocess.call([psql_executable(), migrated_url()]))


# The development kit (cdp_devkit: sandboxes, demo, benchmark, reliability runner) adds its
# commands and `cdp dev`'s sandboxes through these entry points; the product imports none of it.
COMMANDS_GROUP = "cdp.commands"
DEV_SANDBOXES_GROUP = "cdp.dev_sandboxes"
DEVKIT_MISSING = "the development kit is not installed: pip install -e '.[devkit]'"


def _installed(group: str) -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=group), key=lambda entry: entry.name)


def _dev_sandbox_hook() -> metadata.EntryPoint | None:
    return next(iter(_installed(DEV_SANDBOXES_GROUP)), None)


def _dev_sandboxes(url: str) -> AbstractContextManager[object, bool | None]:
    hook = _dev_sandbox_hook()
    if hook is None:
        raise click.ClickException(DEVKIT_MISSING)
    return hook.load()(url, click.echo)


def _add_kit_commands() -> None:
    for entry in _installed(COMMANDS_GROUP):
        try:
            command = entry.load()
        except ImportError:  # declared by the package, not installed (the production image)
            continue
        main.add_command(command, entry.name)


_add_kit_commands()
