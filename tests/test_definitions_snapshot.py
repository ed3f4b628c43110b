"""The code location's surface, snapshotted: every asset (with its group and partitioning),
asset check, job, schedule and sensor. A change to any of them shows in review as a change of
tests/snapshots/definitions.txt; after a deliberate one, regenerate it with
`CDP_UPDATE_SNAPSHOT=1 pytest tests/test_definitions_snapshot.py`."""

import os
from pathlib import Path

from cdp_assets.definitions import defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.txt"


def surface() -> str:
    graph = defs.resolve_asset_graph()
    lines = []
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        kind = "materializable" if node.is_materializable else "external"
        partitioning = (
            type(node.partitions_def).__name__ if node.partitions_def else "unpartitioned"
        )
        lines.append(f"asset {key.to_user_string()} [{node.group_name}, {kind}, {partitioning}]")
    checks = sorted(
        f"check {check.asset_key.to_user_string()}:{check.name}" for check in graph.asset_check_keys
    )
    lines += checks
    repository = defs.get_repository_def()
    lines += sorted(f"job {job.name}" for job in repository.get_all_jobs())
    lines += sorted(
        f"schedule {s.name} [{s.cron_schedule} {s.execution_timezone or 'UTC'}]"
        for s in defs.schedules or []
    )
    lines += sorted(f"sensor {s.name}" for s in defs.sensors or [])
    return "\n".join(lines) + "\n"


def test_the_definitions_match_their_snapshot() -> None:
    current = surface()
    if os.environ.get("CDP_UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(current)
    assert current == SNAPSHOT.read_text(), (
        "the code location changed: review, then CDP_UPDATE_SNAPSHOT=1 pytest"
        " tests/test_definitions_snapshot.py"
    )
