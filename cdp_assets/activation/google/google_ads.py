"""Google Customer Match through the Google Ads API (OfflineUserDataJobService).

Only developer tokens allowlisted before April 2026 may use it; new integrations use the
Data Manager API (`data_manager.py`). Google advises one large job rather than many small ones
(jobs can take hours;
https://developers.google.com/google-ads/api/docs/remarketing/audience-segments/customer-match/get-started):
every batch of a sync goes into one job per audience and direction (adds and removes never
share a job, as Google requires), run once by `submit`, never awaited. Its members stay pending
until a later sync reads the job's status (`request_verdicts`); a job still running on the list
makes the audience `busy`, so no second job is run beside it (CONCURRENT_MODIFICATION). The
operations Google rejects (partial failure, by index) are recorded and re-sent next run.
A job on a user list removed in Google Ads fails with one of ``LIST_GONE``: ``AudienceGone``.
A list is looked up by name before one is created, so a lost id or a lost create reply finds
the list made before. Google's refusals are raised as `GoogleAdsRefusal`, their codes first.

For the loopback sandbox the services get an insecure channel (the library dials only TLS
with credentials), which keeps the library's own interceptors: the metadata one adds the
developer token and login customer id, the exception one turns failures into
``GoogleAdsException``. Importing this module takes most of a second (Google Ads' generated
clients): only a push to a `google_ads` destination does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.ads.googleads.client import GoogleAdsClient
from google.ads.googleads.errors import GoogleAdsException
from google.ads.googleads.interceptors.exception_interceptor import ExceptionInterceptor
from google.ads.googleads.interceptors.metadata_interceptor import MetadataInterceptor
from google.ads.googleads.v26.common.types.consent import Consent
from google.ads.googleads.v26.common.types.offline_user_data import (
    CustomerMatchUserListMetadata,
    UserData,
    UserIdentifier,
)
from google.ads.googleads.v26.common.types.user_lists import CrmBasedUserListInfo
from google.ads.googleads.v26.errors.types.errors import GoogleAdsFailure
from google.ads.googleads.v26.resources.types.offline_user_data_job import OfflineUserDataJob
from google.ads.googleads.v26.resources.types.user_list import UserList
from google.ads.googleads.v26.services.services.google_ads_service import GoogleAdsServiceClient
from google.ads.googleads.v26.services.services.google_ads_service.transports import (
    GoogleAdsServiceGrpcTransport,
)
from google.ads.googleads.v26.services.services.offline_user_data_job_service import (
    OfflineUserDataJobServiceClient,
)
from google.ads.googleads.v26.services.services.offline_user_data_job_service.transports import (
    OfflineUserDataJobServiceGrpcTransport,
)
from google.ads.googleads.v26.services.services.user_list_service import UserListServiceClient
from google.ads.googleads.v26.services.services.user_list_service.transports import (
    UserListServiceGrpcTransport,
)
from google.ads.googleads.v26.services.types.offline_user_data_job_service import (
    AddOfflineUserDataJobOperationsRequest,
    OfflineUserDataJobOperation,
)
from google.ads.googleads.v26.services.types.user_list_service import UserListOperation
from google.api_core import exceptions as gexc

from cdp_assets.activation.destinations import Destination, DestinationAudience
from cdp_assets.activation.sync import AudienceGone, BatchResult, PlatformError, Row, Verdict
from cdp_assets.lib.backoff import with_backoff

# 2 identifiers per operation: 50,000 operations stay under the 100,000 identifiers a
# request may carry; Google suggests about 10,000 per request for speed.
BATCH_SIZE = 10_000
ADS_VERSION = "v26"
FAILURE_KEY = f"google.ads.googleads.{ADS_VERSION}.errors.googleadsfailure-bin"
MEMBERSHIP_DAYS = 540
# Every call's gRPC deadline: the v26 transports default to none, and a server that accepts and
# never answers would hold the step forever.
CALL_TIMEOUT_SECONDS = 120.0
RETRYABLE = (
    gexc.TooManyRequests,  # RESOURCE_EXHAUSTED: the library never converts it
    gexc.ServiceUnavailable,
    gexc.InternalServerError,
    gexc.DeadlineExceeded,
)

# What Google Ads answers for a job on a user list that no longer exists: the job's
# INVALID_USER_LIST_ID ("The user list ID provided for the job is invalid"), which is what
# integrations report once the list was deleted (segment-boneyard/segment-docs#6043), or the
# generic RESOURCE_NOT_FOUND. UNVERIFIED against the live API: which one it gives, and when.
LIST_GONE = frozenset(
    {
        ("offline_user_data_job_error", "INVALID_USER_LIST_ID"),
        ("mutate_error", "RESOURCE_NOT_FOUND"),
    }
)


@dataclass(frozen=True)
class GoogleAdsServices:
    user_lists: UserListServiceClient
    jobs: OfflineUserDataJobServiceClient
    search: GoogleAdsServiceClient


def google_ads_services(
    developer_token: str,
    login_customer_id: str | None,
    sandbox_address: str | None = None,
    credentials: Any = None,
) -> GoogleAdsServices:
    """The three services of the Customer Match flow, pinned to one API version."""
    if sandbox_address:
        channel = grpc.intercept_channel(
            grpc.insecure_channel(sandbox_address),
            MetadataInterceptor(developer_token, login_customer_id, None),
            ExceptionInterceptor(ADS_VERSION, use_proto_plus=True),
        )
        return GoogleAdsServices(
            UserListServiceClient(transport=UserListServiceGrpcTransport(channel=channel)),
            OfflineUserDataJobServiceClient(
                transport=OfflineUserDataJobServiceGrpcTransport(channel=channel)
            ),
            GoogleAdsServiceClient(transport=GoogleAdsServiceGrpcTransport(channel=channel)),
        )
    client = GoogleAdsClient(
        credentials=credentials,
        developer_token=developer_token,
        login_customer_id=login_customer_id,
        use_proto_plus=True,
        version=ADS_VERSION,
    )
    return GoogleAdsServices(
        client.get_service("UserListService"),
        client.get_service("OfflineUserDataJobService"),
        client.get_service("GoogleAdsService"),
    )


class GoogleAdsRefusal(PlatformError):
    """A Google Ads failure: its error codes (``quota_error=RESOURCE_EXHAUSTED``...) and
    first message, with Google's request id."""


