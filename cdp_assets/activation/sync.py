"""Diff-based sync of one destination audience, the same for every platform.

Members whose inputs changed since the destination confirmed them, and new members, are
hashed as the destination wants them and COPied into a temporary table. Members the
destination already confirmed with unchanged inputs stay where they are: one set-based
statement compares the confirmed rows (`cdp.destination_members`, what the platform last
confirmed) with both and sets aside those to remove, so the unchanged majority of a re-sync
is read once and never copied. Only removals and additions are sent, in the platform's batch
size, removals first (a changed member is a removal of its old row and an addition of its
new one, and a platform keyed on the external id must not drop the new row). State is
committed after each batch the platform answered, so a run cut short resumes where it
stopped, and members the platform rejected stay out of the state: the next run sends them
again. A full replace copies the unchanged members too, as it sends everyone, and records the
members it refused as rejected just the same.

Confirmation is what the platform confirmed. A platform that acknowledges a batch and processes
it later (`AsynchronousPlatform`: Data Manager's requests, a Google Ads job) names its request;
the members it carries are held in the state under that request (`cdp.destination_requests`),
so they are not sent twice, but are pending, not confirmed. Each sync of the audience first
asks the platform for the verdicts of its pending requests: a success confirms their members, a
failure takes them out of the state as rejects (sent again) and puts back the members of a
failed removal (the platform still holds them). The audience's signature is stored only once
nothing is pending or rejected, so the audience is pushed again until it is.

An audience deleted on the platform (its adapter raises `AudienceGone`) is forgotten with
the state it held, created again and sent every member, within the same sync; a destination
can turn that off, and its sync then fails naming the cause.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdp_assets.activation.destinations import (
    DestinationAudience,
    forget_platform_state,
    set_platform_audience_id,
)
from cdp_assets.lib.redaction import redact

Row = list[str]


@dataclass
class BatchResult:
    """What the platform said about one batch: rejected rows by index in the batch, and the
    requests it acknowledged without having processed them: (the platform's request id, how
    many accepted rows it carries), covering the accepted rows in order. Accepted rows that no
    pending request carries are confirmed."""

    rejected: dict[int, str] = field(default_factory=dict)
    requests: int = 1
    pending: list[tuple[str, int]] = field(default_factory=list)
    # A replace that removes what the platform lists (VTEX collections, whose member key is
    # the row's key): the members it could not remove, with why. The platform still holds
    # them, so the state keeps them, to be removed by the next sync.
    unremoved: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """A platform's final word on a request it had acknowledged: `failed` is None when it
    applied every member, else why the request, or records of it, failed. A platform that
    counts failed records without naming them (Data Manager) fails the whole request: every
    member of it is then taken as not applied, and sent again."""

    failed: str | None = None


class PlatformError(Exception):
    """A platform's refusal with its own error code, told before the message so that a
    shortened reason never loses it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class AudienceGone(Exception):
    """The platform no longer has the audience: deleted in its ads manager, or by the
    platform's own clean-up. Every call on its id fails for good; only a new audience can
    take the members. `code` and `message` are the platform's own."""

    def __init__(self, platform_audience_id: str, code: str, message: str) -> None:
        super().__init__(
            f"audience {platform_audience_id} no longer exists on the platform ({code}: {message})"
        )
        self.platform_audience_id, self.code, self.message = platform_audience_id, code, message


class Platform(Protocol):
    """One destination's API, already authenticated; rows are in the platform's key order.
    A call on an audience the platform no longer has raises `AudienceGone`."""

    batch_size: int

    def matchable(self, row: Row) -> bool: ...

    def ensure_audience(self, target: DestinationAudience) -> str: ...

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult: ...

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult: ...

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult: ...

    def match_info(self, platform_id: str) -> dict[str, Any]: ...

    def busy(self, platform_id: str) -> str | None:
        """Why the platform cannot take changes to the audience now (a replace it is still
        processing, a job still running on it), or None when it can."""
        ...


@runtime_checkable
class AsynchronousPlatform(Platform, Protocol):
    """A platform that acknowledges batches and processes them later; `BatchResult.pending`
    names its requests."""

    def submit(self, platform_id: str) -> int:
        """Start processing what the batches of this sync staged for the audience (a Google
        Ads job holding every batch is run once); returns the requests it took."""
        ...

    def request_verdicts(self, request_ids: list[str]) -> dict[str, Verdict]:
        """The verdicts of those requests the platform has finished; the others are still
        being processed."""
        ...


@runtime_checkable
class OverwritingPlatform(Platform, Protocol):
    """A platform holding one record per member whose addition overwrites the member's
    record (the fields of a customer's document): a changed member is sent only as its new
    row, and a removal is for a member who left. The mass-change guard still counts each
    changed member among the rows that leave."""

    def overwrites_members(self) -> bool: ...


@dataclass
class SyncOptions:
    dry_run: bool = False
    full_replace: bool = False
    force: bool = False
    run_id: str | None = None


