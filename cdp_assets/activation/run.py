"""What every activation asset does for the tenants of its run (one, or the range a single run
covers): sync each configured destination audience and report it as materialization
metadata: one row per destination audience in a tenant's own run, one row per tenant in a run
over several (every tenant's materialization carries the run's metadata: a row per audience
of every tenant would repeat the whole table in each). Every sync is also a row of
`cdp.activation_runs` (`cdp destinations history`).

A failing destination does not stop the others; the asset fails at the end, naming each
failed destination audience with its reason. Each run first closes the history rows that runs
killed mid-sync left open (`history.py`).
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import dagster as dg
import psycopg

from cdp_assets.activation.audiences import (
    RowBuilder,
    audience_members,
    audience_signatures,
    audience_views,
    require_audience,
)
from cdp_assets.activation.destinations import (
    Destination,
    DestinationAudience,
    destination_audiences,
)
from cdp_assets.activation.history import close_abandoned_runs
from cdp_assets.activation.quality_gate import clv_gate_refusals, requires_clv_quality
from cdp_assets.activation.sync import (
    MemberSource,
    Platform,
    SyncOptions,
    SyncOutcome,
    error_reason,
    record_failure,
    record_unsynced,
    refresh_state_statistics,
    shortened,
    sync_audience,
)
from cdp_assets.lib.redaction import redact
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.registry import get_tenant


class ActivationConfig(dg.Config):
    dry_run: bool = False
    """Compute and record everything, send nothing."""
    full_replace: bool = False
    """Replace the platform's whole membership instead of sending the difference."""
    force: bool = False
    """Allow a run that removes more than the destination's max_removal_share."""
    destinations: list[str] = []
    """Only these destination ids (default: every active destination of the tenant)."""
    changed_only: bool = False
    """Only the audiences whose membership changed since their last completed sync (what the
    audience-change sensor requests: its run covers a range of tenants, some unchanged).
    Destinations without a membership signature (VTEX's) sync everything all the same."""


OUTCOME_COLUMNS = [
    dg.TableColumn("tenant_id", "string"),
    dg.TableColumn("destination_id", "string"),
    dg.TableColumn("audience", "string"),
    dg.TableColumn("platform", "string"),
    dg.TableColumn("status", "string"),
    dg.TableColumn("reason", "string"),
    dg.TableColumn("desired", "int"),
    dg.TableColumn("unmatchable", "int"),
    dg.TableColumn("suppressed", "int"),
    dg.TableColumn("consent_excluded", "int"),
    dg.TableColumn("added", "int"),
    dg.TableColumn("removed", "int"),
    dg.TableColumn("unchanged", "int"),
    dg.TableColumn("rejected", "int"),
    dg.TableColumn("pending", "int"),
    dg.TableColumn("requests", "int"),
    dg.TableColumn("seconds", "float"),
    dg.TableColumn("match_info", "string"),
]
# pending: members sent that await the platform's verdict (not confirmed yet); suppressed and
# consent_excluded: audience members left out by a privacy request or the consent policy.
TOTALS = (
    "desired",
    "added",
    "removed",
    "unchanged",
    "rejected",
    "pending",
    "requests",
    "suppressed",
    "consent_excluded",
)
STATUSES = ("synced", "dry_run", "skipped", "refused", "failed")
TENANT_COLUMNS = [
    dg.TableColumn("tenant_id", "string"),
    dg.TableColumn("destination_audiences", "int"),
    *(dg.TableColumn(status, "int") for status in STATUSES),
    *(dg.TableColumn(name, "int") for name in TOTALS),
]


def _by_tenant(
    outcomes: list[SyncOutcome], tenant_of: dict[str, str]
) -> dict[str, list[SyncOutcome]]:
    by_tenant: dict[str, list[SyncOutcome]] = {}
    for outcome in outcomes:
        by_tenant.setdefault(tenant_of[outcome.destination_id], []).append(outcome)
    return dict(sorted(by_tenant.items()))


def _tenant_tally(tenant_id: str, outcomes: list[SyncOutcome]) -> dict[str, str | int]:
    """One tenant's destination audiences by status and its totals (TENANT_COLUMNS)."""
    statuses = Counter(o.status for o in outcomes)
    return {
        "tenant_id": tenant_id,
        "destination_audiences": len(outcomes),
        **{status: statuses[status] for status in STATUSES},
        **{name: sum(getattr(o, name) for o in outcomes) for name in TOTALS},
    }


