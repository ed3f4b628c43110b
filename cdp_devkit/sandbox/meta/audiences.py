"""Custom Audience state behind the Meta Graph sandbox: audiences, members and upload rules.

Nothing here speaks HTTP: :mod:`cdp_devkit.sandbox.meta.graph` turns requests into calls on
:class:`AudienceBook` and a raised :class:`GraphError` into Graph's error body. The rules follow
what the Marketing API documents for customer-file audiences (create parameters, the 10,000-row
batch limit, SHA-256 hashing, the ``usersreplace`` session protocol and its 2650 subcodes).

Where Meta documents behaviour but not its exact shape, the sandbox picks one and keeps it stable:

* A member is keyed by its ``EXTERN_ID`` when the row has one, otherwise by the first non-empty
  key in :data:`IDENTITY_PRECEDENCE`. Meta matches people on every key; keying on one keeps the
  sandbox's truth exact, so a removal must carry the key the member was added under.
* ``approximate_count_lower_bound``/``upper_bound`` both equal the member count: no 24-hour lag,
  no rounding, so a test sees the effect of each upload at once.
* ``operation_status`` during a replace is ``{"code": 300, "description": "Replace in
  progress"}``; Meta names the state but the code here is the sandbox's own.

A replace is processed after its last batch lands, as Meta does ("it usually takes up to 24
hours" for the changes to apply, and while a replace runs, adding or removing users fails with
2650 / 1870145 "Audience Update In Progress":
https://developers.facebook.com/docs/marketing-api/reference/custom-audience/usersreplace/).
The new membership is what the sandbox holds from the last batch on, but the audience stays
locked, its ``operation_status`` "Replace in progress", for ``replace_lock_seconds`` more.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_ROWS_PER_REQUEST = 10_000
MAX_CUSTOMER_FILE_AUDIENCES = 500
INVALID_SAMPLE_LIMIT = 100
CUSTOMER_FILE_SOURCES = frozenset(
    {"USER_PROVIDED_ONLY", "PARTNER_PROVIDED_ONLY", "BOTH_USER_AND_PARTNER_PROVIDED"}
)
# EXTERN_ID first (Meta lets advertisers delete by it alone), then the keys that single out a
# person best; the rest only break ties for rows carrying nothing stronger.
IDENTITY_PRECEDENCE: tuple[str, ...] = (
    "EXTERN_ID",
    "EMAIL",
    "PHONE",
    "MADID",
    "FN",
    "LN",
    "FI",
    "CT",
    "ST",
    "ZIP",
    "COUNTRY",
    "GEN",
    "DOBY",
    "DOBM",
    "DOBD",
)
MULTI_KEYS = frozenset(IDENTITY_PRECEDENCE)
UNHASHED_KEYS = frozenset({"EXTERN_ID", "MADID"})
# Single-key schemas send a flat list of values; each stands for one multi-key column.
SINGLE_KEY_SCHEMAS: dict[str, str] = {
    "EMAIL_SHA256": "EMAIL",
    "PHONE_SHA256": "PHONE",
    "MOBILE_ADVERTISER_ID": "MADID",
}
READABLE_FIELDS: tuple[str, ...] = (
    "id",
    "account_id",
    "name",
    "description",
    "subtype",
    "customer_file_source",
    "approximate_count_lower_bound",
    "approximate_count_upper_bound",
    "operation_status",
    "delivery_status",
    "time_created",
    "time_updated",
)

UPDATE_FAILED = 2650  # Graph code shared by every replace-session error
REPLACE_IN_PROGRESS = 1870145
FIRST_BATCH_NOT_SEEN = 1870147
SESSION_FINISHED = 1870159
# How long Meta keeps processing a replace after its last batch: hours in production, a
# fraction of a second by default here so that tests wait little for it.
REPLACE_LOCK_SECONDS = 0.2

_SHA256 = re.compile(r"[0-9a-f]{64}")
_RANK = {key: rank for rank, key in enumerate(IDENTITY_PRECEDENCE)}
_NORMAL = {"code": 200, "description": "Normal"}
_REPLACING = {"code": 300, "description": "Replace in progress"}
_READY = {"code": 200, "description": "This audience is ready for use."}


class GraphError(Exception):
    """A Graph API error; the HTTP layer renders it as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        subcode: int | None = None,
        status: int = 400,
        transient: bool = False,
        user_title: str | None = None,
        user_msg: str | None = None,
        error_type: str = "OAuthException",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.subcode = subcode
        self.status = status
        self.transient = transient
        self.user_title = user_title
        self.user_msg = user_msg
        self.error_type = error_type

    def body(self, fbtrace_id: str) -> dict[str, Any]:
        """Graph's error envelope; optional keys are left out when unset, as Graph does."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.error_type,
            "code": self.code,
            "is_transient": self.transient,
            "fbtrace_id": fbtrace_id,
        }
        if self.subcode is not None:
            error["error_subcode"] = self.subcode
        if self.user_title is not None:
            error["error_user_title"] = self.user_title
        if self.user_msg is not None:
            error["error_user_msg"] = self.user_msg
        return {"error": error}


def invalid_parameter(message: str, **kwargs: Any) -> GraphError:
    return GraphError(100, f"(#100) {message}", **kwargs)


def _mismatch() -> GraphError:
    return invalid_parameter("Data is missing or does not match schema")


@dataclass(frozen=True)
class Batch:
    """A validated payload: valid rows keyed by member identity, and what was dropped."""

    received: int
    rows: dict[str, dict[str, str]]
    invalid: int
    samples: dict[str, str]


def _schema(schema: Any) -> tuple[list[str], bool]:
    """The column keys and whether rows are bare values (a single-key schema)."""
    if isinstance(schema, str):
        if schema in SINGLE_KEY_SCHEMAS:
            return [SINGLE_KEY_SCHEMAS[schema]], True
        raise invalid_parameter(f"Invalid schema: {schema}")
    if not isinstance(schema, list) or not schema:
        raise invalid_parameter("payload.schema must be a key name or a non-empty list of keys")
    for key in schema:
        if key not in MULTI_KEYS:
            raise invalid_parameter(f"Invalid key in multi-key schema: {key}")
    if len(set(schema)) != len(schema):
        raise invalid_parameter("Duplicate key in multi-key schema")
    return list(schema), False


def parse_batch(payload: Any, refused: frozenset[str] = frozenset()) -> Batch:
    """Validate a ``/users`` or ``/usersreplace`` payload.

    Structural problems (schema, row width, batch size) reject the whole request, as Graph does;
    a row with a malformed value or nothing to identify a person by is only dropped and counted,
    and so is a well-formed row holding a value in ``refused`` (Meta's own rejections, e.g. of
    values it deems invalid, that no client-side check can foresee).
    Runs once per row over precomputed column indexes: 10,000 rows take a few tens of ms.
    """
    if not isinstance(payload, dict):
        raise invalid_parameter("param payload must be a JSON object with schema and data")
    keys, flat = _schema(payload.get("schema"))
    data = payload.get("data")
    if not isinstance(data, list) or not data:
        raise _mismatch()
    if len(data) > MAX_ROWS_PER_REQUEST:
        raise invalid_parameter(
            f"Too many rows in one request ({len(data)}): the batch limit is "
            f"{MAX_ROWS_PER_REQUEST} users per request",
            user_title="Batch too large",
            user_msg=f"Split the upload into batches of at most {MAX_ROWS_PER_REQUEST} users.",
        )
    width = len(keys)
    columns = range(width)
    hashed = [i for i in columns if keys[i] not in UNHASHED_KEYS]
    by_rank = sorted(columns, key=lambda i: _RANK[keys[i]])
    fullmatch = _SHA256.fullmatch
    rows: dict[str, dict[str, str]] = {}
    samples: dict[str, str] = {}
    invalid = 0
    for index, raw in enumerate(data):
        if flat:
            if not isinstance(raw, str):
                raise _mismatch()
            row: Sequence[Any] = (raw,)
        elif isinstance(raw, list) and len(raw) == width:
            row = raw
        else:
            raise _mismatch()
        reason = ""
        for i in columns:
            if not isinstance(row[i], str):
                reason = f"{keys[i]} must be a string"
                break
        else:
            for i in hashed:
                value = row[i]
                if value and not fullmatch(value):
                    reason = f"{keys[i]} is not a lowercase hex SHA-256 digest"
                    break
            else:
                identity = next((i for i in by_rank if row[i]), None)
                if identity is None:
                    reason = "row has no non-empty key"
                elif refused and not refused.isdisjoint(row):
                    reason = "row refused by the platform"
                else:
                    rows[f"{keys[identity]}:{row[identity]}"] = {
                        keys[i]: row[i] for i in columns if row[i]
                    }
                    continue
        invalid += 1
        if len(samples) < INVALID_SAMPLE_LIMIT:
            samples[str(index)] = reason
    return Batch(len(data), rows, invalid, samples)


@dataclass(frozen=True)
class Session:
    """The ``session`` form field of an upload."""

    session_id: int
    batch_seq: int | None
    last_batch_flag: bool


def _int(value: Any, name: str) -> int:
    # Graph takes int64 fields as JSON numbers or digit strings alike.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise invalid_parameter(f"session.{name} must be an integer")


def parse_session(value: Any, *, replace: bool, default_id: int) -> Session:
    """Validate ``session``; ``/users`` may omit it (Graph then makes up a session id)."""
    if value is None and not replace:
        return Session(default_id, None, False)
    if not isinstance(value, dict):
        raise invalid_parameter("param session must be a JSON object")
    if replace and ("session_id" not in value or "batch_seq" not in value):
        raise invalid_parameter("session.session_id and session.batch_seq are required")
    session_id = _int(value["session_id"], "session_id") if "session_id" in value else default_id
    batch_seq = _int(value["batch_seq"], "batch_seq") if "batch_seq" in value else None
    if batch_seq is not None and batch_seq < 1:
        raise invalid_parameter("session.batch_seq starts at 1")
    last = value.get("last_batch_flag", False)
    if not isinstance(last, bool):
        raise invalid_parameter("session.last_batch_flag must be a boolean")
    return Session(session_id, batch_seq, last)


def read_fields(raw: Any) -> list[str]:
    """The ``fields`` parameter as a list; an unknown name is Graph's code 100, as for a typo."""
    fields = [name.strip() for name in str(raw or "").split(",") if name.strip()]
    for name in fields:
        if name not in READABLE_FIELDS:
            raise invalid_parameter(
                f"Tried accessing nonexisting field ({name}) on node type (CustomAudience)"
            )
    return fields