@dataclass
class SyncOutcome:
    destination_id: str
    audience: str
    platform: str
    status: str
    reason: str | None = None
    desired: int = 0
    unmatchable: int = 0
    # Audience members left out: suppressed by a privacy request, or without the consent the
    # destination's policy requires.
    suppressed: int = 0
    consent_excluded: int = 0
    added: int = 0
    removed: int = 0
    unchanged: int = 0
    rejected: int = 0
    pending: int = 0
    requests: int = 0
    seconds: float = 0.0
    match_info: dict[str, Any] = field(default_factory=dict)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["match_info"] = ", ".join(f"{k}={v}" for k, v in self.match_info.items())
        return row


REASON_LENGTH = 500


def error_reason(error: Exception, limit: int = REASON_LENGTH) -> str:
    """A failure as the history, the logs and the run's failure tell it: its type and text
    (a `PlatformError`'s code first), credentials masked (a platform's error may quote the
    request, token included), at most `limit` characters, cut at the end."""
    return shortened(redact(f"{type(error).__name__}: {error}"), limit)


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fingerprint(row: Row) -> str:
    return hashlib.md5("\x1f".join(row).encode()).hexdigest()


@dataclass(frozen=True)
class MemberSource:
    """An audience's desired members, in two parts that together hold each member once.

    `fresh`: members as (member_key, source_fingerprint, row), normalized and hashed on the
    way out. `confirmed` (optional): a query, run on the sync's own connection with `params`,
    of the members the destination confirmed whose unhashed inputs are unchanged (their
    source fingerprint is the confirmed one), as (member_key, fingerprint,
    source_fingerprint, identifiers): their confirmed row stays as it is, and a re-sync
    neither hashes nor copies them. `excluded` (optional): a query, run the same way, of how
    many of the audience's members are left out as (suppressed, without consent).
    """

    fresh: Callable[[], Iterator[tuple[str, str, Row]]]
    confirmed: sql.Composable | None = None
    params: dict[str, Any] = field(default_factory=dict)
    excluded: sql.Composed | None = None


# Working tables are emptied by DELETE up to this size together, truncated past it. A
# TRUNCATE gives each table and index a new file, a disk flush that waits behind the other
# syncs' commits; a DELETE leaves dead rows that every later scan of the table reads.
DELETE_UP_TO_BYTES = 1_048_576
# Created once per connection, emptied before each sync: one round trip.
_SYNC_TABLES = f"""
CREATE TEMP TABLE IF NOT EXISTS desired_members (member_key text PRIMARY KEY,
    fingerprint text NOT NULL, source_fingerprint text NOT NULL, identifiers text[] NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS leaving_members (member_key text PRIMARY KEY,
    fingerprint text NOT NULL, identifiers text[] NOT NULL);
DO $$ BEGIN
    IF pg_relation_size('desired_members') + pg_relation_size('leaving_members')
       > {DELETE_UP_TO_BYTES} THEN
        TRUNCATE desired_members, leaving_members;
    ELSE
        DELETE FROM desired_members;
        DELETE FROM leaving_members;
    END IF;
END $$
"""


def _load_fresh(
    conn: psycopg.Connection, members: MemberSource, platform: Platform
) -> tuple[int, int]:
    """COPY the fresh members, hashed as they are read, into `desired_members`; returns how
    many were written and how many were unmatchable (left out)."""
    conn.execute(_SYNC_TABLES)
    written = unmatchable = 0
    with conn.cursor().copy(
        "COPY desired_members (member_key, fingerprint, source_fingerprint, identifiers) FROM STDIN"
    ) as copy:
        for member_key, source_fingerprint, row in members.fresh():
            if not platform.matchable(row):
                unmatchable += 1
                continue
            copy.write_row((member_key, fingerprint(row), source_fingerprint, row))
            written += 1
    return written, unmatchable


def _load_confirmed(conn: psycopg.Connection, members: MemberSource) -> int:
    """Add the unchanged confirmed members to `desired_members`, for a sync that sends every
    member; returns how many."""
    if members.confirmed is None:
        return 0
    # The two parts read the audience at slightly different moments: a member both saw is
    # kept once, as the fresh part has it.
    return conn.execute(
        sql.SQL(
            "INSERT INTO desired_members (member_key, fingerprint, source_fingerprint,"
            " identifiers) {} ON CONFLICT (member_key) DO NOTHING"
        ).format(members.confirmed),
        members.params,
    ).rowcount


# Below this many rows the temporary tables' plans do not depend on their statistics, and an
# ANALYZE would cost a re-sync of a few hundred members more than its queries.
ANALYZE_FROM_ROWS = 10_000


_STATE = "destination_id = %(destination_id)s AND audience = %(audience)s"