def activation_metadata(
    outcomes: list[SyncOutcome], tenant_of: dict[str, str], several_tenants: bool
) -> dict[str, dg.MetadataValue]:
    """Totals as numbers (plotted over runs in the UI), and the table: per destination
    audience, or per tenant in a run over `several_tenants`; `tenant_of` maps each
    destination to its tenant."""
    metadata: dict[str, dg.MetadataValue] = {
        name: dg.MetadataValue.int(sum(getattr(o, name) for o in outcomes)) for name in TOTALS
    }
    for status in STATUSES:
        metadata[f"audiences_{status}"] = dg.MetadataValue.int(
            sum(o.status == status for o in outcomes)
        )
    if several_tenants:
        metadata["tenants"] = dg.MetadataValue.table(
            records=[
                dg.TableRecord(_tenant_tally(tenant_id, tenant_outcomes))
                for tenant_id, tenant_outcomes in _by_tenant(outcomes, tenant_of).items()
            ],
            schema=dg.TableSchema(columns=TENANT_COLUMNS),
        )
    else:
        metadata["audiences"] = dg.MetadataValue.table(
            records=[
                dg.TableRecord({"tenant_id": tenant_of[o.destination_id], **o.as_row()})
                for o in outcomes
            ],
            schema=dg.TableSchema(columns=OUTCOME_COLUMNS),
        )
    return metadata


def tenant_summaries(outcomes: list[SyncOutcome], tenant_of: dict[str, str]) -> list[str]:
    """Per tenant: its destination audiences by status and the members they moved."""
    lines = []
    for tenant_id, tenant_outcomes in _by_tenant(outcomes, tenant_of).items():
        tally = _tenant_tally(tenant_id, tenant_outcomes)
        statuses = ", ".join(f"{tally[s]} {s}" for s in sorted(STATUSES) if tally[s])
        lines.append(
            f"{tenant_id}: {tally['destination_audiences']} destination audiences ({statuses}),"
            f" +{tally['added']} -{tally['removed']} ={tally['unchanged']}"
            f" rejected {tally['rejected']}"
            + (f", {tally['pending']} awaiting the platform's verdict" if tally["pending"] else "")
        )
    return lines


# Destinations synced at once in a run: a sync mostly waits on the warehouse and the platform,
# its CPU a fraction of its wall time. Each worker
# holds two connections; a destination's audiences stay in order on one worker, with one
# platform client.
SYNC_WORKERS = 4

# (writer, reader): the sync state's connection and one for reading members.
Connections = tuple[psycopg.Connection, psycopg.Connection]


class DestinationAdapter:
    """What activation needs of one kind of destination: the platforms it serves, a client
    per destination, each audience's desired members and its membership signature.
    `members` and `signature` are called from the sync workers, each on a connection of its
    own (`reader` for members, the sync state's `writer` for the signature)."""

    platforms: tuple[str, ...] = ()
    # Destinations of a run synced at once.
    workers: int = SYNC_WORKERS

    def platform(self, destination: Destination) -> Platform:
        raise NotImplementedError

    def members(self, reader: psycopg.Connection, target: DestinationAudience) -> MemberSource:
        raise NotImplementedError

    def signature(self, writer: psycopg.Connection, target: DestinationAudience) -> str | None:
        """The audience's membership signature, stored when a sync completes so the change
        sensor can tell it changed since; None: no signature (the sensor does not watch)."""
        return None


def _sync_destination(
    connections: Connections,
    targets: list[DestinationAudience],
    options: SyncOptions,
    adapter: DestinationAdapter,
    gate_refusals: dict[str, str],
) -> list[SyncOutcome]:
    """One destination's audiences, in order, with one platform client; an audience gated
    by CLV quality is skipped for a tenant in `gate_refusals` (tenant -> reason)."""
    conn, reader = connections
    outcomes: list[SyncOutcome] = []
    platform: Platform | None = None
    for target in targets:
        destination = target.destination
        refusal = gate_refusals.get(destination.tenant_id)
        if refusal is not None and requires_clv_quality(target.params):
            outcomes.append(record_unsynced(conn, target, options, "skipped", refusal))
            continue
        try:
            # Rows edited by hand skip add_destination's checks: a malformed account id or
            # credential reference is refused here, before any call to the platform.
            destination.validate()
            if platform is None:
                platform = adapter.platform(destination)
            source, signature = adapter.members(reader, target), adapter.signature(conn, target)
        except Exception as error:
            outcome = record_failure(conn, target, options, error_reason(error))
        else:
            try:
                outcome = sync_audience(conn, target, source, platform, options, signature)
            except Exception as error:  # its history row could not be written
                outcome = SyncOutcome(
                    destination.destination_id,
                    target.audience,
                    destination.platform,
                    "failed",
                    error_reason(error),
                )
        outcomes.append(outcome)
    return outcomes


# The run's failure becomes its row of `cdp.sync_errors` (1,000 characters, Dagster's own
# prefix included) and the alert's text.
FAILURE_LENGTH = 900


