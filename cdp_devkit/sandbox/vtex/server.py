"""HTTP side of the sandbox: VTEX's REST paths per account, admin routes, and a subprocess runner.

Every VTEX route lives under ``/{account}/api/...``, so a client's base URL for an account is
``http://127.0.0.1:{port}/{account}``. Admin routes under ``/_sandbox`` are not part of VTEX and
need no credentials. Bodies are compact JSON (orjson).

Where VTEX documents no default the sandbox picks one: ``GetProductAndSkuIds`` without ``_to``
serves 10 products, Master Data search without ``REST-Range`` serves ``resources=0-15``, scroll
without ``_size`` pages by 100, collection products without ``pageSize`` by 10. The orders list
defaults to ``per_page=15`` and ``orderBy=creationDate,desc``; ``f_creationDate`` bounds are
inclusive and keep all 7 fractional digits. The order routes serve only the orders created in
the last two years, as VTEX documents (``ORDERS_SERVED_YEARS``).

Faults (see :mod:`cdp_devkit.sandbox.vtex.faults`) are decided after authentication. ``429`` and
``5xx`` are answered without running the handler, so they never have side effects; ``slow``,
``truncate`` and ``reset`` run it first, which means a write (collection change, feed read) can
take effect even though the client sees a failure, exactly the ambiguity a retrying client faces
against the real API.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import numpy as np
import orjson
import requests
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cdp_devkit.sandbox.vtex.catalog_collections import (
    AlreadyThere,
    Collections,
    Deadlocked,
    NotFound,
)
from cdp_devkit.sandbox.vtex.documents import (
    customer_document,
    order_bytes,
    order_list_item,
    product_document,
    sku_document,
)
from cdp_devkit.sandbox.vtex.faults import Fault, FaultConfig, FaultInjector
from cdp_devkit.sandbox.vtex.feed import MAX_LOT, OrderFeed
from cdp_devkit.sandbox.vtex.generator import (
    MALFORMED_KINDS,
    STATUSES,
    Store,
    StoreSpec,
    parse_ticks,
    to_ticks,
)
from cdp_devkit.sandbox.vtex.hostile import (
    CAPTURE_PATH,
    Captured,
    DrippedResponse,
    RequestBudget,
    echo_headers,
    redirect,
    retry_after_headers,
)
from cdp_devkit.sandbox.vtex.masterdata import (
    SCROLL_MAX_SIZE,
    SEARCH_MAX_DOCUMENTS,
    SEARCH_MAX_PAGE,
    ClFieldWrites,
    CustomerQuery,
    ScrollRegistry,
    parse_fields,
    project,
)

LIST_MAX_PER_PAGE = 100
LIST_MAX_PAGES = 30
PRODUCT_WINDOW_MAX = 250
SKU_PAGE_MAX = 1000
EXPORT_ENTITIES = ("orders", "products", "skus", "customers")

_JSON = "application/json"
_CREATION_FILTER = re.compile(r"creationDate:\[(\S+) TO (\S+)\]")
_RANGE_HEADER = re.compile(r"resources=(\d+)-(\d+)")
_BAD_GATEWAY = (
    b"<html><head><title>502 Bad Gateway</title></head><body>"
    b"<center><h1>502 Bad Gateway</h1></center></body></html>"
)
_LOG = logging.getLogger(__name__)


def credentials_for(account: str) -> tuple[str, str]:
    """(appKey, appToken) the sandbox accepts for an account."""
    token = hashlib.sha1(f"cdp-sandbox-app-token:{account}".encode()).hexdigest()
    return f"vtexappkey-{account}-SANDBOX", token


class ApiError(Exception):
    """Turned into a JSON error response with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class InjectedReset(Exception):
    """Raised after a partial body so that uvicorn drops the connection mid-response."""