def _find_leaving(conn: psycopg.Connection, members: MemberSource, key: dict[str, str]) -> int:
    """Put the confirmed rows to remove into `leaving_members`; returns how many.

    A confirmed row stays when its member is still in the audience with unchanged inputs
    (`members.confirmed` finds it; its row is the one confirmed) or when the fresh rows hold
    it as confirmed. Only the fresh members and the leaving rows are written: the unchanged
    majority of a re-sync is read once and never copied."""
    # A member with a fresh row is as the fresh row has it, whatever the other part saw. Joins,
    # not a correlated subquery per row: the unchanged part may be a query the planner cannot
    # narrow to one member (a window over the tenant), which per row made the search quadratic.
    unchanged = (
        sql.SQL(
            " LEFT JOIN (SELECT DISTINCT unchanged.member_key FROM ({}) AS unchanged"
            " (member_key, fingerprint, source_fingerprint, identifiers)) AS u"
            " ON u.member_key = s.member_key"
        ).format(members.confirmed)
        if members.confirmed is not None
        else sql.SQL("")
    )
    still_confirmed = (
        sql.SQL(" AND (d.member_key IS NOT NULL OR u.member_key IS NULL)")
        if members.confirmed is not None
        else sql.SQL("")
    )
    return conn.execute(
        sql.SQL(
            "INSERT INTO leaving_members (member_key, fingerprint, identifiers)"
            " SELECT s.member_key, s.fingerprint, s.identifiers"
            " FROM cdp.destination_members s"
            " LEFT JOIN desired_members d ON d.member_key = s.member_key{}"
            " WHERE s.destination_id = %(destination_id)s AND s.audience = %(audience)s"
            " AND (d.member_key IS NULL OR d.fingerprint IS DISTINCT FROM s.fingerprint){}"
        ).format(unchanged, still_confirmed),
        {**members.params, **key},
    ).rowcount


def _counts(conn: psycopg.Connection, key: dict[str, str]) -> tuple[int, int]:
    """(confirmed, desired rows the destination does not hold as they are)."""
    row = conn.execute(
        f"""
        SELECT (SELECT count(*) FROM cdp.destination_members WHERE {_STATE}),
               (SELECT count(*) FROM desired_members d
                 WHERE NOT EXISTS (SELECT 1 FROM cdp.destination_members s
                                   WHERE s.destination_id = %(destination_id)s
                                     AND s.audience = %(audience)s
                                     AND s.member_key = d.member_key
                                     AND s.fingerprint = d.fingerprint))
        """,
        key,
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def _pages(
    conn: psycopg.Connection, query: str, key: dict[str, str], size: int
) -> Iterator[list[tuple[str, str, Row]]]:
    """Keyset pages of (member_key, fingerprint, identifiers); safe across commits. A short
    page is the last one."""
    after = ""
    while True:
        page = conn.execute(query, {**key, "after": after, "size": size}).fetchall()
        if page:
            yield page
        if len(page) < size:
            return
        after = page[-1][0]


_ADDITIONS = """
    SELECT d.member_key, d.fingerprint, d.identifiers FROM desired_members d
    WHERE d.member_key > %(after)s
      AND NOT EXISTS (SELECT 1 FROM cdp.destination_members s
                      WHERE s.destination_id = %(destination_id)s AND s.audience = %(audience)s
                        AND s.member_key = d.member_key AND s.fingerprint = d.fingerprint)
    ORDER BY d.member_key LIMIT %(size)s
"""
_REMOVALS = """
    SELECT member_key, fingerprint, identifiers FROM leaving_members
    WHERE member_key > %(after)s ORDER BY member_key LIMIT %(size)s
"""
# For an OverwritingPlatform: the members who left, not those whose addition overwrites them.
_DEPARTURES = """
    SELECT l.member_key, l.fingerprint, l.identifiers FROM leaving_members l
    WHERE l.member_key > %(after)s
      AND NOT EXISTS (SELECT FROM desired_members d WHERE d.member_key = l.member_key)
    ORDER BY l.member_key LIMIT %(size)s
"""


def _record_rejects(
    conn: psycopg.Connection,
    run: int,
    page: list[tuple[str, str, Row]],
    result: BatchResult,
    operation: str,
) -> None:
    if result.rejected:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO cdp.activation_rejects"
                " (activation_run_id, member_key, operation, reason) VALUES (%s, %s, %s, %s)",
                [(run, page[i][0], operation, reason) for i, reason in result.rejected.items()],
            )


def _start_run(
    conn: psycopg.Connection, target: DestinationAudience, options: SyncOptions, dry_run: bool
) -> int:
    row = conn.execute(
        """
        INSERT INTO cdp.activation_runs
            (destination_id, audience, tenant_id, platform, dagster_run_id, mode, dry_run, status)
        VALUES (%s, %s, %s, %s, %s, %s, %s, 'running') RETURNING activation_run_id
        """,
        (
            target.destination.destination_id,
            target.audience,
            target.destination.tenant_id,
            target.destination.platform,
            options.run_id,
            "replace" if options.full_replace else "diff",
            dry_run,
        ),
    ).fetchone()
    assert row is not None
    conn.commit()
    return row[0]


def record_failure(
    conn: psycopg.Connection, target: DestinationAudience, options: SyncOptions, reason: str
) -> SyncOutcome:
    """History for a destination audience that failed before its sync could start (e.g. a
    credential missing from the environment)."""
    return record_unsynced(conn, target, options, "failed", reason)