@dataclass
class _Replace:
    session_id: int
    staged: dict[str, dict[str, str]] = field(default_factory=dict)
    received: int = 0


@dataclass
class Audience:
    id: str
    account_id: str  # digits, no act_ prefix
    name: str
    description: str
    customer_file_source: str
    time_created: int
    time_updated: int
    members: dict[str, dict[str, str]] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)  # /users session id -> rows so far
    replace: _Replace | None = None
    finished_replaces: set[int] = field(default_factory=set)
    processing_until: float = 0.0  # time.monotonic() at which the last replace is processed

    def replacing(self) -> bool:
        """A replace session is open, or its batches are still being processed."""
        return self.replace is not None or time.monotonic() < self.processing_until

    def read(self, fields: Sequence[str]) -> dict[str, Any]:
        """The Graph node with fields checked by :func:`read_fields` (``id`` always included)."""
        count = len(self.members)
        values: dict[str, Any] = {
            "id": self.id,
            "account_id": self.account_id,
            "name": self.name,
            "description": self.description,
            "subtype": "CUSTOM",
            "customer_file_source": self.customer_file_source,
            "approximate_count_lower_bound": count,
            "approximate_count_upper_bound": count,
            "operation_status": dict(_REPLACING if self.replacing() else _NORMAL),
            "delivery_status": dict(_READY),
            "time_created": self.time_created,
            "time_updated": self.time_updated,
        }
        return {name: values[name] for name in ("id", *fields)}