class _DropInjectedResets(logging.Filter):
    """Keeps uvicorn from logging a traceback for every reset we inject on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], InjectedReset))


def _json(
    body: Any, status: int = 200, headers: dict[str, str] | None = None, media_type: str = _JSON
) -> Response:
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type=media_type)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json(
        {"error": {"code": str(status), "message": message, "exception": None}}, status, headers
    )


def _empty_ok() -> Response:
    return Response(b"", status_code=200)


class _ResetResponse(Response):
    """Announces the whole body, sends half of it, then aborts the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send(
            {
                "type": "http.response.body",
                "body": self.body[: len(self.body) // 2],
                "more_body": True,
            }
        )
        raise InjectedReset


def _carried_headers(response: Response) -> dict[str, str]:
    return {
        k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")
    }


def _faulted(fault: Fault, response: Response) -> Response:
    body = bytes(response.body)
    if fault.kind == "truncate":
        return Response(
            body[: len(body) // 2],
            status_code=200,
            headers=_carried_headers(response),
            media_type=response.media_type,
        )
    # An empty body would let the client finish reading before the abort: announce one byte.
    return _ResetResponse(
        body or b"\n",
        status_code=response.status_code,
        headers=_carried_headers(response),
        media_type=response.media_type,
    )


def _malformed(call: _Call, name: str, response: Response) -> Response:
    """The route's 200 broken as ``malformed_envelopes`` asks: what a proxy or a platform
    change can hand a client in place of the documented shape."""
    defect = call.sandbox.injector.config.malformed_envelopes.get(name)
    if defect is None or response.status_code != 200:
        return response
    call.account.faults["malformed_envelope"] += 1
    headers = _carried_headers(response)
    body = bytes(response.body)
    if defect == "no_token_header":
        headers.pop("x-vtex-md-token", None)
    elif defect == "empty_body":
        body = b""
    else:  # wrong_type: a list answered as an object, an object as a list
        document = orjson.loads(body)
        body = orjson.dumps({"items": document} if isinstance(document, list) else [document])
    return Response(body, status_code=200, headers=headers, media_type=response.media_type)


class _Account:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.app_key, self.app_token = credentials_for(store.account)
        self.feed = OrderFeed(store.account)
        self.collections = Collections(store)
        self.customers = CustomerQuery(store)
        self.cl_writes = ClFieldWrites(
            lambda document_id: store.customer_row(document_id) is not None
        )
        self.scrolls = ScrollRegistry()
        self.requests: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.list_cache: tuple[tuple[Any, ...], _OrderQuery] | None = None


class _Sandbox:
    def __init__(self, stores: Sequence[Store]) -> None:
        self.accounts: dict[str, _Account] = {}
        for store in stores:
            if store.account in self.accounts:
                raise ValueError(f"account {store.account!r} given twice")
            self.accounts[store.account] = _Account(store)
        self.injector = FaultInjector()
        self.budget = RequestBudget()
        self.captured = Captured()
        self.started = time.monotonic()
        self.served = 0
        self.handler_seconds = 0.0

    def count(self, account: _Account, route: str) -> None:
        account.requests[route] += 1
        self.served += 1


@dataclass
class _Call:
    sandbox: _Sandbox
    account: _Account
    request: Request

    @property
    def store(self) -> Store:
        return self.account.store

    @property
    def params(self) -> Any:
        return self.request.query_params


Handler = Callable[[_Call], Awaitable[Response]]


def _api(family: str, name: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a VTEX route: account lookup, app-key auth, statistics and fault injection."""

    async def endpoint(request: Request) -> Response:
        sandbox: _Sandbox = request.app.state.sandbox
        account = sandbox.accounts.get(request.path_params["account"])
        if account is None:
            return _error(404, "Account not found")
        sandbox.count(account, name)
        headers = request.headers
        if (
            headers.get("x-vtex-api-appkey") != account.app_key
            or headers.get("x-vtex-api-apptoken") != account.app_token
        ):
            return _error(401, "Unauthorized: missing or invalid X-VTEX-API-AppKey/AppToken")
        refusal = _wire_fault(request, sandbox, account, name)
        if refusal is not None:
            return refusal
        injector = sandbox.injector
        fault = injector.decide(family)
        if fault is not None and fault.kind in ("429", "5xx", "slow"):
            account.faults[fault.kind] += 1
            if fault.kind == "429":
                config = injector.config
                return _error(
                    429,
                    "Too Many Requests",
                    retry_after_headers(config.retry_after_form, config.retry_after),
                )
            if fault.status == 502:
                return Response(_BAD_GATEWAY, status_code=502, media_type="text/html")
            if fault.kind == "5xx":
                return _error(fault.status, "Injected server error")
            if fault.kind == "slow":
                await asyncio.sleep(injector.config.slow_seconds)
        started = time.perf_counter()
        call = _Call(sandbox, account, request)
        try:
            response = await handler(call)
        except ApiError as error:
            return _error(error.status, error.message)
        except NotFound as error:
            return _error(404, str(error))
        except AlreadyThere as error:
            return _error(409, str(error))
        except Deadlocked as error:
            return _error(500, str(error))
        except ValueError as error:  # invalid input reported by the domain modules
            return _error(400, str(error))
        finally:
            sandbox.handler_seconds += time.perf_counter() - started
        response = _malformed(call, name, response)
        # A connection can break under any response; truncation is defined for 200 bodies only.
        if fault is not None and (
            fault.kind == "reset" or (fault.kind == "truncate" and response.status_code == 200)
        ):
            account.faults[fault.kind] += 1
            return _faulted(fault, response)
        interval = injector.config.drip.get(name)
        if interval:
            account.faults["drip"] += 1
            return DrippedResponse(response, interval)
        return response

    return endpoint


def _wire_fault(
    request: Request, sandbox: _Sandbox, account: _Account, name: str
) -> Response | None:
    """The answer of an account over its request budget, of a redirect or of a header echo,
    instead of the route's (see hostile.py)."""
    config = sandbox.injector.config
    if config.requests_per_minute:
        wait = sandbox.budget.admit(account.store.account, config.requests_per_minute)
        if wait is not None:
            account.faults["budget"] += 1
            headers = retry_after_headers(config.retry_after_form, wait)
            return _error(429, "Too Many Requests", headers)
    if name in config.redirect:
        account.faults["redirect"] += 1
        return redirect(request, account.store.account, config.redirect[name])
    if name in config.echo_headers:
        account.faults["echo_headers"] += 1
        return echo_headers(request)
    return None


def _int_param(params: Any, name: str, default: int | None = None) -> int:
    value = params.get(name)
    if value is None:
        if default is None:
            raise ApiError(400, f"query parameter {name} is required")
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"query parameter {name} must be an integer") from None


def _path_int(call: _Call, name: str) -> int:
    try:
        return int(call.request.path_params[name])
    except ValueError:
        raise ApiError(400, f"{name} must be an integer") from None


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        raise ApiError(400, "request body is not valid JSON") from None


def _instant(text: str) -> int:
    try:
        return parse_ticks(text)
    except ValueError:
        raise ApiError(400, f"invalid date {text!r}") from None


# ----- OMS ----------------------------------------------------------------------------------------

# VTEX's Orders API reference, List orders and Get order (orders-api.json): "You can only
# access information from orders created in the last two years". How VTEX answers beyond that
# is not documented; assumed (UNVERIFIED): the list leaves older orders out without a word (its
# paging counts only what it serves), Get order answers them 404 like an unknown order, and the
# two years end at the request's instant (the same day and time two calendar years earlier, 29
# February falling back to the 28th). Relative to the wall clock, so stores reaching further
# back than two years from today are served in part.
ORDERS_SERVED_YEARS = 2
# Orders whose detail carries a number jsonb refuses ("value overflows numeric format").
_POISON_FIELD = b'{"discount":1e-20000,'
_FUTURE_STAMP = "9999-12-31T23:59:59.9999999+00:00"


def _orders_served_from() -> int:
    """Ticks of the oldest creation instant VTEX's order routes serve now."""
    now = datetime.now(UTC)
    year = now.year - ORDERS_SERVED_YEARS
    day = min(now.day, 28) if now.month == 2 else now.day
    return to_ticks(now.replace(year=year, day=day))


@dataclass
class _OrderQuery:
    rows: np.ndarray
    stats: dict[str, Any] | None = None


def _stat_block(values: np.ndarray) -> dict[str, Any]:
    if len(values) == 0:
        # Integers throughout: the spec types some empty-facet means as integers.
        return {
            "Count": 0,
            "Max": 0,
            "Mean": 0,
            "Min": 0,
            "Missing": 0,
            "StdDev": 0,
            "Sum": 0,
            "SumOfSquares": 0,
            "Facets": None,
        }
    floats = values.astype(np.float64)
    return {
        "Count": len(values),
        "Max": int(values.max()),
        "Mean": float(floats.mean()),
        "Min": int(values.min()),
        "Missing": 0,
        "StdDev": float(floats.std(ddof=1)) if len(values) > 1 else 0.0,
        "Sum": int(values.sum()),
        "SumOfSquares": int(round(float(np.dot(floats, floats)))),
        "Facets": None,
    }


def _stats(values: np.ndarray) -> dict[str, Any]:
    block = _stat_block(values)
    # Every sandbox order is a Marketplace order in BRL.
    facets = {
        "origin": {"Fulfillment": _stat_block(values[:0]), "Marketplace": block},
        "currencyCode": {"BRL": block},
    }
    return {**block, "Facets": facets}


def _order_query(call: _Call) -> _OrderQuery:
    params = call.params
    store = call.store
    low, high = -(2**62), 2**62
    creation = params.get("f_creationDate")
    if creation:
        match = _CREATION_FILTER.fullmatch(creation.strip())
        if match is None:
            raise ApiError(
                400,
                "f_creationDate must look like creationDate:"
                "[2024-01-01T00:00:00.000Z TO 2024-01-02T00:00:00.000Z]",
            )
        if match.group(1) != "*":
            low = _instant(match.group(1))
        if match.group(2) != "*":
            high = _instant(match.group(2))
    statuses: tuple[int, ...] | None = None
    if params.get("f_status"):
        wanted = {s.strip() for s in params["f_status"].split(",")}
        statuses = tuple(i for i, name in enumerate(STATUSES) if name in wanted)
    field, _, direction = params.get("orderBy", "creationDate,desc").partition(",")
    direction = direction.lower() or "desc"
    if field not in ("creationDate", "orderId", "totalValue", "items") or direction not in (
        "asc",
        "desc",
    ):
        raise ApiError(400, "orderBy must be creationDate|orderId|totalValue|items,asc|desc")

    low = max(low, _orders_served_from())
    key = (store.version, low, high, statuses, field, direction)
    cached = call.account.list_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    rows = store.rows_created_between(low, high)
    if statuses is not None:
        rows = rows[np.isin(store.orders.status[rows], statuses)]
    if field != "creationDate":
        column = {
            "orderId": store.orders.group,
            "totalValue": store.orders.value,
            "items": store.orders.quantity,
        }[field]
        rows = rows[np.argsort(column[rows], kind="stable")]
    if direction == "desc":
        rows = rows[::-1]
    query = _OrderQuery(rows)
    call.account.list_cache = (key, query)
    return query


async def list_orders(call: _Call) -> Response:
    per_page = _int_param(call.params, "per_page", 15)
    page = _int_param(call.params, "page", 1)
    if not 1 <= per_page <= LIST_MAX_PER_PAGE:
        raise ApiError(400, f"per_page must be between 1 and {LIST_MAX_PER_PAGE}")
    if page < 1:
        raise ApiError(400, "page must be >= 1")
    query = _order_query(call)
    store = call.store
    injector = call.sandbox.injector
    answer = injector.list_answer()
    if answer is not None:
        call.account.faults[f"list_{answer}"] += 1
    rows = query.rows[:0] if answer == "empty_page" else query.rows
    total = 0 if answer == "empty_page" else len(rows) + injector.config.list_total_excess
    start = (page - 1) * per_page
    if page > 1 and call.sandbox.injector.reordered_page("orders"):
        call.account.faults["reorder_pages"] += 1
        start -= 1
    # VTEX serves 30 pages and then silently returns empty lists while still reporting the total.
    selected = rows[start : start + per_page] if page <= LIST_MAX_PAGES else rows[:0]
    if page > 1 and len(selected):
        repeat = call.sandbox.injector.duplicated_records("orders")
        selected = np.concatenate([rows[max(0, start - repeat) : start], selected])
    if query.stats is None:
        query.stats = {
            "totalValue": _stats(store.orders.value[query.rows]),
            "totalItems": _stats(store.orders.quantity[query.rows]),
        }
    unlisted = injector.config.unlisted_order_ids
    entries = [order_list_item(store, int(row)) for row in selected]
    for entry in entries:
        if entry["orderId"] in unlisted:
            del entry["orderId"]
    body = {
        "list": None if answer == "null_list" else entries,
        "facets": [],
        "paging": {
            "total": total,
            "pages": math.ceil(total / per_page),
            "currentPage": page,
            "perPage": per_page,
        },
        "stats": {"stats": query.stats},
    }
    return _json(body, media_type="application/json; charset=utf-8")


async def get_order(call: _Call) -> Response:
    order_id = call.request.path_params["order_id"]
    failure = call.sandbox.injector.config.failing_orders.get(order_id)
    if failure is not None:
        call.account.faults["failing_order"] += 1
    store = call.store
    row = store.order_row(order_id)
    if row is None or failure == "404" or store.orders.created[row] < _orders_served_from():
        raise ApiError(404, "Order not found")
    if failure == "5xx":
        raise ApiError(503, "Injected server error")
    body = order_bytes(store, row)
    config = call.sandbox.injector.config
    if order_id in config.future_stamp_orders:
        call.account.faults["future_stamp"] += 1
        body = orjson.dumps({**orjson.loads(body), "lastChange": _FUTURE_STAMP})
    if order_id in config.poison_documents:
        call.account.faults["poison"] += 1
        body = _POISON_FIELD + body[1:]
    return Response(body[: len(body) // 2] if failure else body, media_type=_JSON)


# ----- feed ---------------------------------------------------------------------------------------


def _require_feed(call: _Call) -> OrderFeed:
    feed = call.account.feed
    if not feed.configured:
        raise ApiError(404, "No feed configured for this appKey")
    return feed


async def get_feed_config(call: _Call) -> Response:
    return _json(_require_feed(call).config_document())


async def post_feed_config(call: _Call) -> Response:
    call.account.feed.configure(await _body(call.request))
    return _empty_ok()


async def delete_feed_config(call: _Call) -> Response:
    _require_feed(call).delete()
    return _empty_ok()


async def read_feed(call: _Call) -> Response:
    maxlot = _int_param(call.params, "maxlot")
    if not 1 <= maxlot <= MAX_LOT:
        raise ApiError(400, f"maxlot must be between 1 and {MAX_LOT}")
    feed = _require_feed(call)
    injector = call.sandbox.injector
    return _json(feed.receive(maxlot, injector.duplicate_feed_event, injector.feed_event_defect))


async def commit_feed(call: _Call) -> Response:
    feed = _require_feed(call)
    body = await _body(call.request)
    handles = body.get("handles") if isinstance(body, dict) else None
    if not isinstance(handles, list) or not all(isinstance(h, str) for h in handles):
        raise ApiError(400, 'body must be {"handles": ["...", ...]}')
    feed.commit(handles)
    return _empty_ok()


# ----- catalog ------------------------------------------------------------------------------------


async def product_and_sku_ids(call: _Call) -> Response:
    store = call.store
    first = _int_param(call.params, "_from", 1)
    last = _int_param(call.params, "_to", first + 9)
    if first < 1 or last < first:
        raise ApiError(400, "_from and _to must satisfy 1 <= _from <= _to")
    if last - first + 1 > PRODUCT_WINDOW_MAX:
        raise ApiError(400, f"_from.._to may span at most {PRODUCT_WINDOW_MAX} products")
    catalog = store.catalog
    rows = np.arange(len(catalog.product_id))
    if call.params.get("categoryId"):
        from cdp_devkit.sandbox.vtex.vocabulary import CATEGORIES

        category = _int_param(call.params, "categoryId")
        category_ids = np.array([c[0] for c in CATEGORIES])
        rows = rows[category_ids[catalog.product_category] == category]
    data = {
        str(int(catalog.product_id[row])): store.skus_of_product_row(int(row))
        for row in rows[first - 1 : last]
    }
    total = len(rows)
    if call.sandbox.injector.config.endless_listings:  # always one more window to read
        total = max(total, last + 1)
    return _json({"data": data, "range": {"total": total, "from": first, "to": last}})


async def sku_ids(call: _Call) -> Response:
    page = _int_param(call.params, "page")
    size = _int_param(call.params, "pagesize")
    if page < 1 or not 1 <= size <= SKU_PAGE_MAX:
        raise ApiError(400, f"page must be >= 1 and pagesize between 1 and {SKU_PAGE_MAX}")
    sku_ids = call.store.catalog.sku_id
    if call.sandbox.injector.config.endless_listings:  # past the end, the last page again
        page = min(page, max(1, math.ceil(len(sku_ids) / size)))
    return _json(sku_ids[(page - 1) * size : page * size].tolist())


async def get_product(call: _Call) -> Response:
    row = call.store.product_row(_path_int(call, "product_id"))
    if row is None:
        raise ApiError(404, "Product not found")
    body = orjson.dumps(product_document(call.store, row))
    if call.request.path_params["product_id"] in call.sandbox.injector.config.poison_documents:
        call.account.faults["poison"] += 1
        body = _POISON_FIELD + body[1:]
    return Response(body, media_type=_JSON)


async def get_sku(call: _Call) -> Response:
    row = call.store.sku_row(_path_int(call, "sku_id"))
    if row is None:
        raise ApiError(404, "SKU not found")
    return _json(sku_document(call.store, row))


# ----- collections --------------------------------------------------------------------------------


async def create_collection(call: _Call) -> Response:
    return _json(call.account.collections.create(await _body(call.request)))


async def get_collection(call: _Call) -> Response:
    return _json(call.account.collections.get(_path_int(call, "collection_id")))


async def update_collection(call: _Call) -> Response:
    body = await _body(call.request)
    return _json(call.account.collections.update(_path_int(call, "collection_id"), body))


async def delete_collection(call: _Call) -> Response:
    call.account.collections.delete(_path_int(call, "collection_id"))
    return _empty_ok()


async def create_subcollection(call: _Call) -> Response:
    return _json(call.account.collections.create_subcollection(await _body(call.request)))


async def delete_subcollection(call: _Call) -> Response:
    call.account.collections.delete_subcollection(_path_int(call, "subcollection_id"))
    return _empty_ok()


async def list_subcollections(call: _Call) -> Response:
    return _json(call.account.collections.subcollections(_path_int(call, "collection_id")))


async def add_subcollection_sku(call: _Call) -> Response:
    body = await _body(call.request)
    return _json(call.account.collections.add_sku(_path_int(call, "subcollection_id"), body))


async def remove_subcollection_sku(call: _Call) -> Response:
    call.account.collections.remove_sku(
        _path_int(call, "subcollection_id"), _path_int(call, "sku_id")
    )
    return _empty_ok()


async def search_collections(call: _Call) -> Response:
    terms = call.request.path_params.get("terms")
    return _json(call.account.collections.search(terms, call.params))


async def collection_products(call: _Call) -> Response:
    page = _int_param(call.params, "page", 1)
    size = _int_param(call.params, "pageSize", 10)
    if page < 1 or size < 1:
        raise ApiError(400, "page and pageSize must be >= 1")
    return _json(call.account.collections.products(_path_int(call, "collection_id"), page, size))


# ----- Master Data --------------------------------------------------------------------------------


def _customer_rows(call: _Call) -> np.ndarray:
    if call.request.path_params["acronym"] != "CL":
        raise ApiError(404, "The sandbox only serves the CL data entity")
    params = call.params
    equals = {k: v for k, v in params.items() if not k.startswith("_")}
    return call.account.customers.rows(params.get("_where"), equals, params.get("_sort"))


def _customer_documents(call: _Call, rows: np.ndarray, fields: list[str] | None) -> list[Any]:
    store = call.store
    return [project(customer_document(store, int(row)), fields) for row in rows]


async def search_documents(call: _Call) -> Response:
    match = _RANGE_HEADER.fullmatch(call.request.headers.get("rest-range", "resources=0-15"))
    if match is None:
        raise ApiError(400, "REST-Range must look like resources=0-100")
    start, stop = int(match.group(1)), int(match.group(2))
    if stop <= start or stop - start > SEARCH_MAX_PAGE:
        raise ApiError(400, f"REST-Range must ask for 1 to {SEARCH_MAX_PAGE} documents")
    if stop > SEARCH_MAX_DOCUMENTS:
        raise ApiError(400, f"search reaches at most {SEARCH_MAX_DOCUMENTS} documents; use scroll")
    rows = _customer_rows(call)
    selected = rows[start:stop]
    if start and len(selected):
        repeat = call.sandbox.injector.duplicated_records("masterdata")
        selected = np.concatenate([rows[max(0, start - repeat) : start], selected])
    end = min(stop, len(rows)) if start < len(rows) else start
    documents = _customer_documents(call, selected, parse_fields(call.params.get("_fields")))
    return _json(documents, headers={"REST-Content-Range": f"resources={start}-{end}/{len(rows)}"})


async def scroll_documents(call: _Call) -> Response:
    if call.request.path_params["acronym"] != "CL":
        raise ApiError(404, "The sandbox only serves the CL data entity")
    token = call.params.get("_token")
    if token is None:
        size = _int_param(call.params, "_size", 100)
        if not 1 <= size <= SCROLL_MAX_SIZE:
            raise ApiError(400, f"_size must be between 1 and {SCROLL_MAX_SIZE}")
        rows = _customer_rows(call)
        token = call.account.scrolls.open(rows, size, parse_fields(call.params.get("_fields")))
    injector = call.sandbox.injector
    batch, fields, total = call.account.scrolls.advance(
        token,
        injector.duplicated_records("masterdata"),
        injector.config.expire_scroll_after_pages,
        injector.config.endless_listings,
    )
    return _json(
        _customer_documents(call, batch, fields),
        headers={"X-VTEX-MD-TOKEN": token, "REST-Content-Total": str(total)},
    )


def _cl_only(call: _Call) -> None:
    if call.request.path_params["acronym"] != "CL":
        raise ApiError(404, "The sandbox only serves the CL data entity")


async def data_entity_structure(call: _Call) -> Response:
    _cl_only(call)
    return _json(call.account.cl_writes.structure())


async def get_document(call: _Call) -> Response:
    _cl_only(call)
    document_id = call.request.path_params["document_id"]
    row = call.store.customer_row(document_id)
    stored = customer_document(call.store, row) if row is not None else None
    document = call.account.cl_writes.document(document_id, stored)
    if document is None:
        raise ApiError(404, "Document not found")
    return _json(project(document, parse_fields(call.params.get("_fields"))))


async def patch_document(call: _Call) -> Response:
    _cl_only(call)
    body = await _body(call.request)
    call.account.cl_writes.patch(call.request.path_params["document_id"], body)
    return Response(status_code=204)


async def delete_document(call: _Call) -> Response:
    _cl_only(call)
    document_id = call.request.path_params["document_id"]
    call.account.cl_writes.delete(document_id)
    row = call.store.customer_row(document_id)
    if row is not None:
        call.account.customers.delete(row)
    return Response(status_code=204)


# ----- admin --------------------------------------------------------------------------------------


def _sandbox(request: Request) -> _Sandbox:
    return request.app.state.sandbox


def _admin_account(request: Request) -> _Account:
    account = _sandbox(request).accounts.get(request.path_params["account"])
    if account is None:
        raise ApiError(404, "Account not found")
    return account


def _admin(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as error:
            return _error(error.status, error.message)
        except ValueError as error:
            return _error(400, str(error))

    return endpoint


async def capture(request: Request) -> Response:
    return await _sandbox(request).captured.capture(request)


async def captured(request: Request) -> Response:
    return await _sandbox(request).captured.listing(request)


async def health(request: Request) -> Response:
    return _json({"status": "ok", "accounts": sorted(_sandbox(request).accounts)})


async def get_faults(request: Request) -> Response:
    return _json(_sandbox(request).injector.config.to_dict())


async def set_faults(request: Request) -> Response:
    body = await _body(request)
    if not isinstance(body, dict):
        raise ApiError(400, "fault configuration must be a JSON object")
    config = FaultConfig.from_dict(body)
    _sandbox(request).injector.configure(config)
    return _json(config.to_dict())


async def stats(request: Request) -> Response:
    """Request counters. A benchmark takes two snapshots: the difference of ``served_total`` over
    its wall time is the rate it got, the difference of ``cpu_seconds`` tells how much of that
    time the sandbox process itself was busy (HTTP parsing included, ``handler_seconds`` not)."""
    sandbox = _sandbox(request)
    return _json(
        {
            "served_total": sandbox.served,
            "cpu_seconds": round(time.process_time(), 6),
            "handler_seconds": round(sandbox.handler_seconds, 6),
            "uptime_seconds": round(time.monotonic() - sandbox.started, 3),
            "accounts": {
                name: {
                    "requests": dict(account.requests),
                    "faults": dict(account.faults),
                    "total": sum(account.requests.values()),
                }
                for name, account in sandbox.accounts.items()
            },
        }
    )


async def configure_collections(request: Request) -> Response:
    """How the account's collections misbehave (see catalog_collections.py)."""
    body = await _body(request)
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    try:
        rate = float(body.get("deadlock_rate", 0.0))
        lag = float(body.get("listing_lag_seconds", 0.0))
        seed = int(body.get("seed", 0))
        refused = frozenset(int(sku) for sku in body.get("refused_skus", []))
    except (TypeError, ValueError):
        raise ApiError(
            400,
            'body must be {"deadlock_rate": float, "listing_lag_seconds": float, "seed": int,'
            ' "refused_skus": [int]}',
        ) from None
    _admin_account(request).collections.configure(rate, lag, seed, refused)
    return _empty_ok()


async def add_cl_field(request: Request) -> Response:
    """The merchant adds a field to the CL entity (in VTEX: the Admin's data structure)."""
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise ApiError(400, 'body must be {"name": str, "type": str, "nullable": bool}')
    writes = _admin_account(request).cl_writes
    writes.add_field(body["name"], body.get("type", "Varchar 50"), bool(body.get("nullable", True)))
    return _empty_ok()


async def cl_written(request: Request) -> Response:
    """Values written to CL documents by PATCH, and the ids a PATCH created a document for."""
    writes = _admin_account(request).cl_writes
    return _json({"values": writes.values, "created": sorted(writes.created)})


async def mutate(request: Request) -> Response:
    account = _admin_account(request)
    body = await _body(request)
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    try:
        seed, changed, new = int(body["seed"]), int(body.get("changed", 0)), int(body.get("new", 0))
        at = datetime.fromisoformat(body["at"])
    except (KeyError, TypeError, ValueError):
        raise ApiError(
            400, 'body must be {"seed": int, "changed": int, "new": int, "at": "ISO-8601 instant"}'
        ) from None
    if changed < 0 or new < 0:
        raise ApiError(400, "changed and new must be >= 0")
    ids = account.store.mutate(seed, changed, new, at, on_change=account.feed.publish)
    return _json({"order_ids": ids})


def _export_lines(store: Store, entity: str, fields: list[str] | None) -> Iterator[bytes]:
    if entity == "orders":
        unparseable = MALFORMED_KINDS.index("unparseable")
        for row in range(len(store.orders)):
            kind = int(store.orders.malformed[row])
            body = order_bytes(store, row)
            if kind == unparseable:
                body = orjson.dumps(body.decode())
            yield (
                b'{"key":'
                + orjson.dumps(store.order_id_at(row))
                + b',"malformed":'
                + (b"true" if kind >= 0 else b"false")
                + b',"doc":'
                + body
                + b"}\n"
            )
        return
    if entity == "products":
        keyed = (
            (str(int(pid)), product_document(store, row))
            for row, pid in enumerate(store.catalog.product_id)
        )
    elif entity == "skus":
        keyed = (
            (str(int(sid)), sku_document(store, row))
            for row, sid in enumerate(store.catalog.sku_id)
        )
    else:
        keyed = (
            (doc["id"], project(doc, fields or ["_all"]))
            for doc in (customer_document(store, row) for row in range(store.buyers.registered))
        )
    for key, document in keyed:
        yield orjson.dumps({"key": key, "malformed": False, "doc": document}) + b"\n"


async def export(request: Request) -> Response:
    """NDJSON truth of one entity. For customers, ``?fields=a,b`` projects each CL document the
    way ``_fields`` does, so it can be compared with what a client that asks for those fields
    stored (the key is always the CL ``id``)."""
    account = _admin_account(request)
    entity = request.path_params["entity"]
    if entity not in EXPORT_ENTITIES:
        raise ApiError(404, f"entity must be one of {', '.join(EXPORT_ENTITIES)}")
    fields = parse_fields(request.query_params.get("fields"))
    if fields is not None and entity != "customers":
        raise ApiError(400, "fields applies to the customers export only")

    async def chunks() -> AsyncIterator[bytes]:
        lines = _export_lines(account.store, entity, fields)
        while True:
            chunk = b"".join(line for _, line in zip(range(500), lines, strict=False))
            if not chunk:
                return
            yield chunk
            await asyncio.sleep(0)  # let API requests interleave with a long export

    return StreamingResponse(chunks(), media_type="application/x-ndjson")


def build_app(stores: list[Store]) -> Starlette:
    """The sandbox's ASGI app serving these stores (one account each)."""
    prefix = "/{account}/api"

    def api(path: str, family: str, name: str, handler: Handler, method: str = "GET") -> Route:
        return Route(prefix + path, _api(family, name, handler), methods=[method])

    routes = [
        # Order detail first: it is by far the most requested route.
        api("/oms/pvt/orders/{order_id}", "orders", "get_order", get_order),
        api("/oms/pvt/orders", "orders", "list_orders", list_orders),
        api("/orders/feed/config", "feed", "get_feed_config", get_feed_config),
        api("/orders/feed/config", "feed", "post_feed_config", post_feed_config, "POST"),
        api("/orders/feed/config", "feed", "delete_feed_config", delete_feed_config, "DELETE"),
        api("/orders/feed", "feed", "read_feed", read_feed),
        api("/orders/feed", "feed", "commit_feed", commit_feed, "POST"),
        api(
            "/catalog_system/pvt/products/GetProductAndSkuIds",
            "catalog",
            "product_and_sku_ids",
            product_and_sku_ids,
        ),
        api("/catalog_system/pvt/sku/stockkeepingunitids", "catalog", "sku_ids", sku_ids),
        api("/catalog/pvt/product/{product_id}", "catalog", "get_product", get_product),
        api("/catalog_system/pvt/sku/stockkeepingunitbyid/{sku_id}", "catalog", "get_sku", get_sku),
        api(
            "/catalog/pvt/collection", "collections", "create_collection", create_collection, "POST"
        ),
        api(
            "/catalog_system/pvt/collection/search",
            "collections",
            "search_collections",
            search_collections,
        ),
        api(
            "/catalog_system/pvt/collection/search/{terms}",
            "collections",
            "search_collections",
            search_collections,
        ),
        api(
            "/catalog/pvt/collection/{collection_id}",
            "collections",
            "get_collection",
            get_collection,
        ),
        api(
            "/catalog/pvt/collection/{collection_id}",
            "collections",
            "update_collection",
            update_collection,
            "PUT",
        ),
        api(
            "/catalog/pvt/collection/{collection_id}",
            "collections",
            "delete_collection",
            delete_collection,
            "DELETE",
        ),
        api(
            "/catalog/pvt/collection/{collection_id}/subcollection",
            "collections",
            "list_subcollections",
            list_subcollections,
        ),
        api(
            "/catalog/pvt/collection/{collection_id}/products",
            "collections",
            "collection_products",
            collection_products,
        ),
        api(
            "/catalog/pvt/subcollection",
            "collections",
            "create_subcollection",
            create_subcollection,
            "POST",
        ),
        api(
            "/catalog/pvt/subcollection/{subcollection_id}",
            "collections",
            "delete_subcollection",
            delete_subcollection,
            "DELETE",
        ),
        api(
            "/catalog/pvt/subcollection/{subcollection_id}/stockkeepingunit",
            "collections",
            "add_subcollection_sku",
            add_subcollection_sku,
            "POST",
        ),
        api(
            "/catalog/pvt/subcollection/{subcollection_id}/stockkeepingunit/{sku_id}",
            "collections",
            "remove_subcollection_sku",
            remove_subcollection_sku,
            "DELETE",
        ),
        api("/dataentities/{acronym}/search", "masterdata", "search_documents", search_documents),
        api("/dataentities/{acronym}/scroll", "masterdata", "scroll_documents", scroll_documents),
        api(
            "/dataentities/{acronym}/documents/{document_id}",
            "masterdata",
            "get_document",
            get_document,
        ),
        api(
            "/dataentities/{acronym}/documents/{document_id}",
            "masterdata",
            "patch_document",
            patch_document,
            "PATCH",
        ),
        api(
            "/dataentities/{acronym}/documents/{document_id}",
            "masterdata",
            "delete_document",
            delete_document,
            "DELETE",
        ),
        api(
            "/dataentities/{acronym}", "masterdata", "data_entity_structure", data_entity_structure
        ),
        Route("/_sandbox/health", health),
        # Another origin's endpoint (reached under another host name) recording what a
        # redirect made clients send it; before the routes below, which would take "capture"
        # for an account.
        Route(CAPTURE_PATH + "/{path:path}", capture, methods=["GET", "POST", "PUT", "DELETE"]),
        Route("/_sandbox/captured", captured),
        Route("/_sandbox/faults", _admin(get_faults)),
        Route("/_sandbox/faults", _admin(set_faults), methods=["POST"]),
        Route("/_sandbox/stats", _admin(stats)),
        Route("/_sandbox/{account}/mutate", _admin(mutate), methods=["POST"]),
        Route("/_sandbox/{account}/collections", _admin(configure_collections), methods=["POST"]),
        Route("/_sandbox/{account}/masterdata/fields", _admin(add_cl_field), methods=["POST"]),
        Route("/_sandbox/{account}/masterdata/written", _admin(cl_written)),
        Route("/_sandbox/{account}/export/{entity}", _admin(export)),
    ]
    app = Starlette(routes=routes)
    app.state.sandbox = _Sandbox(stores)
    return app


def serve(
    specs: Sequence[StoreSpec], host: str = "127.0.0.1", port: int = 8765, fd: int | None = None
) -> None:
    """Generate the stores and serve them with uvicorn until interrupted (blocking).

    ``fd`` is an already-listening socket inherited from a parent (how :class:`SandboxProcess`
    avoids a race for a free port); otherwise ``host``/``port`` are bound.
    """
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("uvicorn.error").addFilter(_DropInjectedResets())
    started = time.perf_counter()
    stores = [Store(spec) for spec in specs]
    _LOG.info(
        "generated %d store(s) (%s orders) in %.2f s",
        len(stores),
        sum(len(s.orders) for s in stores),
        time.perf_counter() - started,
    )
    config = uvicorn.Config(
        build_app(stores),
        host=host,
        port=port,
        access_log=False,
        log_config=None,
        log_level="warning",
        lifespan="off",
        timeout_keep_alive=30,
    )
    sockets = [socket.socket(fileno=fd)] if fd is not None else None
    uvicorn.Server(config).run(sockets=sockets)


class SandboxProcess:
    """Runs ``python -m cdp_devkit.sandbox`` in a subprocess; a context manager.

    Store generation happens in the subprocess, so startup time grows with the stores' size.
    """

    def __init__(
        self, specs: Sequence[StoreSpec], port: int | None = None, startup_timeout: float = 120.0
    ) -> None:
        if not specs:
            raise ValueError("at least one store spec is required")
        self.specs = list(specs)
        self.port = port
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._session = requests.Session()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the sandbox has not been started")
        return f"http://127.0.0.1:{self.port}"

    def account_url(self, account: str) -> str:
        """Base URL a VTEX client uses for this account."""
        return f"{self.base_url}/{account}"

    def start(self) -> SandboxProcess:
        command = [sys.executable, "-m", "cdp_devkit.sandbox"]
        for spec in self.specs:
            command += ["--store", spec.to_cli()]
        listener: socket.socket | None = None
        if self.port is None:
            # Bind here and hand the listening socket down: no window in which another
            # process could take a port we picked.
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1024)
            self.port = listener.getsockname()[1]
            command += ["--fd", str(listener.fileno())]
        else:
            command += ["--port", str(self.port)]
        # Outlives this method (read on failure, closed in stop()), so no context manager.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._stderr,
                stderr=self._stderr,
                pass_fds=(listener.fileno(),) if listener else (),
            )
        finally:
            if listener is not None:
                listener.close()
        self._wait_until_healthy()
        return self

    def _output(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def _wait_until_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                output = self._output()
                self.stop()
                raise RuntimeError(
                    f"sandbox exited with {self._process.returncode} during startup:\n{output}"
                )
            try:
                if self._session.get(f"{self.base_url}/_sandbox/health", timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        output = self._output()
        self.stop()
        raise TimeoutError(f"sandbox not healthy after {self.startup_timeout} s; output:\n{output}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._session.close()

    def __enter__(self) -> SandboxProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        response = self._session.request(
            method, f"{self.base_url}/_sandbox{path}", json=body, timeout=60
        )
        response.raise_for_status()
        return response.json()

    def set_faults(self, config: dict[str, Any]) -> dict[str, Any]:
        return self._admin("POST", "/faults", config)

    def clear_faults(self) -> None:
        self._admin("POST", "/faults", {})

    def captured(self) -> list[dict[str, Any]]:
        """What the capture endpoint (the target of the `redirect` fault) received."""
        return self._admin("GET", "/captured")

    def mutate(self, account: str, seed: int, changed: int, new: int, at: datetime) -> list[str]:
        body = {"seed": seed, "changed": changed, "new": new, "at": at.isoformat()}
        return self._admin("POST", f"/{account}/mutate", body)["order_ids"]

    def stats(self) -> dict[str, Any]:
        return self._admin("GET", "/stats")

    def export(
        self, account: str, entity: str, fields: str | Sequence[str] | None = None
    ) -> Iterator[dict[str, Any]]:
        """The store's truth as the NDJSON export streams it, one dict per record.

        ``fields`` (customers only) projects the CL documents like Master Data's ``_fields``.
        """
        params = {}
        if fields is not None:
            params["fields"] = fields if isinstance(fields, str) else ",".join(fields)
        with self._session.get(
            f"{self.base_url}/_sandbox/{account}/export/{entity}",
            params=params,
            stream=True,
            timeout=60,
        ) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line:
                    yield orjson.loads(line)


def run_sandbox(
    specs: Sequence[StoreSpec], port: int | None = None, startup_timeout: float = 120.0
) -> SandboxProcess:
    """Start a sandbox subprocess and return it once healthy; call ``stop()`` when done."""
    return SandboxProcess(specs, port, startup_timeout).start()