def record_unsynced(
    conn: psycopg.Connection,
    target: DestinationAudience,
    options: SyncOptions,
    status: str,
    reason: str,
) -> SyncOutcome:
    """History for a destination audience whose sync did not start: failed before it, or
    skipped by a rule outside the sync (a quality gate), with the reason."""
    destination = target.destination
    outcome = SyncOutcome(
        destination.destination_id, target.audience, destination.platform, status, reason
    )
    conn.rollback()
    _finish_run(conn, _start_run(conn, target, options, options.dry_run), outcome)
    return outcome


def refresh_state_statistics(conn: psycopg.Connection, changed: int) -> bool:
    """ANALYZE the sync state when a run changed more of it than autovacuum would let pass
    (the server's analyze threshold and scale factor: 50 rows and a tenth of the table by
    default); returns whether it did.

    The next sync plans its read of the confirmed members on these statistics: planned
    against a table it believes near empty, a re-sync of 650,000 members ran a nested loop
    over the audience for every confirmed member (stopped after 28 minutes) instead of an
    index lookup per member (seconds). Autovacuum may be late, or off."""
    row = conn.execute(
        "SELECT current_setting('autovacuum_analyze_threshold')::float8"
        " + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(reltuples, 0)"
        " FROM pg_class WHERE oid = 'cdp.destination_members'::regclass"
    ).fetchone()
    assert row is not None
    if changed <= row[0]:
        return False
    conn.execute("ANALYZE cdp.destination_members")
    conn.commit()
    return True


def _finish_run(conn: psycopg.Connection, run: int, outcome: SyncOutcome) -> None:
    """The sync's history row, and its audience's failures in a row: one more on a failure,
    none once a sync completes; a dry run's outcome counts for neither
    (`destinations.resting_until`)."""
    conn.execute(
        """
        UPDATE cdp.activation_runs SET status = %s, reason = %s, desired = %s, unmatchable = %s,
               added = %s, removed = %s, unchanged = %s, rejected = %s, pending = %s,
               requests = %s, match_info = %s, finished_at = now()
        WHERE activation_run_id = %s
        """,
        (
            outcome.status,
            outcome.reason,
            outcome.desired,
            outcome.unmatchable,
            outcome.added,
            outcome.removed,
            outcome.unchanged,
            outcome.rejected,
            outcome.pending,
            outcome.requests,
            Jsonb(outcome.match_info),
            run,
        ),
    )
    if outcome.status in ("failed", "synced"):
        conn.execute(
            """
            UPDATE cdp.destination_audiences AS a
               SET failures_in_a_row = CASE WHEN %(failed)s THEN a.failures_in_a_row + 1 ELSE 0 END,
                   last_failed_at = CASE WHEN %(failed)s THEN now() ELSE a.last_failed_at END
              FROM cdp.activation_runs AS r
             WHERE a.destination_id = %(destination_id)s AND a.audience = %(audience)s
               AND r.activation_run_id = %(run)s AND NOT r.dry_run
            """,
            {
                "failed": outcome.status == "failed",
                "destination_id": outcome.destination_id,
                "audience": outcome.audience,
                "run": run,
            },
        )
    conn.commit()


def _is_dry_run(target: DestinationAudience, options: SyncOptions) -> bool:
    return options.dry_run or target.destination.dry_run


def sync_audience(
    conn: psycopg.Connection,
    target: DestinationAudience,
    members: MemberSource,
    platform: Platform,
    options: SyncOptions,
    signature: str | None = None,
) -> SyncOutcome:
    """Bring one destination audience to the desired membership; returns what happened, a
    failure included, as recorded in the history.

    ``signature`` is the audience's membership signature, stored once the sync completes so
    the change sensor knows this membership has been pushed.
    """
    started = time.monotonic()
    destination = target.destination
    outcome = SyncOutcome(destination.destination_id, target.audience, destination.platform, "")
    run = _start_run(conn, target, options, _is_dry_run(target, options))
    try:
        try:
            _sync(conn, target, members, platform, options, run, outcome, signature)
        except AudienceGone as gone:
            conn.rollback()
            outcome = _after_deletion(
                conn, target, members, platform, options, run, signature, gone
            )
    except Exception as error:
        conn.rollback()
        outcome.status, outcome.reason = "failed", error_reason(error)
    finally:
        outcome.seconds = round(time.monotonic() - started, 3)
        _finish_run(conn, run, outcome)
    return outcome


