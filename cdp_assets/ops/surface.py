"""The code location's surface, described in a committed file (`surface.json`): every asset
(its group, whether it is materialized here, its partitioning), asset check, job, schedule
(cron, timezone, on by default) and sensor (minimum interval, on by default), and the asset
keys each `freshness.FRESHNESS` name stands for.

`cdp status` and the health verdict read the file instead of loading the code location (the
dbt manifest, the destinations' SDKs), so a probe costs the queries, not those imports; review
sees any change of the code location as a change of the file. Generating it loads the
definitions; after changing them, regenerate it:

    python -m cdp_assets.ops.surface > cdp_assets/ops/surface.json

tests/test_definitions_snapshot.py fails while the file differs from the definitions.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import TypedDict

import dagster as dg
from dagster._core.definitions.sensor_definition import DEFAULT_SENSOR_DAEMON_INTERVAL

from cdp_assets.ops.freshness import FRESHNESS

SURFACE_FILE = "surface.json"
REGENERATE = f"python -m cdp_assets.ops.surface > cdp_assets/ops/{SURFACE_FILE}"
# The daemon's timezone for a schedule that names none.
DEFAULT_TIMEZONE = "UTC"


class AssetSurface(TypedDict):
    group: str
    kind: str  # materializable, or external (declared here, produced elsewhere)
    partitioning: str  # the partitions definition's class, or unpartitioned


class ScheduleSurface(TypedDict):
    cron_schedule: str
    timezone: str
    default_running: bool


class SensorSurface(TypedDict):
    minimum_interval_seconds: int
    default_running: bool


class Surface(TypedDict):
    assets: dict[str, AssetSurface]
    checks: list[str]  # asset:check
    jobs: list[str]
    schedules: dict[str, ScheduleSurface]
    sensors: dict[str, SensorSurface]
    # FRESHNESS name -> the asset keys it stands for (a `@dbt_assets` name: all its models).
    watched_assets: dict[str, list[str]]


def watched_in(definitions: dg.Definitions) -> dict[str, tuple[dg.AssetKey, ...]]:
    """FRESHNESS names -> the asset keys each stands for in `definitions`; a FRESHNESS name the
    definitions lack is an error, so a renamed asset cannot silently drop out of the check."""
    found = {}
    for assets_def in definitions.assets or ():
        if isinstance(assets_def, dg.AssetsDefinition) and assets_def.is_executable:
            name = assets_def.node_def.name
            if name in FRESHNESS:
                found[name] = tuple(sorted(assets_def.keys))
    missing = sorted(FRESHNESS.keys() - found.keys())
    if missing:
        raise LookupError(f"FRESHNESS names assets the code location lacks: {', '.join(missing)}")
    return {name: found[name] for name in FRESHNESS}


def describe(definitions: dg.Definitions) -> Surface:
    """The surface of `definitions`, as `surface.json` holds it."""
    graph = definitions.resolve_asset_graph()
    assets: dict[str, AssetSurface] = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "kind": "materializable" if node.is_materializable else "external",
            "partitioning": (
                type(node.partitions_def).__name__ if node.partitions_def else "unpartitioned"
            ),
        }
    repository = definitions.get_repository_def()
    return {
        "assets": assets,
        "checks": sorted(
            f"{c.asset_key.to_user_string()}:{c.name}" for c in graph.asset_check_keys
        ),
        "jobs": sorted(job.name for job in repository.get_all_jobs()),
        "schedules": {
            s.name: {
                "cron_schedule": str(s.cron_schedule),
                "timezone": s.execution_timezone or DEFAULT_TIMEZONE,
                "default_running": s.default_status == dg.DefaultScheduleStatus.RUNNING,
            }
            for s in definitions.schedules or ()
            if isinstance(s, dg.ScheduleDefinition)
        },
        "sensors": {
            s.name: {
                "minimum_interval_seconds": (
                    s.minimum_interval_seconds or DEFAULT_SENSOR_DAEMON_INTERVAL
                ),
                "default_running": s.default_status == dg.DefaultSensorStatus.RUNNING,
            }
            for s in definitions.sensors or ()
        },
        "watched_assets": {
            name: [key.to_user_string() for key in keys]
            for name, keys in watched_in(definitions).items()
        },
    }


def render(surface: Surface) -> str:
    """The file's text: sorted, one value a line, so a change reads as a small diff."""
    return json.dumps(surface, indent=2, sort_keys=True) + "\n"


@cache
def read_surface() -> Surface:
    """The committed surface (package data), read without loading the code location."""
    surface: Surface = json.loads((files("cdp_assets.ops") / SURFACE_FILE).read_text())
    return surface


def watched_assets_of(surface: Surface) -> dict[str, tuple[dg.AssetKey, ...]]:
    """FRESHNESS names -> their asset keys, in FRESHNESS's order, as `surface` records them."""
    recorded = surface["watched_assets"]
    missing = sorted(FRESHNESS.keys() - recorded.keys())
    if missing:
        raise LookupError(
            f"{SURFACE_FILE} lacks the FRESHNESS names {', '.join(missing)}: regenerate it"
            f" ({REGENERATE})"
        )
    return {
        name: tuple(dg.AssetKey.from_user_string(key) for key in recorded[name])
        for name in FRESHNESS
    }


if __name__ == "__main__":
    from cdp_assets.definitions import defs

    print(render(describe(defs)), end="")
