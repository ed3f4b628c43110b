"""Meta Custom Audiences through `facebook-business`, as an activation platform.

Rows are pre-hashed (``META_SCHEMA``, our own normalization) and sent with the SDK's raw
``api.call`` rather than its helpers, because:
- ``remove_users``/``delete_users`` send DELETE with the payload in the URL, which fails on
  large batches; removals are a POST to ``/{id}/users`` carrying ``method=DELETE``;
- the SDK judges success by the body, so a 502 with an HTML page returns without an
  exception: the HTTP status and ``num_received`` are checked here;
- its exceptions print every request parameter, i.e. the whole batch, so they are replaced
  by ``MetaError`` holding only Meta's code, subcode and message;
- a request that never got an answer raises ``requests``' error, whose text holds the URL
  and so the access token of a GET: it becomes a transient ``MetaError`` without the query;
- every call ends within its deadline (``lib/outbound.py``: per read and as a whole), and
  follows no redirect off Graph's origin; a ``MetaError``'s text is redacted (an error message
  may quote the token);
- with the app's secret, every call carries ``appsecret_proof`` (HMAC-SHA256 of the access
  token keyed by the secret), which an app with "Require App Secret" on demands;
- a call on an audience deleted in Ads Manager is Graph's error for a missing object (code
  100, subcode 33): it becomes ``AudienceGone``, which the sync answers by creating the
  audience again.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote_plus

import requests
from facebook_business.api import FacebookAdsApi, FacebookResponse
from facebook_business.exceptions import FacebookRequestError
from facebook_business.session import FacebookSession

from cdp_assets.activation.destinations import DestinationAudience
from cdp_assets.activation.identifiers import META_SCHEMA
from cdp_assets.activation.sync import AudienceGone, BatchResult, Row
from cdp_assets.lib.outbound import BoundedSession, Deadlines, OutboundError
from cdp_assets.lib.redaction import redact
from cdp_assets.lib.retry import with_backoff

BATCH_SIZE = 10_000  # Meta's documented maximum rows per /users request
# Business-use-case, user, ad-account and app rate limits.
RATE_LIMIT_CODES = frozenset({80003, 17, 613, 4, 32})
# "Unsupported post request. Object with ID '...' does not exist, cannot be loaded due to
# missing permissions, or does not support this operation": Graph's only answer for a node
# that is gone (facebook/facebook-python-business-sdk#239). It is the same for an audience
# the token may no longer read, which then gets a new audience beside it.
MISSING_OBJECT = (100, 33)
QUERY_STRING = re.compile(r"\?[^\s'\"]*")  # of a URL quoted in an error: holds access_token
# A 10,000-row batch takes Graph seconds to answer; minutes of silence is a call that hangs.
GRAPH_DEADLINES = Deadlines(read_seconds=120.0, total_seconds=300.0)


# Characters per piece of a form value given to quote_plus, which on Python 3.11 builds a list
# entry for every byte: 58 MB of pointers at once for the 7 MB a 10,000-row batch encodes to,
# in each of the activation's threads (CPython issue 95865, fixed in 3.12 the same way).
FORM_PIECE = 65_536


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return "".join(
        quote_plus(text[start : start + FORM_PIECE]) for start in range(0, len(text), FORM_PIECE)
    )


def form_encode(fields: Mapping[str, Any]) -> str:
    """`fields` as an application/x-www-form-urlencoded body, the same text `requests` makes
    of a dict of single values, quoted piece by piece."""
    return "&".join(f"{_quote(name)}={_quote(value)}" for name, value in fields.items())


class FormSession(BoundedSession):
    """The SDK's HTTP session, bounded in time, with form bodies encoded by `form_encode`."""

    def request(  # type: ignore[override]
        self, method: str, url: str, data: Any = None, headers: Any = None, **kwargs: Any
    ) -> requests.Response:
        if isinstance(data, Mapping):
            data = form_encode(data)
            headers = {**(headers or {}), "Content-Type": "application/x-www-form-urlencoded"}
        return super().request(method, url, data=data, headers=headers, **kwargs)