def _after_deletion(
    conn: psycopg.Connection,
    target: DestinationAudience,
    members: MemberSource,
    platform: Platform,
    options: SyncOptions,
    run: int,
    signature: str | None,
    gone: AudienceGone,
) -> SyncOutcome:
    """The platform deleted the audience. Unless the destination says otherwise, forget it
    and what it held and sync again: the audience is created anew and, nothing being
    confirmed any more, every member is sent to it. The reason names the deletion whatever
    follows."""
    destination = target.destination
    outcome = SyncOutcome(
        destination.destination_id, target.audience, destination.platform, "failed"
    )
    if not destination.recreate_deleted_audiences:
        outcome.reason = _deletion_reason(
            gone,
            "; this destination does not recreate deleted audiences: run `cdp destinations"
            f" reset {destination.destination_id} --audience {target.audience}` and the next"
            " run creates it again",
        )
        return outcome
    forget_platform_state(conn, destination.destination_id, target.audience)
    abandon_requests(
        conn, destination.destination_id, target.audience, "audience deleted on the platform"
    )
    conn.commit()
    anew = DestinationAudience(destination, target.audience, target.params, None)
    try:
        created = _sync(conn, anew, members, platform, options, run, outcome, signature)
    except Exception as error:
        conn.rollback()
        outcome.status = "failed"
        outcome.reason = _deletion_reason(
            gone, f"; forgot it, and creating it again failed: {error_reason(error, 200)}"
        )
        return outcome
    done = f"; created {created} and sent every member to it" if created else "; forgot it"
    outcome.reason = _deletion_reason(
        gone, done + (f"; {outcome.reason}" if outcome.reason else "")
    )
    return outcome


def _deletion_reason(gone: AudienceGone, then: str) -> str:
    """The platform's code and message for the deletion, shortened to leave room for what
    became of it."""
    return error_reason(gone, REASON_LENGTH - len(then)) + then


def _sync(
    conn: psycopg.Connection,
    target: DestinationAudience,
    members: MemberSource,
    platform: Platform,
    options: SyncOptions,
    run: int,
    outcome: SyncOutcome,
    signature: str | None,
) -> str | None:
    """One pass of `sync_audience`, filling `outcome`; the platform's id of the audience, or
    None when nothing was to be sent (skipped, refused, a dry run)."""
    destination = target.destination
    dry_run = _is_dry_run(target, options)
    key = {"destination_id": destination.destination_id, "audience": target.audience}
    asynchronous = isinstance(platform, AsynchronousPlatform)
    # The verdicts come first: members they take out or put back change what is to send.
    if isinstance(platform, AsynchronousPlatform) and target.platform_audience_id and not dry_run:
        _settle(conn, key, run, platform, outcome)
    loaded, outcome.unmatchable = _load_fresh(conn, members, platform)
    if members.excluded is not None:
        row = conn.execute(members.excluded, members.params).fetchone()
        outcome.suppressed, outcome.consent_excluded = row if row else (0, 0)
    if options.full_replace:
        loaded += _load_confirmed(conn, members)
    if loaded >= ANALYZE_FROM_ROWS:
        conn.execute("ANALYZE desired_members")
    to_remove = _find_leaving(conn, members, key)
    confirmed, to_add = _counts(conn, key)
    # Every confirmed row that stays is a desired member as the destination holds it.
    outcome.unchanged = confirmed - to_remove
    outcome.desired = outcome.unchanged + to_add
    if options.full_replace:
        to_add, to_remove = outcome.desired, confirmed
    outcome.status, outcome.reason = _verdict(
        outcome.desired, confirmed, to_remove, target, options, dry_run
    )
    if outcome.status in ("skipped", "refused"):
        return None
    if dry_run:
        outcome.added, outcome.removed = to_add, to_remove
        return None
    platform_id = target.platform_audience_id or platform.ensure_audience(target)
    if platform_id != target.platform_audience_id:
        set_platform_audience_id(conn, destination.destination_id, target.audience, platform_id)
        conn.commit()
    # Sent now, the changes would fail or race the platform's own work: the audience waits,
    # its state untouched and its signature not stored, so the next run sends them. With
    # nothing to send, the platform is not asked.
    busy = platform.busy(platform_id) if to_add or to_remove or options.full_replace else None
    if busy is not None:
        outcome.status, outcome.reason = "skipped", f"busy on the platform: {busy}"
        if asynchronous:
            outcome.pending, _ = _pending(conn, key)
        return None
    if to_add or to_remove or options.full_replace:
        # The platform's membership is about to move. Until this sync completes, no stored
        # signature may claim it matches: a sync that fails half-way, then a membership back
        # at the stored one, would otherwise leave the half-sent change on the platform
        # (a run of only the changed audiences would skip it).
        conn.execute(
            f"UPDATE cdp.destination_audiences SET synced_signature = NULL WHERE {_STATE}", key
        )
        conn.commit()
    if options.full_replace:
        _replace(conn, key, run, platform, platform_id, outcome)
    else:
        _send_diff(conn, key, run, platform, platform_id, outcome, to_remove, to_add)
    awaiting = 0
    if asynchronous:
        outcome.pending, awaiting = _pending(conn, key)
    # Nothing sent, nothing asked: an unchanged audience costs the platform no call, and
    # what it reported last still stands.
    outcome.match_info = (
        platform.match_info(platform_id) if outcome.requests else _last_match_info(conn, key)
    )
    if signature is not None and outcome.rejected == 0 and awaiting == 0:
        conn.execute(
            f"UPDATE cdp.destination_audiences SET synced_signature = %(signature)s WHERE {_STATE}",
            {**key, "signature": signature},
        )
    conn.commit()
    outcome.status = "synced"
    return platform_id