def _upload_result(
    audience: Audience, session_id: int, received: int, batch: Batch
) -> dict[str, Any]:
    return {
        "audience_id": audience.id,
        "session_id": str(session_id),
        "num_received": received,
        "num_invalid_entries": batch.invalid,
        "invalid_entry_samples": batch.samples,
    }


class AudienceBook:
    """Every audience the sandbox holds, by id and by ad account. Not locked: the caller is."""

    def __init__(self) -> None:
        self.by_id: dict[str, Audience] = {}
        self.by_account: dict[str, list[str]] = {}
        self.refused: frozenset[str] = frozenset()
        self.replace_lock_seconds = REPLACE_LOCK_SECONDS
        # Graph ids are large numeric strings; start in a range that looks like one.
        self._ids = itertools.count(23_851_000_000_000_001)
        self._session_ids = itertools.count(1_000_000_001)

    def create(self, account_id: str, params: dict[str, Any]) -> Audience:
        name = params.get("name")
        if not isinstance(name, str) or not name.strip():
            raise invalid_parameter("The parameter name is required")
        subtype = params.get("subtype")
        if subtype != "CUSTOM":
            raise invalid_parameter(
                f"subtype must be CUSTOM for a customer-file audience, got {subtype!r}"
            )
        source = params.get("customer_file_source")
        if source not in CUSTOMER_FILE_SOURCES:
            raise invalid_parameter(
                "The parameter customer_file_source is required and must be one of "
                + ", ".join(sorted(CUSTOMER_FILE_SOURCES))
            )
        description = params.get("description", "")
        if not isinstance(description, str):
            raise invalid_parameter("description must be a string")
        owned = self.by_account.setdefault(account_id, [])
        if len(owned) >= MAX_CUSTOMER_FILE_AUDIENCES:
            raise invalid_parameter(
                f"Ad account act_{account_id} already has {MAX_CUSTOMER_FILE_AUDIENCES} "
                "customer file custom audiences",
                user_title="Audience limit reached",
                user_msg="Delete an unused customer file audience before creating another.",
            )
        now = int(time.time())
        audience = Audience(str(next(self._ids)), account_id, name, description, source, now, now)
        self.by_id[audience.id] = audience
        owned.append(audience.id)
        return audience

    def in_account(self, account_id: str) -> list[Audience]:
        return [self.by_id[i] for i in self.by_account.get(account_id, [])]

    def delete(self, audience: Audience) -> None:
        """Gone for good, as when deleted in Ads Manager: every later call on its id is
        Graph's error for a missing object."""
        del self.by_id[audience.id]
        self.by_account[audience.account_id].remove(audience.id)

    def update_users(
        self, audience: Audience, payload: Any, session: Any, *, remove: bool
    ) -> dict[str, Any]:
        """``POST /{id}/users`` (add) or its ``DELETE`` form (remove)."""
        if audience.replacing():
            raise GraphError(
                UPDATE_FAILED,
                "Audience update in progress: a replace is running on this audience",
                subcode=REPLACE_IN_PROGRESS,
                user_title="Audience Update In Progress",
                user_msg="Wait for the replace session to finish before adding or removing users.",
            )
        parsed = parse_session(session, replace=False, default_id=next(self._session_ids))
        batch = parse_batch(payload, self.refused)
        if remove:
            for identity in batch.rows:
                audience.members.pop(identity, None)
        else:
            audience.members.update(batch.rows)
        audience.time_updated = int(time.time())
        received = audience.received.get(parsed.session_id, 0) + batch.received
        audience.received[parsed.session_id] = received
        return _upload_result(audience, parsed.session_id, received, batch)

    def replace_users(self, audience: Audience, payload: Any, session: Any) -> dict[str, Any]:
        """One batch of ``POST /{id}/usersreplace``; the last one swaps the staged rows in."""
        parsed = parse_session(session, replace=True, default_id=0)
        batch = parse_batch(payload, self.refused)
        session_id = parsed.session_id
        running = audience.replace
        if session_id in audience.finished_replaces or (
            parsed.batch_seq == 1 and running is not None and running.session_id == session_id
        ):
            raise GraphError(
                UPDATE_FAILED,
                f"Replace session {session_id} has already started or finished; batch_seq 1 "
                "starts a session and a finished session takes no more batches",
                subcode=SESSION_FINISHED,
                user_title="Session Already Finished",
                user_msg="Start a new replace session with a new session_id.",
            )
        if (running is not None and running.session_id != session_id) or (
            running is None and audience.replacing()
        ):
            raise GraphError(
                UPDATE_FAILED,
                "Audience update in progress: an earlier replace session is still running",
                subcode=REPLACE_IN_PROGRESS,
                user_title="Audience Update In Progress",
                user_msg="Only one replace session can run on an audience at a time.",
            )
        if running is None:
            if parsed.batch_seq != 1:
                raise GraphError(
                    UPDATE_FAILED,
                    f"First batch of replace session {session_id} not received: send "
                    "batch_seq 1 first",
                    subcode=FIRST_BATCH_NOT_SEEN,
                    user_title="First Batch Not Received",
                    user_msg="A replace session starts with batch_seq 1.",
                )
            running = audience.replace = _Replace(session_id)
        running.staged.update(batch.rows)
        running.received += batch.received
        if parsed.last_batch_flag:
            audience.members = running.staged
            audience.replace = None
            audience.finished_replaces.add(session_id)
            audience.processing_until = time.monotonic() + self.replace_lock_seconds
            audience.time_updated = int(time.time())
        return _upload_result(audience, session_id, running.received, batch)
