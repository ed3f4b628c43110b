"""Failed runs as rows of `cdp.sync_errors`: which tenant, which assets, what went wrong (a
run over several tenants: a row per tenant it failed for).

Building a row is a plain function of the run, its failure event and the assets it left
unmaterialized, so it is tested on real failed runs without a daemon.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

import dagster as dg
import psycopg

from cdp_assets.lib.redaction import redact
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenant_of_partition_key

if TYPE_CHECKING:
    from dagster_shared.error import SerializableErrorInfo

MAX_MESSAGE = 1000  # also the column's CHECK
PARTITION_TAG = "dagster/partition"
TENANT_TAG = "dagster/partition/tenant"  # runs of tenant x month assets carry it


@dataclass(frozen=True)
class SyncError:
    """One failed run, as stored in `cdp.sync_errors`."""

    run_id: str
    job_name: str
    tenant_id: str | None
    asset_keys: tuple[str, ...]
    partition_key: str | None
    error_type: str
    message: str
    step_key: str | None
    occurred_at: datetime


def tenant_from_tags(tags: Mapping[str, str]) -> str | None:
    """The one tenant a run was for, from Dagster's partition tags; None when it ran for no
    tenant or for several (a range from one tenant to another)."""
    if TENANT_TAG in tags:
        return tags[TENANT_TAG]
    if PARTITION_TAG in tags:
        return tenant_of_partition_key(tags[PARTITION_TAG])
    if RANGE_START_TAG in tags and RANGE_END_TAG in tags:
        first = tenant_of_partition_key(tags[RANGE_START_TAG])
        return first if first == tenant_of_partition_key(tags[RANGE_END_TAG]) else None
    return None


def partition_from_tags(tags: Mapping[str, str]) -> str | None:
    if PARTITION_TAG in tags:
        return tags[PARTITION_TAG]
    if RANGE_START_TAG in tags and RANGE_END_TAG in tags:
        return f"{tags[RANGE_START_TAG]}..{tags[RANGE_END_TAG]}"
    return None


def _truncate(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _subclass_names(cls: type) -> set[str]:
    names = {cls.__name__}
    for sub in cls.__subclasses__():
        names |= _subclass_names(sub)
    return names


# Dagster wraps what user code raises ("Error occurred while executing op ..."); the cause is
# the error worth reading.
_WRAPPERS = frozenset(_subclass_names(dg.DagsterUserCodeExecutionError))


def _user_error(error: SerializableErrorInfo) -> SerializableErrorInfo:
    while error.cause is not None and error.cls_name in _WRAPPERS:
        error = error.cause
    return error


def _message_of(error: SerializableErrorInfo) -> str:
    """The message without the `module.ClassName: ` prefix Dagster stores with it."""
    text = error.message.strip()
    if error.cls_name is None:
        return text
    prefix = re.match(rf"(?:[\w.]+\.)?{re.escape(error.cls_name)}(?::\s*|$)", text)
    return text[prefix.end() :] if prefix else text


def sync_error_from_run(
    run: dg.DagsterRun,
    failure_event: dg.DagsterEvent,
    failed_assets: Iterable[str],
    occurred_at: datetime,
) -> SyncError:
    """The row for a failed run: tenant and partition from its tags, and the error of its first
    failed step (or of the run itself when no step failed, e.g. a crashed run worker)."""
    data = failure_event.event_specific_data  # JobFailureData; None on very old events
    error = getattr(data, "error", None)
    step_event = getattr(data, "first_step_failure_event", None)
    if error is not None:
        error = _user_error(error)
        # Dagster's name for a failure it cannot classify (`RunFailureReason.UNKNOWN`).
        error_type, message = error.cls_name or "UNKNOWN", _message_of(error)
    else:
        reason = getattr(data, "failure_reason", None)
        error_type = reason.value if reason else "RUN_FAILURE"
        message = failure_event.message or ""
    return SyncError(
        run_id=run.run_id,
        job_name=run.job_name,
        tenant_id=tenant_from_tags(run.tags),
        asset_keys=tuple(sorted(failed_assets)),
        partition_key=partition_from_tags(run.tags),
        error_type=error_type,
        message=_truncate(redact(message)),
        step_key=step_event.step_key if step_event is not None else None,
        occurred_at=occurred_at,
    )


def failed_partitions(instance: dg.DagsterInstance, run_id: str) -> dict[str, set[str | None]]:
    """Assets (as `a/b` strings) the run planned and did not materialize, with those of their
    partitions (None for an unpartitioned asset)."""
    planned = instance.get_asset_partitions_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    )
    done = instance.get_asset_partitions_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    )
    left = {
        key.to_user_string(): set(partitions) - set(done.get(key, ()))
        for key, partitions in planned.items()
    }
    return {asset: partitions for asset, partitions in left.items() if partitions}


def per_tenant(error: SyncError, failed: Mapping[str, Collection[str | None]]) -> list[SyncError]:
    """A run over several tenants (a block) that left some of their partitions unmaterialized:
    a row per such tenant, with its own assets, so that each tenant's latest error is its own
    (and a row without a tenant for assets of none). Any other run: its one row."""
    if error.tenant_id is not None:
        return [error]
    assets_of: dict[str | None, set[str]] = defaultdict(set)
    for asset, partitions in failed.items():
        for partition in partitions:
            assets_of[tenant_of_partition_key(partition) if partition else None].add(asset)
    tenants = sorted(t for t in assets_of if t is not None)
    if not tenants:
        return [error]
    rows = [replace(error, tenant_id=t, asset_keys=tuple(sorted(assets_of[t]))) for t in tenants]
    if None in assets_of:  # assets of no tenant's: a row of their own
        rows.append(replace(error, asset_keys=tuple(sorted(assets_of[None]))))
    return rows


_COLUMNS = (
    "run_id, job_name, tenant_id, asset_keys, partition_key, error_type, message, step_key,"
    " occurred_at"
)


def record_sync_errors(conn: psycopg.Connection, errors: Sequence[SyncError]) -> int:
    """Store a run's rows, except those already there (one per run and tenant); how many
    were stored now."""
    stored = 0
    with conn.transaction():
        for error in errors:
            stored += conn.execute(
                f"INSERT INTO cdp.sync_errors ({_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (run_id, (coalesce(tenant_id, ''))) DO NOTHING",
                (
                    error.run_id,
                    error.job_name,
                    error.tenant_id,
                    list(error.asset_keys),
                    error.partition_key,
                    error.error_type,
                    error.message,
                    error.step_key,
                    error.occurred_at,
                ),
            ).rowcount
    return stored


def latest_errors(
    conn: psycopg.Connection, tenant_ids: Sequence[str], asset_keys: Sequence[str]
) -> dict[tuple[str, str], SyncError]:
    """(tenant, asset key) -> the latest recorded failure of a run that left it unmaterialized."""
    rows = conn.execute(
        f"""
        SELECT DISTINCT ON (e.tenant_id, k.asset_key) k.asset_key, {_COLUMNS}
          FROM cdp.sync_errors e, unnest(e.asset_keys) AS k(asset_key)
         WHERE e.tenant_id = ANY(%s) AND k.asset_key = ANY(%s)
         ORDER BY e.tenant_id, k.asset_key, e.occurred_at DESC
        """,
        (list(tenant_ids), list(asset_keys)),
    ).fetchall()
    found = {}
    for asset_key, run_id, job, tenant_id, keys, partition, kind, message, step, at in rows:
        found[(tenant_id, asset_key)] = SyncError(
            run_id, job, tenant_id, tuple(keys), partition, kind, message, step, at
        )
    return found