def _verdict(
    desired: int,
    confirmed: int,
    to_remove: int,
    target: DestinationAudience,
    options: SyncOptions,
    dry_run: bool,
) -> tuple[str, str | None]:
    destination = target.destination
    if desired < destination.min_audience_size:
        return "skipped", (
            f"{desired} matchable members, below the destination's minimum of"
            f" {destination.min_audience_size}; nothing sent"
        )
    if confirmed and not options.force and to_remove > destination.max_removal_share * confirmed:
        return "refused", (
            f"would remove {to_remove} of {confirmed} confirmed members"
            f" (more than {destination.max_removal_share:.0%}); re-run with force to allow"
        )
    return ("dry_run" if dry_run else "running"), None


def _last_match_info(conn: psycopg.Connection, key: dict[str, str]) -> dict[str, Any]:
    row = conn.execute(
        f"SELECT match_info FROM cdp.activation_runs WHERE {_STATE} AND status = 'synced'"
        " ORDER BY started_at DESC LIMIT 1",
        key,
    ).fetchone()
    return row[0] if row and row[0] else {}


def _send_diff(
    conn: psycopg.Connection,
    key: dict[str, str],
    run: int,
    platform: Platform,
    platform_id: str,
    outcome: SyncOutcome,
    to_remove: int,
    to_add: int,
) -> None:
    """`to_remove` and `to_add`: the counts `_counts` found; a side with none is not read.
    An asynchronous platform processes the removals before it takes the additions: when it
    is still busy with them, the additions wait for a later sync."""
    leaving = _DEPARTURES if isinstance(platform, OverwritingPlatform) else _REMOVALS
    removals = _pages(conn, leaving, key, platform.batch_size) if to_remove else iter(())
    for page in removals:
        result = platform.remove(platform_id, [row for _, _, row in page])
        accepted = [m for i, (m, _, _) in enumerate(page) if i not in result.rejected]
        _hold_removals(conn, key, run, accepted, result.pending)
        conn.execute(
            f"DELETE FROM cdp.destination_members WHERE {_STATE} AND member_key = ANY(%(keys)s)",
            {**key, "keys": accepted},
        )
        _record_rejects(conn, run, page, result, "remove")
        conn.commit()
        outcome.removed += len(accepted)
        outcome.rejected += len(result.rejected)
        outcome.requests += result.requests
    if to_remove and isinstance(platform, AsynchronousPlatform):
        outcome.requests += platform.submit(platform_id)
        busy = platform.busy(platform_id) if to_add else None
        if busy is not None:
            outcome.reason = f"{to_add} additions wait until the platform is done: {busy}"
            return
    additions = _pages(conn, _ADDITIONS, key, platform.batch_size) if to_add else iter(())
    for page in additions:
        result = platform.add(platform_id, [row for _, _, row in page])
        accepted = [m for i, (m, _, _) in enumerate(page) if i not in result.rejected]
        for request, member_keys in _under_requests(conn, key, run, "add", accepted, result):
            _upsert_members(conn, key, member_keys, request)
        _record_rejects(conn, run, page, result, "add")
        conn.commit()
        outcome.added += len(accepted)
        outcome.rejected += len(result.rejected)
        outcome.requests += result.requests
    if to_add and isinstance(platform, AsynchronousPlatform):
        outcome.requests += platform.submit(platform_id)


def _new_request(
    conn: psycopg.Connection,
    key: dict[str, str],
    run: int | None,
    operation: str,
    platform_id: str,
) -> int:
    row = conn.execute(
        "INSERT INTO cdp.destination_requests (destination_id, audience, activation_run_id,"
        " platform_request_id, operation) VALUES (%(destination_id)s, %(audience)s, %(run)s,"
        " %(platform_id)s, %(operation)s) RETURNING request_id",
        {**key, "run": run, "platform_id": platform_id, "operation": operation},
    ).fetchone()
    assert row is not None
    return row[0]


def _under_requests(
    conn: psycopg.Connection,
    key: dict[str, str],
    run: int,
    operation: str,
    accepted: list[str],
    result: BatchResult,
) -> Iterator[tuple[int | None, list[str]]]:
    """The accepted members by the request they await (None: confirmed), each pending
    request recorded."""
    start = 0
    for platform_id, count in result.pending:
        yield _new_request(conn, key, run, operation, platform_id), accepted[start : start + count]
        start += count
    if start < len(accepted):
        yield None, accepted[start:]


def _hold_removals(
    conn: psycopg.Connection,
    key: dict[str, str],
    run: int | None,
    accepted: list[str],
    pending: list[tuple[str, int]],
) -> None:
    """Keep the rows whose removal awaits a verdict with their request, to put back if it
    fails."""
    start = 0
    for platform_id, count in pending:
        request = _new_request(conn, key, run, "remove", platform_id)
        conn.execute(
            f"""
            UPDATE cdp.destination_requests SET members = (
                SELECT coalesce(jsonb_agg(jsonb_build_array(member_key, fingerprint,
                                          source_fingerprint, to_jsonb(identifiers))), '[]')
                FROM cdp.destination_members WHERE {_STATE} AND member_key = ANY(%(keys)s))
            WHERE request_id = %(request)s
            """,
            {**key, "keys": accepted[start : start + count], "request": request},
        )
        start += count


