"""Google Customer Match through the Data Manager API, as an activation platform.

The API fails fast: one bad member fails the whole request. When the error names members
(``audience_members[i]`` field violations) those are recorded as rejected and the rest of
the batch is sent again; anything else fails the run. A per-minute quota error is retried
with backoff (the client never retries it); the per-day quota is not worth waiting for.

Every request the API accepts is only acknowledged: Google processes it later (30 minutes to
24 hours) and records can still fail then
(https://developers.google.com/data-manager/api/devguides/diagnostics). Each request id is
returned as pending; `request_verdicts` reads ``RetrieveRequestStatus`` until the request is
final. A PARTIAL_SUCCESS counts its failed records without naming them, so it fails the whole
request: its members are sent again (re-adding a member Google holds only renews it).

Full replace follows Google's documented safe flow: note a time T, ingest every member,
then remove the members whose last addition is older than T.

A call on a user list deleted in Google Ads raises ``AudienceGone``: NOT_FOUND (reading the
list), or INVALID_ARGUMENT naming INVALID_USER_LIST_ID (ingesting into it or removing from
it; which of the two the live API answers there is unverified, so both are taken).

For the loopback sandbox the clients get an insecure channel: the library dials only TLS with
credentials, and with a channel given its transport never looks for credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.ads import datamanager_v1 as dm
from google.ads.datamanager_v1.services.ingestion_service.transports import (
    IngestionServiceGrpcTransport,
)
from google.ads.datamanager_v1.services.user_list_service.transports import (
    UserListServiceGrpcTransport,
)
from google.api_core import exceptions as gexc
from google.protobuf import duration_pb2

from cdp_assets.activation.destinations import Destination, DestinationAudience
from cdp_assets.activation.sync import AudienceGone, BatchResult, Row, Verdict
from cdp_assets.lib.backoff import with_backoff

BATCH_SIZE = 10_000  # documented members per request
MEMBERSHIP_DAYS = 540  # Customer Match maximum
MEMBER_FIELD = re.compile(r"^audience_members\[(\d+)\]")
RETRYABLE = (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError)
CALL_TIMEOUT_SECONDS = 120.0  # every call's gRPC deadline


@dataclass(frozen=True)
class DataManagerClients:
    ingestion: dm.IngestionServiceClient
    user_lists: dm.UserListServiceClient


def data_manager_clients(
    sandbox_address: str | None = None, credentials: Any = None
) -> DataManagerClients:
    """Clients for the Data Manager API; ``credentials`` None means application defaults."""
    if sandbox_address:
        return DataManagerClients(
            dm.IngestionServiceClient(
                transport=IngestionServiceGrpcTransport(
                    channel=grpc.insecure_channel(sandbox_address)
                )
            ),
            dm.UserListServiceClient(
                transport=UserListServiceGrpcTransport(
                    channel=grpc.insecure_channel(sandbox_address)
                )
            ),
        )
    return DataManagerClients(
        dm.IngestionServiceClient(credentials=credentials),
        dm.UserListServiceClient(credentials=credentials),
    )


def retryable(error: Exception) -> bool:
    if isinstance(error, gexc.TooManyRequests):  # ResourceExhausted included
        quota = (getattr(error, "metadata", None) or {}).get("quota_limit", "")
        return not quota.endswith("PerDayPerProject")
    return isinstance(error, RETRYABLE)


def list_missing(error: gexc.GoogleAPICallError) -> bool:
    """Whether the API says the user list the call names does not exist."""
    return isinstance(error, gexc.NotFound) or (
        isinstance(error, gexc.InvalidArgument) and error.reason == "INVALID_USER_LIST_ID"
    )


def error_code(error: gexc.GoogleAPICallError) -> str:
    """The status and Google's reason, e.g. ``INVALID_ARGUMENT INVALID_USER_LIST_ID``."""
    status = error.grpc_status_code.name if error.grpc_status_code else str(error.code)
    return f"{status} {error.reason}" if error.reason else status


def rejected_members(error: gexc.InvalidArgument, sent: int) -> dict[int, str]:
    """Members named by the error's BadRequest field violations, with their descriptions;
    an index outside the `sent` members names none of them."""
    rejected: dict[int, str] = {}
    for detail in getattr(error, "details", None) or []:
        for violation in getattr(detail, "field_violations", []):
            match = MEMBER_FIELD.match(violation.field)
            if match and int(match.group(1)) < sent:
                reason = getattr(error, "reason", None) or violation.description
                rejected[int(match.group(1))] = str(reason)[:200]
    return rejected


