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
  audience again;
- a replace is processed for hours after its last batch, and adds or removes meanwhile fail
  with 2650 / 1870145 (custom-audience ``usersreplace`` reference,
  https://developers.facebook.com/docs/marketing-api/reference/custom-audience/usersreplace/):
  ``busy`` reads the audience's ``operation_status`` so a sync waits for a later run, and a
  2650 met anyway is retried as the wait it is;
- listings are paged (25 a page unless asked): ``ensure_audience`` reads every page;
- every answer reports the ad account's usage in ``X-Business-Use-Case-Usage`` and
  ``X-Ad-Account-Usage`` (Marketing API rate limiting,
  https://developers.facebook.com/docs/marketing-api/overview/rate-limiting): past
  ``PACE_FROM_PERCENT`` the next call waits in proportion, up to ``pace_seconds`` at 100 %,
  so a push slows before Meta throttles it; a throttled call waits the
  ``estimated_time_to_regain_access`` Meta names, or fails at once naming it when that is past
  the call's deadline.
"""

from __future__ import annotations

import json
import re
import secrets
import time
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
# Adds and removes refused while Meta processes a replace ("Audience Update In Progress").
AUDIENCE_BUSY = (2650, 1870145)
PACE_FROM_PERCENT = 75.0
PACE_SECONDS = 60.0  # the wait before a call at 100 % usage
USAGE_HEADERS = ("x-business-use-case-usage", "x-ad-account-usage")


# Characters per piece of a form value given to quote_plus, which on Python 3.11 builds a list
# entry for every byte: eight bytes of pointer per byte of a batch, in each of the activation's
# threads (CPython issue 95865, fixed in 3.12 the same way).
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
        regain_seconds: float = 0.0,
    ) -> None:
        # Meta's code first: a reason cut short still says what Meta answered.
        http = f" HTTP {status}" if status else ""
        super().__init__(redact(f"code={code} subcode={subcode}{http}: {message}"))
        self.code, self.subcode, self.status, self.transient = code, subcode, status, transient
        self.message, self.regain_seconds = message, regain_seconds

    @property
    def busy(self) -> bool:
        return (self.code, self.subcode) == AUDIENCE_BUSY

    @property
    def retryable(self) -> bool:
        return (
            self.transient
            or self.busy
            or self.code in RATE_LIMIT_CODES
            or (self.status is not None and self.status >= 500)
        )


def usage_percent(headers: Mapping[str, str]) -> float:
    """The highest share of a limit the answer's usage headers report, in percent; 0 without
    them. Either header may be absent (Meta sends them once an app calls enough)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    highest = 0.0
    for name in USAGE_HEADERS:
        for entry in _usage_entries(lowered.get(name)):
            for key in ("call_count", "total_cputime", "total_time", "acc_id_util_pct"):
                value = entry.get(key)
                if isinstance(value, int | float):
                    highest = max(highest, float(value))
    return highest


def regain_seconds(headers: Mapping[str, str]) -> float:
    """How long Meta says a throttled account waits (``estimated_time_to_regain_access``, in
    minutes), in seconds; 0 when it names no wait."""
    lowered = {name.lower(): value for name, value in headers.items()}
    minutes = [
        entry.get("estimated_time_to_regain_access")
        for entry in _usage_entries(lowered.get("x-business-use-case-usage"))
    ]
    return 60.0 * max((m for m in minutes if isinstance(m, int | float)), default=0)


def _usage_entries(raw: str | None) -> list[dict[str, Any]]:
    """X-Ad-Account-Usage is one object; X-Business-Use-Case-Usage maps each business object
    to a list of objects, one per use case."""
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        return []
    if not isinstance(parsed, dict):
        return []
    if "acc_id_util_pct" in parsed:
        return [parsed]
    return [
        entry
        for entries in parsed.values()
        if isinstance(entries, list)
        for entry in entries
        if isinstance(entry, dict)
    ]


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
        pace_seconds: float = PACE_SECONDS,
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
        self.deadline_seconds, self.pace_seconds = deadlines.total_seconds, pace_seconds
        self.retries = 0
        self.usage = 0.0  # percent, as the last answer reported it
        self.paced_seconds = 0.0

    def _call(
        self,
        method: str,
        path: tuple[str, ...],
        params: dict[str, Any],
        expect: str,
        *,
        audience: str | None = None,
    ) -> dict[str, Any]:
        """The JSON body of a successful call holding ``expect``, retried when Meta says so,
        no wait longer than the call's deadline. ``audience``: the audience the call is on,
        gone when Graph says it is missing."""
        for attempt in range(self.attempts):
            self._pace()
            try:
                return self._attempt(method, path, params, expect, audience)
            except MetaError as error:
                if not error.retryable or attempt == self.attempts - 1:
                    raise
                wait = error.regain_seconds or min(60.0, self.retry_base_seconds * 2**attempt)
                if wait > self.deadline_seconds:
                    raise MetaError(
                        f"{error.message}; Meta asks for a wait of {wait:.0f} s, past this"
                        f" call's deadline of {self.deadline_seconds:.0f} s",
                        code=error.code,
                        subcode=error.subcode,
                        status=error.status,
                    ) from None
                self.retries += 1
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _attempt(
        self,
        method: str,
        path: tuple[str, ...],
        params: dict[str, Any],
        expect: str,
        audience: str | None,
    ) -> dict[str, Any]:
        try:
            response = self.api.call(method, path, params=params)
        except FacebookRequestError as error:
            headers = error.http_headers() or {}
            self.usage = usage_percent(headers)
            code, subcode = error.api_error_code(), error.api_error_subcode()
            message = str(error.api_error_message())
            if audience is not None and (code, subcode) == MISSING_OBJECT:
                raise AudienceGone(audience, f"code={code} subcode={subcode}", message) from None
            raise MetaError(
                message,
                code=code,
                subcode=subcode,
                status=error.http_status(),
                transient=bool(error.api_transient_error()),
                regain_seconds=regain_seconds(headers) if code in RATE_LIMIT_CODES else 0.0,
            ) from None
        except (requests.RequestException, OutboundError) as error:
            # No answer (refused, reset, timed out: retried), or a redirect off Graph.
            message = QUERY_STRING.sub("", f"{type(error).__name__}: {error}")
            transient = isinstance(error, requests.RequestException)
            raise MetaError(message, transient=transient) from None
        self.usage = usage_percent(response.headers() or {})
        return _checked(response, expect)

    def _pace(self) -> None:
        """Wait before a call in proportion to how close the last answer said the account is
        to its limit: nothing below ``PACE_FROM_PERCENT``, ``pace_seconds`` at 100 %."""
        share = (self.usage - PACE_FROM_PERCENT) / (100.0 - PACE_FROM_PERCENT)
        if share > 0:
            wait = self.pace_seconds * min(share, 1.0)
            self.paced_seconds += wait
            time.sleep(wait)

    def matchable(self, row: Row) -> bool:
        return bool(row[1] or row[2])  # an e-mail or a phone; names alone rarely match

    def ensure_audience(self, target: DestinationAudience) -> str:
        """The audience's id, found by name first so a lost id never creates a duplicate."""
        name = f"{target.destination.tenant_id}: {target.audience}"
        found = self._find_audience(name)
        if found is not None:
            return found
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

    def _find_audience(self, name: str) -> str | None:
        """The id of the account's audience named ``name``, read page by page while Graph
        gives a next page. The cursor is sent back to our own Graph URL rather than the
        ``next`` link followed: the link carries the access token to wherever it points."""
        params: dict[str, Any] = {"fields": "id,name"}
        while True:
            page = self._call("GET", (self.account, "customaudiences"), params, "data")
            for audience in page["data"]:
                if audience.get("name") == name:
                    return str(audience["id"])
            paging = page.get("paging") or {}
            after = (paging.get("cursors") or {}).get("after")
            if not paging.get("next") or not after:
                return None
            params = {**params, "after": after}

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
        requests = sent = 0
        rejected: dict[int, str] = {}
        for seq, last, rows in _session_batches(batches):
            params = {
                "payload": {"schema": META_SCHEMA, "data": rows},
                "session": {"session_id": session_id, "batch_seq": seq, "last_batch_flag": last},
            }
            body = self._call(
                "POST", (platform_id, "usersreplace"), params, "num_received", audience=platform_id
            )
            # Rejected rows by their position in the whole replace, as the sync numbers them.
            for index, reason in _invalid_rows(body, len(rows)).items():
                rejected[sent + index] = reason
            requests += 1
            sent += len(rows)
        return BatchResult(rejected=rejected, requests=requests)

    def busy(self, platform_id: str) -> str | None:
        body = self._call(
            "GET", (platform_id,), {"fields": "operation_status"}, "id", audience=platform_id
        )
        status = body.get("operation_status")
        description = str(status.get("description", "")) if isinstance(status, dict) else ""
        if "replace" in description.lower() and "progress" in description.lower():
            return f"Meta is still processing a replace of audience {platform_id} ({description})"
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
