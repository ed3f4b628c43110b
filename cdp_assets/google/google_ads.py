"""Google Customer Match through the Google Ads API (OfflineUserDataJobService).

Only developer tokens allowlisted before April 2026 may use it; new integrations use the
Data Manager API (`data_manager.py`). Each batch is its own job (create with consent, add
operations with partial failure, run, wait), so a member is recorded as confirmed only once
Google finished processing it; adds and removes never share a job, as Google advises.
The operations Google rejects (partial failure, by index) are recorded and re-sent next run.
A job on a user list removed in Google Ads fails with one of ``LIST_GONE``: ``AudienceGone``.

For the loopback sandbox the services get an insecure channel (the library dials only TLS
with credentials), which keeps the library's own interceptors: the metadata one adds the
developer token and login customer id, the exception one turns failures into
``GoogleAdsException``. Importing this module takes most of a second (Google Ads' generated
clients): only a push to a `google_ads` destination does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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
from cdp_assets.activation.sync import AudienceGone, BatchResult, Row
from cdp_assets.lib.retry import with_backoff

# 2 identifiers per operation: 50,000 operations stay under the 100,000 identifiers a
# request may carry; Google suggests about 10,000 per request for speed.
BATCH_SIZE = 10_000
ADS_VERSION = "v26"
MEMBERSHIP_DAYS = 540
JOB_TIMEOUT_SECONDS = 6 * 3600  # jobs can take hours on Google's side
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


def retryable(error: Exception) -> bool:
    if isinstance(error, GoogleAdsException):
        return any("quota_error" in e.error_code for e in error.failure.errors)
    return isinstance(error, RETRYABLE)


def list_missing(error: GoogleAdsException) -> tuple[str, str] | None:
    """(``error_code=NAME``, Google's message) when the failure says the list is gone."""
    for failure in error.failure.errors:
        code = failure.error_code
        member = type(code).pb(code).WhichOneof("error_code")
        name = getattr(code, member).name if member else ""
        if (member, name) in LIST_GONE:
            return f"{member}={name}", failure.message
    return None


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
        job_timeout_seconds: float = JOB_TIMEOUT_SECONDS,
        call_timeout_seconds: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        self.destination = destination
        self.services = services
        self.customer_id = destination.account_id
        self.attempts, self.retry_base_seconds = attempts, retry_base_seconds
        self.job_timeout = job_timeout_seconds
        self.call_timeout = call_timeout_seconds
        self.last_match_rate_range: str | None = None

    def _call(self, fn: Any, *, audience: str | None = None, **kwargs: Any) -> Any:
        """``audience``: the user list the call is on, gone when Google says it is missing."""
        try:
            return with_backoff(
                lambda: fn(**kwargs, timeout=self.call_timeout),
                retryable,
                attempts=self.attempts,
                base_seconds=self.retry_base_seconds,
            )
        except GoogleAdsException as error:
            missing = list_missing(error) if audience is not None else None
            if missing is not None:
                raise AudienceGone(audience, *missing) from None
            raise

    def _search(self, query: str) -> Any:
        return self._call(self.services.search.search, customer_id=self.customer_id, query=query)

    def matchable(self, row: Row) -> bool:
        return bool(row[0] or row[1])

    def ensure_audience(self, target: DestinationAudience) -> str:
        user_list = UserList(
            name=f"{target.destination.tenant_id}: {target.audience}",
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

    def _job(self, platform_id: str, *, with_consent: bool) -> str:
        metadata = CustomerMatchUserListMetadata(user_list=platform_id)
        if with_consent:  # Google asks for consent on adds only
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
        return response.resource_name

    def _run(
        self, platform_id: str, operations: Iterator[list[OfflineUserDataJobOperation]], add: bool
    ) -> BatchResult:
        job = self._job(platform_id, with_consent=add)
        failed: dict[int, str] = {}
        offset, requests = 0, 1
        for chunk in operations:
            response = self._call(
                self.services.jobs.add_offline_user_data_job_operations,
                audience=platform_id,
                request=AddOfflineUserDataJobOperationsRequest(
                    resource_name=job, enable_partial_failure=True, operations=chunk
                ),
            )
            failed.update({offset + i: m for i, m in failed_operations(response).items()})
            offset += len(chunk)
            requests += 1
        operation = self._call(
            self.services.jobs.run_offline_user_data_job, audience=platform_id, resource_name=job
        )
        operation.result(timeout=self.job_timeout)
        self._check_job(job)
        return BatchResult(rejected=failed, requests=requests + 2)

    def _check_job(self, job: str) -> None:
        query = (
            "SELECT offline_user_data_job.resource_name, offline_user_data_job.status,"
            " offline_user_data_job.failure_reason,"
            " offline_user_data_job.operation_metadata.match_rate_range"
            f" FROM offline_user_data_job WHERE offline_user_data_job.resource_name = '{job}'"
        )
        for row in self._call(
            self.services.search.search, customer_id=self.customer_id, query=query
        ):
            state = row.offline_user_data_job
            if state.status.name != "SUCCESS":
                raise RuntimeError(
                    f"Google Ads job {job} ended {state.status.name}: {state.failure_reason.name}"
                )
            self.last_match_rate_range = state.operation_metadata.match_rate_range.name

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult:
        ops = [OfflineUserDataJobOperation(create=_user_data(row)) for row in rows]
        return self._run(platform_id, iter([ops]), add=True)

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult:
        ops = [OfflineUserDataJobOperation(remove=_user_data(row)) for row in rows]
        return self._run(platform_id, iter([ops]), add=False)

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult:
        """One job: remove everything, then add every member (Google's replace flow)."""

        def operations() -> Iterator[list[OfflineUserDataJobOperation]]:
            yield [OfflineUserDataJobOperation(remove_all=True)]
            for rows in batches:
                yield [OfflineUserDataJobOperation(create=_user_data(row)) for row in rows]

        return self._run(platform_id, operations(), add=True)

    def busy(self, platform_id: str) -> str | None:
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