class MetaError(RuntimeError):
    """A Graph API failure, without the request parameters (they hold the whole batch)."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        subcode: int | None = None,
        status: int | None = None,
        transient: bool = False,
    ) -> None:
        super().__init__(redact(f"Meta {status or ''} code={code} subcode={subcode}: {message}"))
        self.code, self.subcode, self.status, self.transient = code, subcode, status, transient

    @property
    def retryable(self) -> bool:
        return (
            self.transient
            or self.code in RATE_LIMIT_CODES
            or (self.status is not None and self.status >= 500)
        )


def _checked(response: FacebookResponse, expect: str) -> dict[str, Any]:
    body = response.json() if response.status() == 200 else None
    if not isinstance(body, dict) or expect not in body:
        raise MetaError(
            f"unexpected response without {expect!r}",
            status=response.status(),
            transient=response.status() >= 500,
        )
    return body


def _session_batches(
    batches: Iterable[list[Row]],
) -> Iterator[tuple[int, bool, list[Row]]]:
    """(batch_seq, last_batch_flag, rows): the flag needs to know which batch is last."""
    seq, pending = 0, None
    for batch in batches:
        if pending is not None:
            yield seq, False, pending
        seq, pending = seq + 1, batch
    if pending is not None:
        yield seq, True, pending


class MetaAudiences:
    """One Meta ad account's customer-file audiences."""

    batch_size = BATCH_SIZE

    def __init__(
        self,
        account_id: str,
        access_token: str,
        *,
        app_secret: str | None = None,
        graph_url: str | None = None,
        attempts: int = 6,
        retry_base_seconds: float = 2.0,
        deadlines: Deadlines = GRAPH_DEADLINES,
    ) -> None:
        # With the app secret, the SDK adds appsecret_proof to the session's parameters.
        session = FacebookSession(access_token=access_token, app_secret=app_secret)
        # The same settings (access token and proof as query parameters, CA bundle) on a
        # FormSession.
        form = FormSession(deadlines)
        form.params, form.verify, form.proxies = (
            session.requests.params,
            session.requests.verify,
            session.requests.proxies,
        )
        session.requests.close()
        session.requests = form
        if graph_url:
            session.GRAPH = graph_url.rstrip("/")
        # Never FacebookAdsApi.init(): it installs a crash reporter that posts tracebacks.
        self.api = FacebookAdsApi(session)
        self.account = f"act_{account_id}"
        self.attempts, self.retry_base_seconds = attempts, retry_base_seconds
        self.retries = 0

    def _call(
        self,
        method: str,
        path: tuple[str, ...],
        params: dict[str, Any],
        expect: str,
        *,
        audience: str | None = None,
    ) -> dict[str, Any]:
        """The JSON body of a successful call holding ``expect``, retried when Meta says so.
        ``audience``: the audience the call is on, gone when Graph says it is missing."""

        def attempt() -> dict[str, Any]:
            try:
                return _checked(self.api.call(method, path, params=params), expect)
            except FacebookRequestError as error:
                code, subcode = error.api_error_code(), error.api_error_subcode()
                message = str(error.api_error_message())
                if audience is not None and (code, subcode) == MISSING_OBJECT:
                    raise AudienceGone(
                        audience, f"code={code} subcode={subcode}", message
                    ) from None
                raise MetaError(
                    message,
                    code=code,
                    subcode=subcode,
                    status=error.http_status(),
                    transient=bool(error.api_transient_error()),
                ) from None
            except (requests.RequestException, OutboundError) as error:
                # No answer (refused, reset, timed out: retried), or a redirect off Graph.
                message = QUERY_STRING.sub("", f"{type(error).__name__}: {error}")
                transient = isinstance(error, requests.RequestException)
                raise MetaError(message, transient=transient) from None

        def count_retry(_: Exception) -> None:
            self.retries += 1

        return with_backoff(
            attempt,
            lambda error: isinstance(error, MetaError) and error.retryable,
            attempts=self.attempts,
            base_seconds=self.retry_base_seconds,
            on_retry=count_retry,
        )

    def matchable(self, row: Row) -> bool:
        return bool(row[1] or row[2])  # an e-mail or a phone; names alone rarely match

    def ensure_audience(self, target: DestinationAudience) -> str:
        """The audience's id, found by name first so a lost id never creates a duplicate."""
        name = f"{target.destination.tenant_id}: {target.audience}"
        listing = self._call(
            "GET", (self.account, "customaudiences"), {"fields": "id,name"}, "data"
        )
        for audience in listing["data"]:
            if audience.get("name") == name:
                return str(audience["id"])
        created = self._call(
            "POST",
            (self.account, "customaudiences"),
            {
                "name": name,
                "subtype": "CUSTOM",
                "customer_file_source": "USER_PROVIDED_ONLY",
                "description": f"Audience {target.audience} of {target.destination.tenant_id},"
                " kept in sync by the customer data platform.",
            },
            "id",
        )
        return str(created["id"])

    def _users(self, platform_id: str, rows: list[Row], *, remove: bool) -> BatchResult:
        params: dict[str, Any] = {
            "payload": {"schema": META_SCHEMA, "data": rows},
            "session": {
                "session_id": secrets.randbits(62),
                "batch_seq": 1,
                "last_batch_flag": True,
                "estimated_num_total": len(rows),
            },
        }
        if remove:
            params["method"] = "DELETE"
        body = self._call(
            "POST", (platform_id, "users"), params, "num_received", audience=platform_id
        )
        return BatchResult(rejected=_invalid_rows(body, len(rows)))

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._users(platform_id, rows, remove=False)

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._users(platform_id, rows, remove=True)

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult:
        """One ``usersreplace`` session: members not sent are dropped when the last batch lands.

        Unlike /users, a replace keeps active ad sets out of a new learning phase.
        """
        session_id = secrets.randbits(62)
        requests = 0
        for seq, last, rows in _session_batches(batches):
            params = {
                "payload": {"schema": META_SCHEMA, "data": rows},
                "session": {"session_id": session_id, "batch_seq": seq, "last_batch_flag": last},
            }
            self._call(
                "POST", (platform_id, "usersreplace"), params, "num_received", audience=platform_id
            )
            requests += 1
        return BatchResult(requests=requests)

    def busy(self, platform_id: str) -> str | None:
        return None

    def match_info(self, platform_id: str) -> dict[str, Any]:
        fields = "approximate_count_lower_bound,approximate_count_upper_bound,operation_status"
        body = self._call("GET", (platform_id,), {"fields": fields}, "id", audience=platform_id)
        status = body.get("operation_status") or {}
        return {
            "approximate_count_lower_bound": body.get("approximate_count_lower_bound"),
            "approximate_count_upper_bound": body.get("approximate_count_upper_bound"),
            "operation_status": status.get("description") if isinstance(status, dict) else status,
        }


def _invalid_rows(body: dict[str, Any], size: int) -> dict[int, str]:
    """Rows Meta dropped, by index, from ``invalid_entry_samples`` keyed by row index."""
    samples = body.get("invalid_entry_samples") or {}
    if not body.get("num_invalid_entries") or not isinstance(samples, dict):
        return {}
    return {
        int(index): str(reason)[:200]
        for index, reason in samples.items()
        if str(index).isdigit() and int(index) < size
    }