def hold_pending_removals(
    conn: psycopg.Connection,
    destination_id: str,
    audience: str,
    member_keys: list[str],
    pending: list[tuple[str, int]],
) -> None:
    """Removals sent outside a sync (a privacy erase) that the platform has yet to process:
    held as a sync holds its own, so the audience's next sync reads the verdict and confirms
    them, or puts the members back to be removed again. Not committed."""
    key = {"destination_id": destination_id, "audience": audience}
    _hold_removals(conn, key, None, member_keys, pending)


def _upsert_members(
    conn: psycopg.Connection,
    key: dict[str, str],
    member_keys: list[str],
    pending_request: int | None = None,
) -> None:
    conn.execute(
        """
        INSERT INTO cdp.destination_members (destination_id, audience, member_key,
                                             fingerprint, source_fingerprint, identifiers,
                                             pending_request)
        SELECT %(destination_id)s, %(audience)s, member_key, fingerprint, source_fingerprint,
               identifiers, %(request)s
        FROM desired_members WHERE member_key = ANY(%(keys)s)
        ON CONFLICT (destination_id, audience, member_key) DO UPDATE
           SET fingerprint = excluded.fingerprint, identifiers = excluded.identifiers,
               source_fingerprint = excluded.source_fingerprint, confirmed_at = now(),
               pending_request = excluded.pending_request
        """,
        {**key, "keys": member_keys, "request": pending_request},
    )


def _replace(
    conn: psycopg.Connection,
    key: dict[str, str],
    run: int,
    platform: Platform,
    platform_id: str,
    outcome: SyncOutcome,
) -> None:
    """Replace the whole membership; state becomes the desired set once the platform is done,
    less the members it refused (recorded as rejected, sent again next run), those it has yet
    to process held under their request."""
    everything = _pages(
        conn,
        "SELECT member_key, fingerprint, identifiers FROM desired_members"
        " WHERE member_key > %(after)s ORDER BY member_key LIMIT %(size)s",
        key,
        platform.batch_size,
    )
    result = platform.replace(platform_id, ([row for _, _, row in page] for page in everything))
    if isinstance(platform, AsynchronousPlatform):
        outcome.requests += platform.submit(platform_id)
    starts, ends, requests = [], [], []
    start = 0
    for request_id, count in result.pending:
        starts.append(start)
        ends.append(start + count)
        requests.append(_new_request(conn, key, run, "add", request_id))
        start += count
    rejected = sorted(result.rejected)
    conn.execute(
        f"DELETE FROM cdp.destination_members WHERE {_STATE}"
        " AND member_key <> ALL(%(unremoved)s::text[])",
        {**key, "unremoved": list(result.unremoved)},
    )
    # Rows are numbered as they were sent (by member key), then the accepted ones again, as
    # the pending requests count them.
    conn.execute(
        """
        WITH sent AS (
            SELECT d.*, row_number() OVER (ORDER BY member_key) - 1 AS position
            FROM desired_members d
        ), accepted AS (
            SELECT s.*, row_number() OVER (ORDER BY member_key) - 1 AS accepted_position
            FROM sent s WHERE s.position <> ALL(%(rejected)s::bigint[])
        )
        INSERT INTO cdp.destination_members (destination_id, audience, member_key,
                                             fingerprint, source_fingerprint, identifiers,
                                             pending_request)
        SELECT %(destination_id)s, %(audience)s, member_key, fingerprint, source_fingerprint,
               identifiers,
               (SELECT r FROM unnest(%(starts)s::bigint[], %(ends)s::bigint[],
                                     %(requests)s::bigint[]) AS u (s, e, r)
                WHERE accepted_position >= s AND accepted_position < e)
        FROM accepted
        """,
        {**key, "rejected": rejected, "starts": starts, "ends": ends, "requests": requests},
    )
    if rejected:
        conn.execute(
            """
            INSERT INTO cdp.activation_rejects (activation_run_id, member_key, operation, reason)
            SELECT %(run)s, d.member_key, 'add', u.reason
            FROM (SELECT member_key, row_number() OVER (ORDER BY member_key) - 1 AS position
                  FROM desired_members) d
            JOIN unnest(%(positions)s::bigint[], %(reasons)s::text[]) AS u (position, reason)
              USING (position)
            """,
            {
                "run": run,
                "positions": rejected,
                "reasons": [result.rejected[i] for i in rejected],
            },
        )
    if result.unremoved:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO cdp.activation_rejects"
                " (activation_run_id, member_key, operation, reason) VALUES (%s, %s, 'remove', %s)",
                [(run, member_key, reason) for member_key, reason in result.unremoved.items()],
            )
    conn.commit()
    outcome.added = outcome.desired - len(rejected)
    outcome.rejected += len(rejected) + len(result.unremoved)
    outcome.requests += result.requests


