"""What an overloaded or hostile server does on the wire, for the VTEX sandbox's faults.

- An account's request budget: VTEX limits requests per account (6,000 a minute for Get order,
  https://developers.vtex.com/docs/api-reference/orders-api#get-/api/oms/pvt/orders/-orderId-)
  and answers the excess 429 with `Retry-After` ("How to load test a store",
  https://developers.vtex.com/docs/guides/how-to-load-test-a-store). The budget here is a token
  bucket refilling at the per-minute figure, holding one second's worth.
- `Retry-After` in each of its forms (RFC 9110 section 10.2.3: delay-seconds or an HTTP date),
  or left out, which VTEX does not promise never to do.
- A redirect to another origin, and a capture endpoint there recording the headers it got: a
  client that follows it hands over whatever credentials it sends.
- An error body echoing the request's headers, as some front ends' debug pages do.
- A body dripped one byte at a time, each byte arriving before any per-read timeout.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

RETRY_AFTER_FORMS: tuple[str, ...] = ("seconds", "date", "none")
CAPTURE_PATH = "/_sandbox/capture"


class RequestBudget:
    """Requests per account per minute, as a token bucket holding one second's worth."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # account -> (tokens, updated)

    def admit(self, account: str, per_minute: int) -> float | None:
        """None when the request fits the budget, else the seconds until it would."""
        rate = per_minute / 60
        now = time.monotonic()
        with self._lock:
            tokens, updated = self._buckets.get(account, (rate, now))
            tokens = min(rate, tokens + (now - updated) * rate)
            if tokens >= 1:
                self._buckets[account] = (tokens - 1, now)
                return None
            self._buckets[account] = (tokens, now)
            return (1 - tokens) / rate


def retry_after_headers(form: str, seconds: float) -> dict[str, str]:
    """The `Retry-After` header of a 429 in the configured form. A date is written as RFC
    5322 writes a UTC time (`-0000`), which some front ends send and RFC 9110 asks recipients
    to read as well."""
    if form == "none":
        return {}
    if form == "date":
        when = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=math.ceil(seconds))
        return {"Retry-After": email.utils.format_datetime(when)}
    return {"Retry-After": str(math.ceil(seconds))}


def redirect(request: Request, account: str, to_origin: str) -> Response:
    """302 to the capture endpoint at another origin, keeping the request's path and query."""
    query = f"?{request.url.query}" if request.url.query else ""
    location = f"{to_origin.rstrip('/')}{CAPTURE_PATH}/{account}{request.url.path}{query}"
    return Response(b"", status_code=302, headers={"Location": location})


def echo_headers(request: Request) -> Response:
    """A 400 whose body starts by quoting every header of the request."""
    body = {
        "request": {"method": request.method, "headers": dict(request.headers)},
        "error": {"code": "400", "message": "Bad Request"},
    }
    return Response(orjson.dumps(body), status_code=400, media_type="application/json")


class Captured:
    """What the capture endpoint received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    async def capture(self, request: Request) -> Response:
        """Records the request and answers like an empty order list, which a client that
        followed the redirect would take for a store without orders."""
        with self._lock:
            self.requests.append(
                {
                    "method": request.method,
                    "url": str(request.url),
                    "headers": dict(request.headers),
                }
            )
        empty = {"list": [], "paging": {"total": 0, "pages": 0, "currentPage": 1, "perPage": 100}}
        return Response(orjson.dumps(empty), media_type="application/json")

    async def listing(self, request: Request) -> Response:
        with self._lock:
            return Response(orjson.dumps(self.requests), media_type="application/json")


class DrippedResponse(Response):
    """Announces the whole body, then sends it one byte every `interval` seconds."""

    def __init__(self, response: Response, interval: float) -> None:
        super().__init__(
            bytes(response.body),
            status_code=response.status_code,
            headers={k: v for k, v in response.headers.items() if k != "content-length"},
            media_type=response.media_type,
        )
        self.interval = interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        for index in range(len(self.body)):
            await send(
                {
                    "type": "http.response.body",
                    "body": self.body[index : index + 1],
                    "more_body": index < len(self.body) - 1,
                }
            )
            await asyncio.sleep(self.interval)