def _consent(value: str) -> str:
    return "CONSENT_STATUS_UNSPECIFIED" if value == "UNSPECIFIED" else f"CONSENT_{value}"


class DataManagerAudiences:
    """Customer Match user lists of one Google Ads account, through the Data Manager API."""

    batch_size = BATCH_SIZE

    def __init__(
        self,
        destination: Destination,
        clients: DataManagerClients,
        *,
        attempts: int = 6,
        retry_base_seconds: float = 5.0,
        call_timeout_seconds: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        self.destination = destination
        self.clients = clients
        self.attempts, self.retry_base_seconds = attempts, retry_base_seconds
        self.call_timeout = call_timeout_seconds
        self.account = f"accountTypes/GOOGLE_ADS/accounts/{destination.account_id}"
        self.last_match_rate_range: str | None = None
        # A user list of a managed account is reached through the manager the credentials
        # belong to: a Destination field for ingestion, a header for the user list service.
        self.login = (
            dm.ProductAccount(account_type="GOOGLE_ADS", account_id=destination.login_account_id)
            if destination.login_account_id
            else None
        )
        self.metadata = (
            [("login-account", f"accountTypes/GOOGLE_ADS/accounts/{destination.login_account_id}")]
            if destination.login_account_id
            else []
        )

    def _call(self, fn: Any, request: Any, *, audience: str | None = None) -> Any:
        """``audience``: the user list the call is on, gone when the API says it is missing."""
        try:
            return with_backoff(
                lambda: fn(
                    request=request,
                    retry=None,
                    timeout=self.call_timeout,
                    metadata=self.metadata,
                ),
                retryable,
                attempts=self.attempts,
                base_seconds=self.retry_base_seconds,
            )
        except gexc.GoogleAPICallError as error:
            if audience is not None and list_missing(error):
                raise AudienceGone(audience, error_code(error), error.message) from None
            raise

    def matchable(self, row: Row) -> bool:
        return bool(row[0] or row[1])

    def ensure_audience(self, target: DestinationAudience) -> str:
        """The user list's resource name, found by display name before creating one."""
        name = f"{target.destination.tenant_id}: {target.audience}"
        listing = self._call(self.clients.user_lists.list_user_lists, {"parent": self.account})
        for user_list in listing:
            if user_list.display_name == name:
                return user_list.name
        created = self._call(
            self.clients.user_lists.create_user_list,
            dm.CreateUserListRequest(
                parent=self.account,
                user_list=dm.UserList(
                    display_name=name,
                    description=f"Audience {target.audience}, kept in sync by the CDP.",
                    membership_duration=duration_pb2.Duration(seconds=MEMBERSHIP_DAYS * 86_400),
                    ingested_user_list_info=dm.IngestedUserListInfo(
                        upload_key_types=["CONTACT_ID"],
                        contact_id_info=dm.ContactIdInfo(
                            data_source_type="DATA_SOURCE_TYPE_FIRST_PARTY"
                        ),
                    ),
                ),
            ),
        )
        return created.name

    def _destinations(self, platform_id: str) -> list[dm.Destination]:
        return [
            dm.Destination(
                operating_account=dm.ProductAccount(
                    account_type="GOOGLE_ADS", account_id=self.destination.account_id
                ),
                login_account=self.login,
                product_destination_id=platform_id.rsplit("/", 1)[-1],
            )
        ]

    @staticmethod
    def _members(rows: list[Row]) -> list[dm.AudienceMember]:
        return [
            dm.AudienceMember(
                user_data=dm.UserData(
                    user_identifiers=[
                        dm.UserIdentifier(**{key: value})
                        for key, value in (("email_address", row[0]), ("phone_number", row[1]))
                        if value
                    ]
                )
            )
            for row in rows
        ]

    def _send(self, platform_id: str, rows: list[Row], build: Any, fn: Any) -> BatchResult:
        """Send rows; members the API names as bad are set aside and the rest re-sent. The
        accepted rows await the verdict of the request that carried them."""
        rejected: dict[int, str] = {}
        requests = 0
        while True:
            positions = [i for i in range(len(rows)) if i not in rejected]
            if not positions:
                return BatchResult(rejected, requests)
            requests += 1
            try:
                response = self._call(fn, build([rows[i] for i in positions]), audience=platform_id)
            except gexc.InvalidArgument as error:
                named = rejected_members(error, len(positions))
                if not named:
                    raise
                rejected.update({positions[i]: reason for i, reason in named.items()})
                continue
            return BatchResult(rejected, requests, [(response.request_id, len(positions))])

    def _ingest_request(self, platform_id: str, rows: list[Row]) -> dm.IngestAudienceMembersRequest:
        return dm.IngestAudienceMembersRequest(
            destinations=self._destinations(platform_id),
            audience_members=self._members(rows),
            consent=dm.Consent(
                ad_user_data=_consent(self.destination.ad_user_data_consent),
                ad_personalization=_consent(self.destination.ad_personalization_consent),
            ),
            # Registering a Google destination states that the advertiser accepted the
            # Customer Match terms; the API refuses contact data without it.
            terms_of_service=dm.TermsOfService(customer_match_terms_of_service_status="ACCEPTED"),
            encoding=dm.Encoding.HEX,
        )

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._send(
            platform_id,
            rows,
            lambda batch: self._ingest_request(platform_id, batch),
            self.clients.ingestion.ingest_audience_members,
        )

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._send(
            platform_id,
            rows,
            lambda batch: dm.RemoveAudienceMembersRequest(
                destinations=self._destinations(platform_id),
                audience_members=self._members(batch),
                encoding=dm.Encoding.HEX,
            ),
            self.clients.ingestion.remove_audience_members,
        )

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult:
        # A minute of margin so a clock running ahead of Google's never removes new members.
        as_of = datetime.now(UTC) - timedelta(minutes=1)
        replaced = BatchResult(requests=0)
        offset = 0
        for rows in batches:
            result = self.add(platform_id, rows)
            replaced.rejected.update({offset + i: why for i, why in result.rejected.items()})
            replaced.pending += result.pending
            replaced.requests += result.requests
            offset += len(rows)
        removal = self._call(
            self.clients.ingestion.remove_all_audience_members,
            dm.RemoveAllAudienceMembersRequest(
                destinations=self._destinations(platform_id), remove_as_of_time=as_of
            ),
            audience=platform_id,
        )
        # It carries no member, but the audience is not as desired until it is processed.
        replaced.pending.append((removal.request_id, 0))
        replaced.requests += 1
        return replaced

    def busy(self, platform_id: str) -> str | None:
        return None

    def submit(self, platform_id: str) -> int:
        return 0  # each request was sent as it came

    def request_verdicts(self, request_ids: list[str]) -> dict[str, Verdict]:
        """One RetrieveRequestStatus per request (the API takes one id); final once every
        destination is."""
        verdicts: dict[str, Verdict] = {}
        for request_id in request_ids:
            try:
                status = self._call(
                    self.clients.ingestion.retrieve_request_status, {"request_id": request_id}
                )
            except gexc.InvalidArgument as error:
                # Unknown, or older than the 50 days Google keeps a status: nothing confirms
                # its members, which are sent again.
                verdicts[request_id] = Verdict(f"{error_code(error)}: {error.message}")
                continue
            verdict = _verdict(status, self)
            if verdict is not None:
                verdicts[request_id] = verdict
        return verdicts

    def match_info(self, platform_id: str) -> dict[str, Any]:
        info: dict[str, Any] = {}
        user_list = self._call(
            self.clients.user_lists.get_user_list, {"name": platform_id}, audience=platform_id
        )
        if user_list.size_info:
            info["search_size"] = user_list.size_info.search_network_members_count
            info["display_size"] = user_list.size_info.display_network_members_count
        contact_info = user_list.ingested_user_list_info.contact_id_info
        if contact_info and contact_info.match_rate_percentage:
            info["match_rate_percentage"] = contact_info.match_rate_percentage
        if self.last_match_rate_range:
            info["upload_match_rate_range"] = self.last_match_rate_range
        return info


_FINAL = ("SUCCESS", "PARTIAL_SUCCESS", "FAILED")


def _verdict(status: Any, audiences: DataManagerAudiences) -> Verdict | None:
    """A request's verdict once every destination's status is final (None before); an
    ingestion's match rate range is kept for the match info."""
    per_destination = list(status.request_status_per_destination)
    names = [d.request_status.name for d in per_destination]
    if not names or any(name not in _FINAL for name in names):
        return None
    failures = []
    for destination, name in zip(per_destination, names, strict=True):
        ingestion = destination.audience_members_ingestion_status
        if ingestion and ingestion.user_data_ingestion_status:
            audiences.last_match_rate_range = (
                ingestion.user_data_ingestion_status.upload_match_rate_range.name
            )
        if name != "SUCCESS":
            counts = ", ".join(
                f"{count.record_count} {count.reason.name}"
                for count in destination.error_info.error_counts
            )
            failures.append(f"{name} ({counts or 'no counts given'})")
    return Verdict("; ".join(failures) if failures else None)
