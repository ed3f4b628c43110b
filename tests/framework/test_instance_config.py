"""The local and production dagster.yaml load as Dagster instances on Postgres."""

import shutil
from importlib.resources import files
from pathlib import Path

import dagster as dg
import pytest

from cdp_assets.framework.dagster_storage import (
    PooledPostgresEventLogStorage,
    PooledPostgresRunStorage,
)
from cdp_assets.lib.database import sqlalchemy_url

PROJECT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "local": (files("cdp_assets.lib") / "dagster.yaml", "CDP_DAGSTER_PG_URL"),
    "production": (PROJECT / "deploy" / "dagster.yaml", "DAGSTER_PG_URL"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_instance_config_loads_with_its_limits(name, warehouse_url, tmp_path, monkeypatch):
    source, url_env = CONFIGS[name]
    with source.open("rb") as config, open(tmp_path / "dagster.yaml", "wb") as copy:
        shutil.copyfileobj(config, copy)
    monkeypatch.setenv(url_env, sqlalchemy_url(warehouse_url))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert type(instance.run_storage) is PooledPostgresRunStorage
        assert type(instance.event_log_storage) is PooledPostgresEventLogStorage
        settings = instance.get_concurrency_config()
        limits = {limit["key"]: limit for limit in settings.run_queue_config.tag_concurrency_limits}
        assert limits["dagster/partition/tenant"]["limit"] == 1
        assert (
            instance.run_retries_enabled and not instance.run_retries_retry_on_asset_or_op_failure
        )
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 60


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_run_is_bounded_in_time_and_cancelled_quickly(name, warehouse_url, tmp_path, monkeypatch):
    """Runs without a bound of their own end after the instance's; a cancelled run is marked
    so within minutes (its steps stop within seconds)."""
    source, url_env = CONFIGS[name]
    with source.open("rb") as config, open(tmp_path / "dagster.yaml", "wb") as copy:
        shutil.copyfileobj(config, copy)
    monkeypatch.setenv(url_env, sqlalchemy_url(warehouse_url))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert 0 < instance.run_monitoring_max_runtime_seconds <= 12 * 3600
        assert 0 < instance.run_monitoring_settings["cancel_timeout_seconds"] <= 300


def test_every_job_carries_its_run_bound():
    """The tag holds whatever the instance (Dagster's Helm chart has no max runtime value)."""
    from cdp_assets.definitions import defs
    from cdp_assets.lib.run_bounds import MAX_RUNTIME_TAG

    jobs = [job.name for job in defs.jobs]
    bounds = {name: defs.resolve_job_def(name).tags.get(MAX_RUNTIME_TAG) for name in jobs}
    assert jobs and all(bound and 0 < int(bound) <= 12 * 3600 for bound in bounds.values()), bounds
