"""Plumbing shared by the Data Manager and Google Ads halves of the Google gRPC sandbox.

Both APIs write to the same Customer Match lists: a Data Manager user list
``accountTypes/GOOGLE_ADS/accounts/{a}/userLists/{n}`` *is* the Google Ads list
``customers/{a}/userLists/{n}``, so :class:`AudienceStore` holds one record per list and each
API renders its own view of it.

Members are keyed by a single identifier: the member's first hashed email, or failing that its
first hashed phone, or failing that its first address, as ``email:<sha256 hex>``,
``phone:<sha256 hex>`` or ``address:<given hex>:<family hex>:<REGION>:<postal>``. Digests are
stored as lowercase hex whatever the request encoding, so a member added in base64 and removed
in hex is the same member. One key per member keeps state and removal simple; the price is that
a removal must carry the identifier the member was keyed by (Google matches on any identifier).

Requests are handled as raw protobuf messages (``ProtoPlusClass.pb()``): proto-plus wraps every
nested access, which is too slow for 10,000-member requests; the dict form of each request for
:class:`RecordedCall` is built only when a test asks for it.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import grpc
import proto
from google.protobuf import any_pb2
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.rpc import status_pb2

from cdp_devkit.sandbox.loopback import RequestLog

# "never_answer" holds the call without an answer until the client's deadline (or the
# sandbox's stop) ends it; the others are the APIs' own errors.
FAULT_KINDS: frozenset[str] = frozenset(
    {"quota", "daily_quota", "unavailable", "internal", "not_allowlisted", "never_answer"}
)
MAX_MEMBERSHIP_DAYS = 540
# Error details travel in trailers, and gRPC clients reject trailers above 8 KiB by default.
MAX_REPORTED_ERRORS = 10

Metadata = tuple[tuple[str, str | bytes], ...]

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


@dataclass(frozen=True)
class RecordedCall:
    """One RPC as the sandbox saw it.

    ``request`` is the message as a dict built on first use: enum names, and field names as the
    protobuf descriptors spell them (google-ads' proto-plus types say ``type_`` for ``type``).
    ``seconds`` is the server-side handling time.
    """

    service: str
    method: str
    metadata: dict[str, str | bytes]
    code: grpc.StatusCode
    seconds: float
    message: Message = field(repr=False)

    @cached_property
    def request(self) -> dict[str, Any]:
        return MessageToDict(self.message, preserving_proto_field_name=True)


@dataclass(frozen=True)
class SandboxUserList:
    """A snapshot of one Customer Match list, with both APIs' names for it."""

    account_id: str
    list_id: int
    display_name: str
    description: str
    membership_days: int
    member_count: int

    @property
    def data_manager_name(self) -> str:
        return data_manager_list_name(self.account_id, self.list_id)

    @property
    def google_ads_resource_name(self) -> str:
        return google_ads_list_name(self.account_id, self.list_id)


def data_manager_list_name(account_id: str, list_id: int) -> str:
    return f"accountTypes/GOOGLE_ADS/accounts/{account_id}/userLists/{list_id}"


def google_ads_list_name(account_id: str, list_id: int) -> str:
    return f"customers/{account_id}/userLists/{list_id}"


@dataclass
class UserListRecord:
    account_id: str
    list_id: int
    display_name: str
    description: str
    integration_code: str
    membership_days: int
    # member key -> server time (epoch seconds) of its last add
    members: dict[str, float] = field(default_factory=dict)

    def snapshot(self) -> SandboxUserList:
        return SandboxUserList(
            self.account_id,
            self.list_id,
            self.display_name,
            self.description,
            self.membership_days,
            len(self.members),
        )


_LIST_REF = re.compile(
    r"(?:accountTypes/GOOGLE_ADS/accounts/\d+/userLists/|customers/\d+/userLists/)?(\d+)"
)


class AudienceStore:
    """Lists and their members. Handlers hold ``lock`` for every read-modify-write."""

    def __init__(self, clock: Callable[[], float], match_rate_percent: int) -> None:
        # Hashed values whose operations Google Ads refuses (partial failure), see refuse().
        self.refused: frozenset[str] = frozenset()
        # Hashed values whose records fail while Data Manager processes an acknowledged
        # request, see fail_in_processing().
        self.failing_in_processing: frozenset[str] = frozenset()
        # Work acknowledged and not yet done, by due time (time.monotonic()): applied by
        # process_due(), which every call and every test accessor runs first.
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        if not 0 <= match_rate_percent <= 100:
            raise ValueError("match_rate_percent must lie in [0, 100]")
        self.clock = clock
        self.match_rate_percent = match_rate_percent
        self.lock = threading.RLock()
        self.lists: dict[int, UserListRecord] = {}
        # Ids look like real user list ids and never collide across accounts.
        self._ids = itertools.count(9_100_000_001)

    def schedule(self, delay_seconds: float, work: Callable[[], None]) -> None:
        """Do `work` once `delay_seconds` have passed, after the work scheduled before it
        (caller holds the lock)."""
        heapq.heappush(self._due, (time.monotonic() + delay_seconds, next(self._order), work))

    def process_due(self, *, everything: bool = False) -> None:
        """Apply the work whose time has come (all of it with `everything`), in order."""
        with self.lock:
            now = time.monotonic()
            while self._due and (everything or self._due[0][0] <= now):
                heapq.heappop(self._due)[2]()

    def find(self, account_id: str, list_id: int) -> UserListRecord | None:
        record = self.lists.get(list_id)
        return record if record is not None and record.account_id == account_id else None

    def name_taken(self, account_id: str, display_name: str) -> bool:
        return any(
            r.account_id == account_id and r.display_name == display_name
            for r in self.lists.values()
        )

    def create(
        self,
        account_id: str,
        display_name: str,
        description: str,
        integration_code: str,
        membership_days: int,
    ) -> UserListRecord:
        record = UserListRecord(
            account_id,
            next(self._ids),
            display_name,
            description,
            integration_code,
            membership_days,
        )
        self.lists[record.list_id] = record
        return record

    def remove(self, record: UserListRecord) -> None:
        """Gone for both APIs, members and name included: a later call naming it fails as for
        a list that never existed."""
        del self.lists[record.list_id]

    def resolve(self, ref: int | str) -> UserListRecord:
        """A list by id or by either API's resource name (test accessor)."""
        match = _LIST_REF.fullmatch(str(ref))
        record = self.lists.get(int(match.group(1))) if match else None
        if record is None:
            raise KeyError(f"no user list {ref!r}")
        return record

    def match_rate_suffix(self) -> str:
        """Bucket suffix shared by both APIs' match-rate enums, e.g. ``71_TO_80``."""
        pct = self.match_rate_percent
        if pct < 20:
            return "LESS_THAN_20"
        if pct <= 30:
            return "20_TO_30"
        low = (pct - 1) // 10 * 10 + 1
        return f"{low}_TO_{low + 9}"


class RpcFailure(Exception):
    """Raised by a handler; the dispatcher turns it into a gRPC error with rich details."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        details: Sequence[Message] = (),
        trailing: Metadata = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = tuple(details)
        self.trailing = trailing

    def status(self, extra_trailing: Metadata) -> grpc.Status:
        rich = status_pb2.Status(
            code=self.code.value[0], message=self.message, details=[pack(d) for d in self.details]
        )
        # The client's grpc_status.rpc_status.from_call insists message == details().
        trailing = (
            ("grpc-status-details-bin", rich.SerializeToString()),
            *self.trailing,
            *extra_trailing,
        )
        return _WireStatus(self.code, self.message, trailing)


@dataclass(frozen=True)
class _WireStatus(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: Metadata


def pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def pb_class(message_class: type) -> type[Message]:
    """The protobuf class behind a proto-plus class (protobuf classes pass through)."""
    if issubclass(message_class, proto.Message):
        return message_class.pb()
    return message_class


def serialize(message: Message | proto.Message) -> bytes:
    if isinstance(message, proto.Message):
        return type(message).serialize(message)
    return message.SerializeToString()


def sha256_key(value: str, base64_encoded: bool) -> tuple[str | None, str | None]:
    """(lowercase hex digest, None) or (None, reason) with Data Manager's reason names."""
    if base64_encoded:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None, "INVALID_BASE64_ENCODING"
        return (raw.hex(), None) if len(raw) == 32 else (None, "INVALID_SHA256_FORMAT")
    if _HEX_SHA256.fullmatch(value):
        return value.lower(), None
    if _HEX.fullmatch(value):
        return None, "INVALID_SHA256_FORMAT"
    return None, "INVALID_HEX_ENCODING"


@dataclass(frozen=True)
class Call:
    """What a handler learns about the call besides the request."""

    method: str
    metadata: Mapping[str, str | bytes]
    request_id: str


Handler = Callable[[Message, Call], Any]


@dataclass(frozen=True)
class Rpc:
    service: str
    method: str
    request_class: type
    handler: Handler
    streaming: bool = False


class Api(Protocol):
    """One Google API served by the sandbox."""

    def rpcs(self) -> list[Rpc]: ...

    def admit(self, call: Call) -> None:
        """Header checks that precede everything else (raise :class:`RpcFailure`)."""

    def fault(self, kind: str, call: Call) -> RpcFailure: ...

    def trailers(self, call: Call) -> Metadata:
        """Trailing metadata sent with every response, success or failure."""


class FaultQueue:
    """Pending faults per RPC method name, consumed one per call in injection order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, list[str]] = {}

    def inject(self, method: str, kind: str, times: int) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._pending.setdefault(method, []).extend([kind] * times)

    def take(self, method: str) -> str | None:
        with self._lock:
            queue = self._pending.get(method)
            return queue.pop(0) if queue else None

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()


class Dispatcher:
    """Builds the gRPC method handlers: headers, faults, handler, recording, error delivery."""

    def __init__(self, request_log: RequestLog[RecordedCall], faults: FaultQueue) -> None:
        self._request_log = request_log
        self._faults = faults
        self._request_ids = itertools.count(1)

    def generic_handlers(self, api: Api) -> list[grpc.GenericRpcHandler]:
        by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for rpc in api.rpcs():
            by_service.setdefault(rpc.service, {})[rpc.method] = self._method_handler(api, rpc)
        return [grpc.method_handlers_generic_handler(s, m) for s, m in by_service.items()]

    def _method_handler(self, api: Api, rpc: Rpc) -> grpc.RpcMethodHandler:
        deserializer = pb_class(rpc.request_class).FromString
        if rpc.streaming:

            def stream(request: Message, context: grpc.ServicerContext) -> Iterator[Any]:
                # Computed eagerly so that errors surface before the first message.
                yield from self._run(api, rpc, request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=deserializer, response_serializer=serialize
            )

        def unary(request: Message, context: grpc.ServicerContext) -> Any:
            return self._run(api, rpc, request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=deserializer, response_serializer=serialize
        )

    def _run(self, api: Api, rpc: Rpc, request: Message, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        metadata = {m.key: m.value for m in context.invocation_metadata()}
        call = Call(rpc.method, metadata, f"sandbox-{next(self._request_ids):08d}")
        code = grpc.StatusCode.OK
        try:
            api.admit(call)
            kind = self._faults.take(rpc.method)
            if kind == "never_answer":
                while context.is_active():
                    time.sleep(0.05)
                raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer was given")
            if kind is not None:
                raise api.fault(kind, call)
            response = rpc.handler(request, call)
            if rpc.streaming:
                response = list(response)
        except RpcFailure as failure:
            code = failure.code
            context.abort_with_status(failure.status(api.trailers(call)))
        except Exception:
            code = grpc.StatusCode.UNKNOWN  # what grpc reports for a handler crash
            raise
        finally:
            seconds = time.perf_counter() - started
            self._request_log.add(
                RecordedCall(rpc.service, rpc.method, metadata, code, seconds, request)
            )
        context.set_trailing_metadata(api.trailers(call))
        return response