def failure_description(outcomes: list[SyncOutcome]) -> str:
    """Why the run failed: each failed destination audience with its reason (the platform's
    error code and message), credentials masked, at most FAILURE_LENGTH characters."""
    failed = [o for o in outcomes if o.status == "failed"]
    others = " (the others went on)" if len(outcomes) > len(failed) else ""
    reasons = "; ".join(f"{o.destination_id}/{o.audience}: {o.reason}" for o in failed)
    return shortened(
        redact(
            f"activation failed for {len(failed)} of {len(outcomes)} destination audiences"
            f"{others}: {reasons}"
        ),
        FAILURE_LENGTH,
    )


def _without_jit(conn: psycopg.Connection) -> psycopg.Connection:
    """A sync's queries each read one audience's rows. Once a plan's estimate passes
    `jit_above_cost`, as the search for the rows to remove does for an audience of a few
    thousand members, compiling it costs more than running it."""
    conn.execute("SET jit = off")
    conn.commit()  # a SET is undone by a rollback until committed
    return conn


def _changed(
    conn: psycopg.Connection, targets: list[DestinationAudience], adapter: DestinationAdapter
) -> tuple[list[DestinationAudience], int]:
    """The targets whose membership signature differs from the one their last completed sync
    stored (or that have none), and how many were left out."""
    changed = [
        target
        for target in targets
        if (signature := adapter.signature(conn, target)) is None
        or signature != target.synced_signature
    ]
    return changed, len(targets) - len(changed)


# Set by Dagster on the runs a sensor launches: the pushes of changes and the verdict polls.
SENSOR_TAG = "dagster/sensor_name"
# Set by Dagster on a re-execution of a run (by hand, or by its automatic retries, which also
# carry their number): a re-execution copies the run's tags, the sensor's name included.
PARENT_RUN_TAG = "dagster/parent_run_id"
RETRY_NUMBER_TAG = "dagster/retry_number"


def launched_by_sensor(tags: Mapping[str, str]) -> bool:
    """Whether a run is a sensor's: launched by it, or retried automatically after it. A run
    re-executed by hand is a person's, though it carries the sensor's name."""
    return SENSOR_TAG in tags and (PARENT_RUN_TAG not in tags or RETRY_NUMBER_TAG in tags)


def _awake(targets: list[DestinationAudience]) -> tuple[list[DestinationAudience], list[str]]:
    """The targets but those resting after failed syncs (`destinations.resting_until`), and
    a line for each of those."""
    now = datetime.now(UTC)
    awake: list[DestinationAudience] = []
    resting: list[str] = []
    for target in targets:
        until = target.resting_until(now)
        if until is None:
            awake.append(target)
        else:
            resting.append(
                f"{target.destination.destination_id}/{target.audience}: failed"
                f" {target.failures_in_a_row} times in a row; a sensor's push tries it again"
                f" after {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC (at once:"
                f" `cdp destinations retry {target.destination.destination_id}`)"
            )
    return awake, resting