def _codes(failure: GoogleAdsFailure) -> list[tuple[str, str]]:
    """(error_code member, value name) of each error of a failure."""
    codes = []
    for error in failure.errors:
        code = error.error_code
        member = type(code).pb(code).WhichOneof("error_code")
        codes.append((member or "", getattr(code, member).name if member else ""))
    return codes


def _failure(error: Exception) -> GoogleAdsFailure | None:
    """The GoogleAdsFailure of an error: the library's exception carries it; RESOURCE_EXHAUSTED
    and INTERNAL reach us unconverted, with it in their trailers."""
    if isinstance(error, GoogleAdsException):
        return error.failure
    call = getattr(error, "response", None)
    trailers = call.trailing_metadata() if isinstance(call, grpc.Call) else None
    for key, value in trailers or ():
        if key == FAILURE_KEY:
            return GoogleAdsFailure.deserialize(value)
    return None


def retryable(error: Exception) -> bool:
    """Transient errors, and the per-minute quota; the daily quota (RESOURCE_EXHAUSTED) is
    not worth waiting for."""
    failure = _failure(error)
    if failure is not None and failure.errors:
        return all(
            member in ("quota_error", "internal_error") and name != "RESOURCE_EXHAUSTED"
            for member, name in _codes(failure)
        )
    return isinstance(error, RETRYABLE)


def list_missing(failure: GoogleAdsFailure) -> tuple[str, str] | None:
    """(``error_code=NAME``, Google's message) when the failure says the list is gone."""
    for (member, name), error in zip(_codes(failure), failure.errors, strict=True):
        if (member, name) in LIST_GONE:
            return f"{member}={name}", error.message
    return None


def refusal(error: Exception, failure: GoogleAdsFailure) -> GoogleAdsRefusal:
    codes = ", ".join(f"{member}={name}" for member, name in _codes(failure))
    message = failure.errors[0].message if failure.errors else str(error)
    return GoogleAdsRefusal(codes, f"{message} (request {failure.request_id})")


