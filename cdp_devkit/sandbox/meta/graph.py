"""Loopback Meta Graph API sandbox for customer-file Custom Audiences.

:class:`MetaSandbox` serves the Graph paths ``facebook-business`` uses for Custom Audiences on
``127.0.0.1`` from a uvicorn thread, so the real SDK can be tested end to end::

    with MetaSandbox({"tok": ["act_123"]}) as sandbox:
        session = FacebookSession(access_token="tok")
        session.GRAPH = sandbox.graph_url  # instance attribute; the class default stays intact
        api = FacebookAdsApi(session)  # not FacebookAdsApi.init(): that installs a crash reporter

Routes, under any ``/v{N}.{M}`` version prefix: ``GET``/``POST /act_{id}/customaudiences``,
``GET``/``DELETE /{audience_id}``, ``POST``/``DELETE /{audience_id}/users`` (``POST`` with
``method=DELETE`` removes) and ``POST /{audience_id}/usersreplace``; any other path or method
is Graph's "Unsupported request" error (code 100, subcode 33). Deleting an audience answers
``{"success": true}`` and, as the Custom Audience reference's "Deleting" section has it
(https://developers.facebook.com/docs/marketing-api/reference/custom-audience#Deleting),
removes it: every later call on it or its edges is that same missing-object error, HTTP 400.
Audience rules live in :mod:`cdp_devkit.sandbox.meta.audiences`.

Each Graph request goes through, in order:

1. URL length: over :data:`MAX_URL_BYTES` is answered 414 with an HTML page, as a front-end proxy
   would. The SDK's ``delete_users``/``remove_users`` put the whole payload in the query string,
   which is why they fail on batches of a few hundred rows in production.
2. Injected faults (:meth:`MetaSandbox.inject`), answered before any state is touched.
3. The access token (code 190 if unknown) and the ad account it may use (code 200 if not).
   With ``app_secret`` the app has "Require App Secret" on: a call without
   ``appsecret_proof`` (HMAC-SHA256 of the token keyed by the secret) or with a wrong one is
   refused with Graph's code 100, as "Securing Requests" describes
   (https://developers.facebook.com/docs/graph-api/securing-requests#appsecret_proof).
4. The route's handler.

Listings are paged as the Graph API pages an edge ("Paginated Results",
https://developers.facebook.com/docs/graph-api/results): ``limit`` objects a page (25 unless the
request asks otherwise), ``paging.cursors.before/after``, and ``paging.next`` while more remain.

Calls on an ad account count against its Business Use Case limit, reported on every answer in
``X-Business-Use-Case-Usage`` (``{"<account id>": [{"type": "custom_audience", "call_count",
"total_cputime", "total_time", "estimated_time_to_regain_access"}]}``, percentages and minutes)
and ``X-Ad-Account-Usage`` (``{"acc_id_util_pct", "reset_time_duration",
"ads_api_access_tier"}``), as "Marketing API Rate Limiting" describes
(https://developers.facebook.com/docs/marketing-api/overview/rate-limiting). Past 100 % of
:attr:`GraphLimits.calls_per_window` calls in the rolling window, every call on the account is
answered 80003 for :attr:`GraphLimits.throttle_seconds`. The three percentages are the same
number here: the sandbox counts calls, not CPU time.

Every request, whatever its outcome, is recorded with ``payload``/``session`` parsed from JSON.
State is guarded by one lock: handlers run in Starlette's threadpool while tests read the state
from their own thread.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import math
import re
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cdp_devkit.sandbox.loopback import LoopbackSandbox, RequestLog
from cdp_devkit.sandbox.meta.audiences import (
    READABLE_FIELDS,
    REPLACE_LOCK_SECONDS,
    Audience,
    AudienceBook,
    GraphError,
    invalid_parameter,
    read_fields,
)

MAX_URL_BYTES = 16 * 1024
DEFAULT_PAGE_SIZE = 25
MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class GraphLimits:
    """How the sandbox paces its callers. The defaults keep tests fast and never throttle."""

    replace_lock_seconds: float = REPLACE_LOCK_SECONDS
    calls_per_window: int = 1_000_000
    window_seconds: float = 3600.0
    throttle_seconds: float = 300.0


def _throttled() -> GraphError:
    return GraphError(
        80003,
        "(#80003) There have been too many calls to this ad-account. Wait a bit and try again.",
        subcode=2446289,
        transient=True,
    )


# Faults answered with a Graph error body ("bad_gateway_html" is the one that is not). Built per
# request: re-raising one exception instance would keep growing its traceback.
_FAULT_ERRORS: dict[str, Callable[[], GraphError]] = {
    "rate_limit": _throttled,
    "user_rate_limit": partial(
        GraphError, 17, "(#17) User request limit reached", subcode=2446079, transient=True
    ),
    "account_rate_limit": partial(
        GraphError,
        613,
        "(#613) Calls to this api have exceeded the rate limit.",
        subcode=1487742,
        transient=True,
    ),
    "app_rate_limit": partial(
        GraphError, 4, "(#4) Application request limit reached", transient=True
    ),
    "server_error": partial(
        GraphError,
        2,
        "An unexpected error has occurred. Please retry your request later.",
        status=500,
        transient=True,
    ),
    "invalid_parameter": partial(invalid_parameter, "Invalid parameter"),
    "sensitive_category": partial(
        GraphError,
        100,
        "Invalid parameter",
        subcode=1713230,
        user_title="Audience Upload Blocked",
        user_msg="Resolve the integrity restrictions on this customer file audience before "
        "updating its members.",
    ),
}
# "token_echo": Graph's code 190 for a token it cannot parse quotes the token ("Malformed access
# token ...", OAuthException; https://developers.facebook.com/docs/graph-api/guides/error-handling).
# "never_answer": the request is held without an answer until the client gives up.
META_FAULT_KINDS: tuple[str, ...] = (
    *_FAULT_ERRORS,
    "bad_gateway_html",
    "token_echo",
    "never_answer",
)
_APPSECRET_PROOF_MISSING = "API calls from the server require an appsecret_proof argument"
_APPSECRET_PROOF_INVALID = "Invalid appsecret_proof provided in the API argument"

_JSON = "application/json"
_HTML = "text/html"
_JSON_PARAMS = ("payload", "session")
_VERSION = re.compile(r"v\d+\.\d+")
_BAD_GATEWAY = (
    b"<html><head><title>502 Bad Gateway</title></head><body>"
    b"<center><h1>502 Bad Gateway</h1></center></body></html>"
)
_URI_TOO_LONG = (
    b"<html><head><title>414 Request-URI Too Large</title></head><body>"
    b"<center><h1>414 Request-URI Too Large</h1></center></body></html>"
)
# h11 rejects a request line longer than this with a bare 400 before the app sees it; keep it
# far above MAX_URL_BYTES so oversized URLs get the sandbox's 414 instead.
_H11_MAX_EVENT_BYTES = 64 * 1024 * 1024
_ALL_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH"]


@dataclass(frozen=True)
class RecordedRequest:
    """One Graph request as the sandbox saw it; ``payload``/``session`` are parsed JSON."""

    method: str
    path: str
    query: dict[str, Any]
    form: dict[str, Any]
    status: int
    at: float  # time.time() when it arrived
    seconds: float  # server-side handling time
    fault: str | None  # injected fault kind that answered it

    @property
    def payload(self) -> Any:
        """The upload payload, from the body or (for a real ``DELETE``) the query string."""
        return self.form.get("payload", self.query.get("payload"))

    @property
    def session(self) -> Any:
        return self.form.get("session", self.query.get("session"))


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    media_type: str
    headers: dict[str, str] = field(default_factory=dict)


def _account_id(value: str) -> str:
    digits = str(value).removeprefix("act_")
    if not digits.isdigit():
        raise ValueError(f"not an ad account id: {value!r}")
    return digits


def _params(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    params: dict[str, Any] = dict(pairs)
    for name in _JSON_PARAMS:
        if name in params:
            # Left as text if it is not JSON: the handler reports it as an invalid parameter.
            with contextlib.suppress(orjson.JSONDecodeError):
                params[name] = orjson.loads(params[name])
    return params


def _unsupported(method: str, node: str) -> GraphError:
    """Graph's answer for a node that does not exist (or that the token may not read), as the
    live API words it (facebook/facebook-python-business-sdk#239)."""
    return GraphError(
        100,
        f"Unsupported {method.lower()} request. Object with ID '{node}' does not exist, cannot "
        "be loaded due to missing permissions, or does not support this operation. Please read "
        "the Graph API documentation at https://developers.facebook.com/docs/graph-api",
        subcode=33,
        error_type="GraphMethodException",
    )


def _permission_error(what: str) -> GraphError:
    return GraphError(
        200,
        "(#200) Permissions error",
        user_title="Permissions error",
        user_msg=f"The access token may not use {what}.",
    )


@dataclass(frozen=True)
class _Call:
    graph: _Graph
    accounts: frozenset[str]
    method: str  # HTTP method as sent
    path: str
    path_params: dict[str, str]
    params: dict[str, Any]  # query and form fields merged, as Graph reads them
    headers: dict[str, str] = field(default_factory=dict)  # usage headers of the answer

    def account(self) -> str:
        account = self.path_params["account"]
        if account not in self.accounts:
            raise _permission_error(f"ad account act_{account}")
        self.graph.usage.admit(account, self.headers)
        return account

    def audience(self) -> Audience:
        audience_id = self.path_params["audience_id"]
        audience = self.graph.book.by_id.get(audience_id)
        if audience is None:
            raise _unsupported(self.method, audience_id)
        if audience.account_id not in self.accounts:
            raise _permission_error(f"custom audience {audience_id}")
        self.graph.usage.admit(audience.account_id, self.headers)
        return audience

    def required(self, name: str) -> Any:
        if name not in self.params:
            raise invalid_parameter(f"The parameter {name} is required")
        return self.params[name]


Handler = Callable[[_Call], dict[str, Any]]


def _cursor(audience_id: str) -> str:
    return base64.urlsafe_b64encode(audience_id.encode()).decode()


def _page_size(raw: Any) -> int:
    if raw is None:
        return DEFAULT_PAGE_SIZE
    if not str(raw).isdigit() or not 1 <= int(raw) <= MAX_PAGE_SIZE:
        raise invalid_parameter(f"limit must be an integer from 1 to {MAX_PAGE_SIZE}")
    return int(raw)


def _list_audiences(call: _Call) -> dict[str, Any]:
    fields = read_fields(call.params.get("fields"))
    size = _page_size(call.params.get("limit"))
    audiences = call.graph.book.in_account(call.account())
    start = 0
    after = call.params.get("after")
    if after:
        ids = [_cursor(audience.id) for audience in audiences]
        if after not in ids:
            raise invalid_parameter("The after cursor is not valid")
        start = ids.index(after) + 1
    data = [audience.read(fields) for audience in audiences[start : start + size]]
    if not data:
        return {"data": []}
    cursors = {"before": _cursor(data[0]["id"]), "after": _cursor(data[-1]["id"])}
    paging: dict[str, Any] = {"cursors": cursors}
    if start + size < len(audiences):
        query = {"limit": size, "after": cursors["after"]}
        if call.params.get("fields"):
            query["fields"] = call.params["fields"]
        paging["next"] = f"{call.graph.base_url}{call.path}?{urlencode(query)}"
    return {"data": data, "paging": paging}


def _create_audience(call: _Call) -> dict[str, Any]:
    return {"id": call.graph.book.create(call.account(), call.params).id}


def _read_audience(call: _Call) -> dict[str, Any]:
    return call.audience().read(read_fields(call.params.get("fields")))


def _delete_audience(call: _Call) -> dict[str, Any]:
    call.graph.book.delete(call.audience())
    return {"success": True}


def _users(call: _Call) -> dict[str, Any]:
    remove = call.method == "DELETE" or str(call.params.get("method", "")).upper() == "DELETE"
    return call.graph.book.update_users(
        call.audience(), call.required("payload"), call.params.get("session"), remove=remove
    )


def _users_replace(call: _Call) -> dict[str, Any]:
    return call.graph.book.replace_users(
        call.audience(), call.required("payload"), call.required("session")
    )


def _no_route(call: _Call) -> dict[str, Any]:
    segments = [segment for segment in call.path_params["path"].split("/") if segment]
    raise _unsupported(call.method, segments[-1] if segments else "")


def minutes_to_regain(until: float, now: float) -> int:
    """The throttle's wait in whole minutes, as Meta reports it, from the wait to the
    millisecond: a float sum such as now + 300 - now may exceed 300 by a hair and round up a
    minute too many."""
    return math.ceil(round(until - now, 3) / 60) if until > now else 0


class _Usage:
    """Calls per ad account in the rolling window, and the accounts throttled until when."""

    def __init__(self, limits: GraphLimits) -> None:
        self.limits = limits
        self.calls: defaultdict[str, deque[float]] = defaultdict(deque)
        self.throttled_until: dict[str, float] = {}

    def record(self, account: str, calls: int) -> None:
        self.calls[account].extend([time.monotonic()] * calls)

    def admit(self, account: str, headers: dict[str, str]) -> None:
        """Count a call on the account, or refuse it with 80003 while the account is
        throttled; the answer's usage headers go into ``headers`` either way."""
        now = time.monotonic()
        limits = self.limits
        calls = self.calls[account]
        while calls and calls[0] <= now - limits.window_seconds:
            calls.popleft()
        until = self.throttled_until.get(account, 0.0)
        if until <= now:
            calls.append(now)
            if len(calls) > limits.calls_per_window:
                until = self.throttled_until[account] = now + limits.throttle_seconds
        percent = min(100, round(100 * len(calls) / limits.calls_per_window))
        regain = minutes_to_regain(until, now)
        usage = {
            "type": "custom_audience",
            "call_count": percent,
            "total_cputime": percent,
            "total_time": percent,
            "estimated_time_to_regain_access": regain,
            "ads_api_access_tier": "standard_access",
        }
        headers["X-Business-Use-Case-Usage"] = orjson.dumps({account: [usage]}).decode()
        headers["X-Ad-Account-Usage"] = orjson.dumps(
            {
                "acc_id_util_pct": percent,
                "reset_time_duration": round(max(until - now, 0)),
                "ads_api_access_tier": "standard_access",
            }
        ).decode()
        if until > now:
            raise _throttled()


class _Graph:
    """Everything the app serves and records, guarded by ``lock``."""

    def __init__(
        self,
        access_tokens: Mapping[str, Iterable[str]],
        app_secret: str | None = None,
        limits: GraphLimits = GraphLimits(),
    ) -> None:
        self.app_secret = app_secret
        self.default_limits = limits
        self.usage = _Usage(limits)
        self.base_url = ""  # the sandbox's own URL, for paging links
        self.tokens: dict[str, frozenset[str]] = {}
        for token, accounts in access_tokens.items():
            if isinstance(accounts, str):
                raise TypeError(f"accounts of token {token!r} must be a collection of ids")
            self.tokens[token] = frozenset(_account_id(account) for account in accounts)
        self.book = AudienceBook()
        self.book.replace_lock_seconds = limits.replace_lock_seconds
        self.lock = threading.Lock()
        self.recorded: RequestLog[RecordedRequest] = RequestLog()
        # (kind, path_contains, method or None for any), oldest first
        self.faults: deque[tuple[str, str, str | None]] = deque()
        self._trace_ids = itertools.count(1)

    def handle(
        self,
        handler: Handler,
        method: str,
        path: str,
        path_params: dict[str, str],
        query_string: bytes,
        body: bytes,
        url_bytes: int,
    ) -> _Reply | None:
        """The reply, or None for a request never to be answered."""
        arrived = time.time()
        started = time.perf_counter()
        # Parsing a 10,000-row body takes most of the request's time, so it stays outside the lock.
        query = _params(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
        form = _params(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        with self.lock:
            fault = None
            call: _Call | None = None
            try:
                if url_bytes > MAX_URL_BYTES:
                    reply = _Reply(414, _URI_TOO_LONG, _HTML)
                else:
                    # Graph takes a `method` parameter for the verb: a removal is DELETE
                    # /{id}/users or the same POST with method=DELETE (https://developers.
                    # facebook.com/docs/marketing-api/audiences/guides/custom-audiences
                    # #remove). A fault meant for one verb matches either form.
                    verb = str({**query, **form}.get("method", method)).upper()
                    fault = self._take_fault(path, verb)
                    if fault == "bad_gateway_html":
                        reply = _Reply(502, _BAD_GATEWAY, _HTML)
                    elif fault == "never_answer":
                        reply = None
                    elif fault == "token_echo":
                        token = {**query, **form}.get("access_token", "")
                        raise GraphError(190, f"Malformed access token {token}")
                    elif fault is not None:
                        raise _FAULT_ERRORS[fault]()
                    else:
                        call = self._call(method, path, path_params, {**query, **form})
                        reply = _Reply(200, orjson.dumps(handler(call)), _JSON, call.headers)
            except GraphError as error:
                trace_id = f"SandboxTrace{next(self._trace_ids):010d}"
                headers = call.headers if call is not None else {}
                reply = _Reply(error.status, orjson.dumps(error.body(trace_id)), _JSON, headers)
            self.recorded.add(
                RecordedRequest(
                    method,
                    path,
                    query,
                    form,
                    reply.status if reply is not None else 0,
                    arrived,
                    time.perf_counter() - started,
                    fault,
                )
            )
        return reply

    def _call(
        self, method: str, path: str, path_params: dict[str, str], params: dict[str, Any]
    ) -> _Call:
        token = params.get("access_token")
        if not token:
            raise GraphError(190, "An access token is required to request this resource.")
        accounts = self.tokens.get(token)
        if accounts is None:
            raise GraphError(190, "Invalid OAuth access token - Cannot parse access token")
        if self.app_secret is not None:
            proof = params.get("appsecret_proof")
            if not proof:
                raise GraphError(100, _APPSECRET_PROOF_MISSING, error_type="GraphMethodException")
            expected = hmac.new(self.app_secret.encode(), token.encode(), hashlib.sha256)
            if not hmac.compare_digest(str(proof), expected.hexdigest()):
                raise GraphError(100, _APPSECRET_PROOF_INVALID, error_type="GraphMethodException")
        version = path_params.get("version")
        if version is not None and not _VERSION.fullmatch(version):
            raise _unsupported(method, path)
        return _Call(self, accounts, method, path, path_params, params)

    def _take_fault(self, path: str, verb: str) -> str | None:
        for index, (kind, path_contains, method) in enumerate(self.faults):
            if path_contains in path and method in (None, verb):
                del self.faults[index]
                return kind
        return None

    def requests(self, path_contains: str | None) -> list[RecordedRequest]:
        return self.recorded.matching(lambda r: path_contains is None or path_contains in r.path)

    def audiences(self, account_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a.read(READABLE_FIELDS) for a in self.book.in_account(account_id)]

    def accounts(self) -> list[str]:
        with self.lock:
            known = set(self.book.by_account).union(*self.tokens.values())
        return sorted(known)


def _graph_route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        graph: _Graph = request.app.state.graph
        scope = request.scope
        query_string: bytes = scope["query_string"]
        url_bytes = len(scope["raw_path"]) + (len(query_string) + 1 if query_string else 0)
        body = await request.body()
        reply = await run_in_threadpool(
            graph.handle,
            handler,
            request.method,
            scope["path"],
            dict(request.path_params),
            query_string,
            body,
            url_bytes,
        )
        if reply is None:  # never answered: held until the client gives up
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return Response(b"", status_code=504)
        return Response(
            reply.body, status_code=reply.status, media_type=reply.media_type, headers=reply.headers
        )

    return endpoint


async def _admin_requests(request: Request) -> Response:
    graph: _Graph = request.app.state.graph
    recorded = graph.requests(request.query_params.get("path_contains"))
    return Response(orjson.dumps([asdict(r) for r in recorded]), media_type=_JSON)


async def _admin_audiences(request: Request) -> Response:
    graph: _Graph = request.app.state.graph
    body = {f"act_{account}": graph.audiences(account) for account in graph.accounts()}
    return Response(orjson.dumps(body), media_type=_JSON)


def _build_app(graph: _Graph) -> Starlette:
    graph_api = "/{version}"
    routes = [
        # Before the Graph routes, which would otherwise take "_sandbox" for a version.
        Route("/_sandbox/requests", _admin_requests, methods=["GET"]),
        Route("/_sandbox/audiences", _admin_audiences, methods=["GET"]),
        Route(
            f"{graph_api}/act_{{account}}/customaudiences",
            _graph_route(_list_audiences),
            methods=["GET"],
        ),
        Route(
            f"{graph_api}/act_{{account}}/customaudiences",
            _graph_route(_create_audience),
            methods=["POST"],
        ),
        Route(
            f"{graph_api}/{{audience_id}}/users", _graph_route(_users), methods=["POST", "DELETE"]
        ),
        Route(
            f"{graph_api}/{{audience_id}}/usersreplace",
            _graph_route(_users_replace),
            methods=["POST"],
        ),
        # The SDK reads and deletes a node as "/{id}/" (its endpoint is "/"); curl users write
        # "/{id}".
        Route(f"{graph_api}/{{audience_id}}/", _graph_route(_read_audience), methods=["GET"]),
        Route(f"{graph_api}/{{audience_id}}", _graph_route(_read_audience), methods=["GET"]),
        Route(f"{graph_api}/{{audience_id}}/", _graph_route(_delete_audience), methods=["DELETE"]),
        Route(f"{graph_api}/{{audience_id}}", _graph_route(_delete_audience), methods=["DELETE"]),
        # Also catches known paths with the wrong method: Starlette's plain-text 404/405 bodies
        # would read as success to the SDK, which judges a response by its body.
        Route("/{path:path}", _graph_route(_no_route), methods=_ALL_METHODS),
    ]
    app = Starlette(routes=routes)
    app.state.graph = graph
    return app


class MetaSandbox(LoopbackSandbox[RecordedRequest]):
    """The Graph sandbox on an ephemeral 127.0.0.1 port, served from a background thread.

    ``access_tokens`` maps each accepted token to the ad accounts (``act_123`` or ``123``) it may
    use; ``app_secret``, when given, is the app's secret with "Require App Secret" on. Use as a
    context manager, or call :meth:`start` and :meth:`stop`.
    """

    platform = "Meta"

    def __init__(
        self,
        access_tokens: Mapping[str, Iterable[str]],
        *,
        app_secret: str | None = None,
        limits: GraphLimits = GraphLimits(),
    ) -> None:
        self._graph = _Graph(access_tokens, app_secret, limits)
        super().__init__(self._graph.recorded)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None

    @property
    def graph_url(self) -> str:
        """What to assign to ``FacebookSession.GRAPH``."""
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> int:
        # Bound here rather than by uvicorn so the port is known before the thread runs.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self._listener = listener
        port: int = listener.getsockname()[1]
        self._graph.base_url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            _build_app(self._graph),
            http="h11",
            h11_max_incomplete_event_size=_H11_MAX_EVENT_BYTES,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            # A request held unanswered must not hold the sandbox's stop.
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [listener]},
            name=f"meta-sandbox-{port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._shut_down()
                raise RuntimeError("the Meta sandbox did not start")
            time.sleep(0.01)
        return port

    def _shut_down(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._listener is not None:
            self._listener.close()
        self._server = self._thread = self._listener = None

    def requests(self, path_contains: str | None = None) -> list[RecordedRequest]:
        """Recorded Graph requests, oldest first, optionally only paths containing a substring."""
        return self._graph.requests(path_contains)

    def members(self, audience_id: str) -> list[dict[str, str]]:
        """The audience's members, each as its last uploaded row without empty keys.

        Raises ``KeyError`` for an audience id the sandbox never created.
        """
        with self._graph.lock:
            audience = self._graph.book.by_id[audience_id]
            return [dict(row) for row in audience.members.values()]

    def audiences(self, account_id: str) -> list[dict[str, Any]]:
        """The account's audiences with every readable Graph field, oldest first."""
        return self._graph.audiences(_account_id(account_id))

    def inject(
        self,
        fault: str,
        *,
        times: int = 1,
        path_contains: str = "/users",
        method: str | None = None,
    ) -> None:
        """Answer the next ``times`` requests whose path contains ``path_contains`` (and whose
        verb is ``method``, when given: ``"DELETE"`` for removals, ``"POST"`` for additions)
        with a fault.

        Queued faults are consumed in order by matching requests (``"/users"`` also matches
        ``/usersreplace``). A faulted request never reaches its handler, so membership is
        unchanged. Kinds: :data:`META_FAULT_KINDS`.
        """
        if fault not in META_FAULT_KINDS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {META_FAULT_KINDS}")
        if times < 1:
            raise ValueError("times must be at least 1")
        with self._graph.lock:
            self._graph.faults.extend([(fault, path_contains, method)] * times)

    def clear_faults(self) -> None:
        """Forget injected faults, refused values, usage and throttling, and go back to the
        limits the sandbox was started with."""
        with self._graph.lock:
            self._graph.faults.clear()
            self._graph.book.refused = frozenset()
        self.set_limits(self._graph.default_limits)

    def set_limits(self, limits: GraphLimits) -> None:
        """Pace callers by these limits from now on, with no call counted yet."""
        with self._graph.lock:
            self._graph.usage = _Usage(limits)
            self._graph.book.replace_lock_seconds = limits.replace_lock_seconds

    def use(self, account_id: str, calls: int) -> None:
        """Count ``calls`` calls on the ad account now, as another app of the business would."""
        with self._graph.lock:
            self._graph.usage.record(_account_id(account_id), calls)

    def refuse(self, values: Iterable[str]) -> None:
        """Drop rows holding any of these values as invalid (counted, sampled by row index),
        as Meta does with rows it will not accept; ``clear_faults`` forgets them."""
        with self._graph.lock:
            self._graph.book.refused = frozenset(values)