def _settle(
    conn: psycopg.Connection,
    key: dict[str, str],
    run: int,
    platform: AsynchronousPlatform,
    outcome: SyncOutcome,
) -> None:
    """Ask the platform for the verdicts of the audience's pending requests and apply those it
    gives. Committed."""
    pending = [
        request_id
        for (request_id,) in conn.execute(
            "SELECT DISTINCT platform_request_id FROM cdp.destination_requests"
            f" WHERE {_STATE} AND status = 'pending' ORDER BY 1",
            key,
        )
    ]
    if not pending:
        return
    for request_id, verdict in platform.request_verdicts(pending).items():
        outcome.rejected += _apply_verdict(conn, key, run, request_id, verdict)
    conn.commit()


def _apply_verdict(
    conn: psycopg.Connection, key: dict[str, str], run: int, request_id: str, verdict: Verdict
) -> int:
    """Confirm the members of a request, or undo what it would have done, recording its
    members as rejected; returns how many were rejected."""
    params = {**key, "run": run, "request_id": request_id, "reason": verdict.failed}
    requests = (
        f"SELECT request_id FROM cdp.destination_requests WHERE {_STATE}"
        " AND platform_request_id = %(request_id)s AND status = 'pending'"
    )
    rejected = 0
    if verdict.failed is None:
        conn.execute(
            "UPDATE cdp.destination_members SET pending_request = NULL, confirmed_at = now()"
            f" WHERE {_STATE} AND pending_request IN ({requests})",
            params,
        )
    else:
        # The members of a failed addition are not on the platform: out of the state, so the
        # next sync sends them again.
        rejected += conn.execute(
            f"""
            WITH undone AS (
                DELETE FROM cdp.destination_members
                WHERE {_STATE} AND pending_request IN ({requests}) RETURNING member_key)
            INSERT INTO cdp.activation_rejects (activation_run_id, member_key, operation, reason)
            SELECT %(run)s, member_key, 'add', %(reason)s FROM undone
            """,
            params,
        ).rowcount
        # Those of a failed removal are still there: back in the state, to be removed again.
        restored = f"""
            SELECT m ->> 0 AS member_key, m ->> 1 AS fingerprint, m ->> 2 AS source_fingerprint,
                   ARRAY(SELECT jsonb_array_elements_text(m -> 3)) AS identifiers
            FROM cdp.destination_requests r, jsonb_array_elements(r.members) m
            WHERE r.request_id IN ({requests}) AND r.operation = 'remove'
        """
        conn.execute(
            f"""
            INSERT INTO cdp.destination_members (destination_id, audience, member_key,
                                                 fingerprint, source_fingerprint, identifiers)
            SELECT %(destination_id)s, %(audience)s, member_key, fingerprint,
                   source_fingerprint, identifiers FROM ({restored}) AS back
            ON CONFLICT (destination_id, audience, member_key) DO NOTHING
            """,
            params,
        )
        rejected += conn.execute(
            "INSERT INTO cdp.activation_rejects (activation_run_id, member_key, operation,"
            f" reason) SELECT %(run)s, member_key, 'remove', %(reason)s FROM ({restored}) AS back",
            params,
        ).rowcount
    # Settled, a removal's rows have no more use (they are gone, or back in the state): kept,
    # they would be the hashes of people erased and suppressed.
    conn.execute(
        "UPDATE cdp.destination_requests SET status = %(status)s, reason = %(reason)s,"
        f" members = '[]', settled_at = now() WHERE request_id IN ({requests})",
        {**params, "status": "confirmed" if verdict.failed is None else "failed"},
    )
    return rejected


def _pending(conn: psycopg.Connection, key: dict[str, str]) -> tuple[int, int]:
    """(members awaiting a verdict, the platform's requests awaiting one) of the audience."""
    row = conn.execute(
        f"""
        SELECT (SELECT count(*) FROM cdp.destination_members
                WHERE {_STATE} AND pending_request IS NOT NULL)
               + (SELECT coalesce(sum(jsonb_array_length(members)), 0)::bigint
                  FROM cdp.destination_requests
                  WHERE {_STATE} AND status = 'pending' AND operation = 'remove'),
               (SELECT count(DISTINCT platform_request_id) FROM cdp.destination_requests
                WHERE {_STATE} AND status = 'pending')
        """,
        key,
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def abandon_requests(
    conn: psycopg.Connection, destination_id: str, audience: str | None, reason: str
) -> int:
    """Close the pending requests of an audience whose platform state was forgotten (every
    audience of the destination when `audience` is None): their verdicts concern an audience
    no longer followed. Not committed."""
    return conn.execute(
        "UPDATE cdp.destination_requests SET status = 'failed', reason = %(reason)s,"
        " settled_at = now() WHERE destination_id = %(destination_id)s"
        " AND (%(audience)s::text IS NULL OR audience = %(audience)s) AND status = 'pending'",
        {"destination_id": destination_id, "audience": audience, "reason": reason},
    ).rowcount