def failed_operations(response: Any) -> dict[int, str]:
    """Operation index -> Google's message, from a partial-failure response."""
    status = response.partial_failure_error
    failed: dict[int, str] = {}
    if not status or not status.code:
        return failed
    for detail in status.details:
        failure = GoogleAdsFailure.deserialize(detail.value)
        for error in failure.errors:
            elements = error.location.field_path_elements
            if elements and elements[0].field_name == "operations":
                failed[elements[0].index] = error.message[:200]
    return failed


def _user_data(row: Row) -> UserData:
    identifiers = []
    if row[0]:
        identifiers.append(UserIdentifier(hashed_email=row[0]))
    if row[1]:
        identifiers.append(UserIdentifier(hashed_phone_number=row[1]))
    return UserData(user_identifiers=identifiers)


class GoogleAdsAudiences:
    """Customer Match user lists of one Google Ads customer, through OfflineUserDataJobs."""

    batch_size = BATCH_SIZE

    def __init__(
        self,
        destination: Destination,
        services: GoogleAdsServices,
        *,
        attempts: int = 6,
        retry_base_seconds: float = 5.0,
        call_timeout_seconds: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        self.destination = destination
        self.services = services
        self.customer_id = destination.account_id
        self.attempts, self.retry_base_seconds = attempts, retry_base_seconds
        self.call_timeout = call_timeout_seconds
        self.last_match_rate_range: str | None = None
        # The job of this sync being filled, per user list: (job, "create" or "remove").
        self._open_jobs: dict[str, tuple[str, str]] = {}

    def _call(self, fn: Any, *, audience: str | None = None, **kwargs: Any) -> Any:
        """``audience``: the user list the call is on, gone when Google says it is missing."""
        try:
            return with_backoff(
                lambda: fn(**kwargs, timeout=self.call_timeout),
                retryable,
                attempts=self.attempts,
                base_seconds=self.retry_base_seconds,
            )
        except (GoogleAdsException, gexc.GoogleAPICallError) as error:
            failure = _failure(error)
            if failure is None:
                raise
            missing = list_missing(failure) if audience is not None else None
            if audience is not None and missing is not None:
                raise AudienceGone(audience, *missing) from None
            raise refusal(error, failure) from error

    def _search(self, query: str) -> Any:
        return self._call(self.services.search.search, customer_id=self.customer_id, query=query)

    def matchable(self, row: Row) -> bool:
        return bool(row[0] or row[1])

    def ensure_audience(self, target: DestinationAudience) -> str:
        """The user list's resource name, found by name before creating one."""
        name = f"{target.destination.tenant_id}: {target.audience}"
        quoted = name.replace("\\", "\\\\").replace("'", "\\'")
        for row in self._search(
            f"SELECT user_list.resource_name FROM user_list WHERE user_list.name = '{quoted}'"
        ):
            return row.user_list.resource_name
        user_list = UserList(
            name=name,
            description=f"Audience {target.audience}, kept in sync by the CDP.",
            membership_life_span=MEMBERSHIP_DAYS,
            crm_based_user_list=CrmBasedUserListInfo(
                upload_key_type="CONTACT_INFO", data_source_type="FIRST_PARTY"
            ),
        )
        response = self._call(
            self.services.user_lists.mutate_user_lists,
            customer_id=self.customer_id,
            operations=[UserListOperation(create=user_list)],
        )
        return response.results[0].resource_name

    def _job(self, platform_id: str, kind: str) -> tuple[str, int]:
        """This sync's job of `kind` on the list, created on first use; (job, calls made)."""
        opened = self._open_jobs.get(platform_id)
        if opened is not None and opened[1] == kind:
            return opened[0], 0
        metadata = CustomerMatchUserListMetadata(user_list=platform_id)
        if kind == "create":  # Google asks for consent on adds only
            metadata.consent = Consent(
                ad_user_data=self.destination.ad_user_data_consent,
                ad_personalization=self.destination.ad_personalization_consent,
            )
        job = OfflineUserDataJob(
            type_="CUSTOMER_MATCH_USER_LIST", customer_match_user_list_metadata=metadata
        )
        response = self._call(
            self.services.jobs.create_offline_user_data_job,
            audience=platform_id,
            customer_id=self.customer_id,
            job=job,
        )
        self._open_jobs[platform_id] = (response.resource_name, kind)
        return response.resource_name, 1

    def _add_operations(
        self, platform_id: str, job: str, operations: list[OfflineUserDataJobOperation]
    ) -> dict[int, str]:
        """Add operations to the job; the failed ones by index among them."""
        response = self._call(
            self.services.jobs.add_offline_user_data_job_operations,
            audience=platform_id,
            request=AddOfflineUserDataJobOperationsRequest(
                resource_name=job, enable_partial_failure=True, operations=operations
            ),
        )
        return failed_operations(response)

    def _stage(self, platform_id: str, rows: list[Row], kind: str) -> BatchResult:
        job, calls = self._job(platform_id, kind)
        operations = [OfflineUserDataJobOperation(**{kind: _user_data(row)}) for row in rows]
        failed = self._add_operations(platform_id, job, operations)
        return BatchResult(failed, calls + 1, [(job, len(rows) - len(failed))])

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._stage(platform_id, rows, "create")

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._stage(platform_id, rows, "remove")

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult:
        """One job: remove everything, then add every member (Google's replace flow). The
        remove-all goes alone in the job's first request, so failures index members."""
        job, calls = self._job(platform_id, "create")
        self._add_operations(platform_id, job, [OfflineUserDataJobOperation(remove_all=True)])
        replaced = BatchResult(requests=calls + 1)
        offset = 0
        for rows in batches:
            operations = [OfflineUserDataJobOperation(create=_user_data(row)) for row in rows]
            failed = self._add_operations(platform_id, job, operations)
            replaced.rejected.update({offset + i: why for i, why in failed.items()})
            replaced.requests += 1
            offset += len(rows)
        replaced.pending = [(job, offset - len(replaced.rejected))]
        return replaced

    def submit(self, platform_id: str) -> int:
        """Run the job this sync filled for the list; its completion is read by a later
        sync."""
        opened = self._open_jobs.pop(platform_id, None)
        if opened is None:
            return 0
        self._call(
            self.services.jobs.run_offline_user_data_job,
            audience=platform_id,
            resource_name=opened[0],
        )
        return 1

    def _jobs(self, condition: str) -> Any:
        return self._search(
            "SELECT offline_user_data_job.resource_name, offline_user_data_job.status,"
            " offline_user_data_job.failure_reason,"
            " offline_user_data_job.operation_metadata.match_rate_range"
            f" FROM offline_user_data_job WHERE {condition}"
        )

    def request_verdicts(self, request_ids: list[str]) -> dict[str, Verdict]:
        """A job's verdict once it ended. A job Google does not find, or one never run (its
        sync was cut short), applied nothing."""
        verdicts: dict[str, Verdict] = {}
        for job in request_ids:
            rows = list(self._jobs(f"offline_user_data_job.resource_name = '{job}'"))
            if not rows:
                verdicts[job] = Verdict(f"Google Ads has no job {job}")
                continue
            state = rows[0].offline_user_data_job
            status = state.status.name
            if status == "SUCCESS":
                verdicts[job] = Verdict()
                if state.operation_metadata.match_rate_range:
                    self.last_match_rate_range = state.operation_metadata.match_rate_range.name
            elif status == "PENDING":
                verdicts[job] = Verdict(f"job {job} was never run")
            elif status != "RUNNING":
                verdicts[job] = Verdict(f"job {job} ended {status}: {state.failure_reason.name}")
        return verdicts

    def busy(self, platform_id: str) -> str | None:
        for row in self._jobs(
            "offline_user_data_job.customer_match_user_list_metadata.user_list ="
            f" '{platform_id}' AND offline_user_data_job.status = 'RUNNING'"
        ):
            return f"Google Ads job {row.offline_user_data_job.resource_name} is still running"
        return None

    def match_info(self, platform_id: str) -> dict[str, Any]:
        query = (
            "SELECT user_list.size_for_search, user_list.size_for_display,"
            " user_list.match_rate_percentage FROM user_list"
            f" WHERE user_list.resource_name = '{platform_id}'"
        )
        info: dict[str, Any] = {}
        for row in self._call(
            self.services.search.search, customer_id=self.customer_id, query=query
        ):
            info["search_size"] = row.user_list.size_for_search
            info["display_size"] = row.user_list.size_for_display
            info["match_rate_percentage"] = row.user_list.match_rate_percentage
        if self.last_match_rate_range:
            info["match_rate_range"] = self.last_match_rate_range
        return info