def activate(
    context: dg.AssetExecutionContext,
    connect: Callable[[], psycopg.Connection],
    config: ActivationConfig,
    adapter: DestinationAdapter,
) -> dg.MaterializeResult:
    """Sync the run's destination audiences of the adapter's platforms, `adapter.workers`
    destinations at a time, each worker on connections of its own from `connect`."""
    platforms = adapter.platforms
    tenant_ids = sorted(context.partition_keys)
    already_synced = 0
    with connect() as conn:
        abandoned = close_abandoned_runs(conn, context.instance)
        targets = [
            target
            for tenant_id in tenant_ids
            for target in destination_audiences(conn, tenant_id, platforms)
            if not config.destinations or target.destination.destination_id in config.destinations
        ]
        if config.changed_only:
            targets, already_synced = _changed(conn, targets, adapter)
        # A sensor's push leaves alone what keeps failing; the 48-hour push and a push
        # started (or re-executed) by hand try it whatever.
        by_sensor = launched_by_sensor(context.run.tags)
        resting: list[str] = []
        if by_sensor:
            targets, resting = _awake(targets)
        gate_refusals = clv_gate_refusals(
            conn,
            {t.destination.tenant_id for t in targets if requires_clv_quality(t.params)},
        )
        conn.commit()
    if already_synced:
        context.log.info(
            f"{already_synced} destination audiences unchanged since their last sync: not pushed"
        )
    if resting:
        context.log.warning(
            shortened(
                f"{len(resting)} destination audiences rest after failed syncs, not pushed: "
                + "; ".join(resting),
                FAILURE_LENGTH,
            )
        )
    if abandoned:
        context.log.warning(
            f"{abandoned} syncs were left running by runs that ended before them: closed as"
            " 'abandoned' (cdp destinations history)"
        )
    options = SyncOptions(config.dry_run, config.full_replace, config.force, context.run.run_id)
    by_destination: dict[str, list[DestinationAudience]] = {}
    for target in targets:
        by_destination.setdefault(target.destination.destination_id, []).append(target)
    idle: queue.SimpleQueue[Connections] = queue.SimpleQueue()

    def sync(destination_targets: list[DestinationAudience]) -> list[SyncOutcome]:
        try:
            connections = idle.get_nowait()
        except queue.Empty:
            connections = (_without_jit(connect()), _without_jit(connect()))
        try:
            return _sync_destination(
                connections,
                destination_targets,
                options,
                adapter,
                gate_refusals,
            )
        finally:
            idle.put(connections)

    try:
        with ThreadPoolExecutor(max(1, adapter.workers), thread_name_prefix="activation") as pool:
            outcomes = [o for group in pool.map(sync, by_destination.values()) for o in group]
    finally:
        while not idle.empty():
            for connection in idle.get_nowait():
                connection.close()
    with connect() as conn:
        analyzed = refresh_state_statistics(conn, sum(o.added + o.removed for o in outcomes))
    for outcome in outcomes:
        where = f"{outcome.destination_id}/{outcome.audience}"
        if outcome.status == "failed":
            context.log.error(f"{where}: {outcome.reason}")
        elif outcome.reason:
            context.log.info(f"{where}: {outcome.reason}")
    tenant_of = {t.destination.destination_id: t.destination.tenant_id for t in targets}
    # One line per tenant, not per destination audience: each line is an event-log write,
    # and the per-audience figures are in the metadata table.
    for line in tenant_summaries(outcomes, tenant_of):
        context.log.info(line)
    metadata = activation_metadata(outcomes, tenant_of, several_tenants=len(tenant_ids) > 1)
    metadata["sync_state_analyzed"] = dg.MetadataValue.bool(analyzed)
    if config.changed_only:
        metadata["audiences_already_synced"] = dg.MetadataValue.int(already_synced)
    if by_sensor:
        metadata["audiences_resting"] = dg.MetadataValue.int(len(resting))
    if any(o.status == "failed" for o in outcomes):
        # The platforms already retried transient errors with backoff inside this run, and
        # state is kept per confirmed batch: what failed here is left to the next trigger
        # rather than re-running every destination of the tenant now.
        raise dg.Failure(
            description=failure_description(outcomes),
            metadata=metadata,
            allow_retries=False,
        )
    if not targets and not already_synced:
        context.log.info(f"tenants {tenant_ids} have no active destination on {platforms}")
    if len(tenant_ids) > 1:
        metadata["tenants_in_run"] = dg.MetadataValue.int(len(tenant_ids))
    return dg.MaterializeResult(metadata=metadata)


class AudienceAdapter(DestinationAdapter):
    """Ad platforms: members from the tenants' audience tables, hashed by `build_row`."""

    def __init__(
        self,
        conn: psycopg.Connection,
        tenant_ids: Sequence[str],
        platforms: tuple[str, ...],
        platform_for: Callable[[Destination], Platform],
        build_row: RowBuilder,
    ) -> None:
        self.platforms = platforms
        self.tenant_ids = list(tenant_ids)
        self.platform_for = platform_for
        self.build_row = build_row
        self.countries = {t: get_tenant(conn, t).default_country for t in self.tenant_ids}
        self.views = audience_views(conn)
        # audience -> tenant -> signature, for every tenant of the run when first asked (at
        # the run's start with `changed_only`, else at the audience's first push): one query
        # per audience, not per tenant. An audience refreshed before a tenant's members are
        # read leaves that tenant an older signature, so the change sensor pushes it once
        # more (the diff sends nothing new).
        self.signatures: dict[str, dict[str, str]] = {}
        self.reading_signatures = threading.Lock()

    def platform(self, destination: Destination) -> Platform:
        return self.platform_for(destination)

    def members(self, reader: psycopg.Connection, target: DestinationAudience) -> MemberSource:
        require_audience(self.views, target.audience)
        country = self.countries[target.destination.tenant_id]
        return audience_members(reader, target, country, self.build_row)

    def signature(self, writer: psycopg.Connection, target: DestinationAudience) -> str | None:
        if target.audience not in self.views:
            return None  # reading its members fails, for this audience alone
        with self.reading_signatures:
            if target.audience not in self.signatures:
                self.signatures[target.audience] = audience_signatures(
                    writer, target.audience, self.tenant_ids
                )
            return self.signatures[target.audience][target.destination.tenant_id]


def activate_audiences(
    context: dg.AssetExecutionContext,
    config: ActivationConfig,
    warehouse: WarehouseResource,
    platforms: tuple[str, ...],
    platform_for: Callable[[Destination], Platform],
    build_row: RowBuilder,
) -> dg.MaterializeResult:
    """`activate` for ad platforms."""
    with warehouse.connect() as conn:
        adapter = AudienceAdapter(conn, context.partition_keys, platforms, platform_for, build_row)
    return activate(context, warehouse.connect, config, adapter)
