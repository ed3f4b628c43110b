"""Google Ads API v26 half of the Google gRPC sandbox: the Customer Match flow.

Serves ``UserListService/MutateUserLists`` (create CRM lists, remove lists),
``OfflineUserDataJobService`` (create / add operations / run),
``google.longrunning.Operations/GetOperation`` for the run's LRO, and
``GoogleAdsService/Search|SearchStream`` for a small GAQL subset.

Errors follow the real API's shape so that the library's ``ExceptionInterceptor`` raises
``GoogleAdsException``: a serialized ``GoogleAdsFailure`` in the
``google.ads.googleads.v26.errors.googleadsfailure-bin`` trailer (also packed into
``grpc-status-details-bin``), plus a ``request-id`` trailer on every response. The
interceptor deliberately leaves RESOURCE_EXHAUSTED and INTERNAL unconverted, so those faults
reach the caller as ``google.api_core`` exceptions even though they carry the trailer.

Behaviour worth knowing:

* Every call needs ``developer-token`` metadata. Without it the sandbox answers as the live API
  was seen to (google/megalista#106): INVALID_ARGUMENT with
  ``request_error = DEVELOPER_TOKEN_PARAMETER_MISSING`` (a RequestError, not an
  AuthenticationError). ``login-customer-id``, if sent, must be 10 digits
  (``header_error = INVALID_LOGIN_CUSTOMER_ID``).
* Operations are validated when added and applied when the job is run (creates add, removes
  delete, remove_all clears). A job may not mix creates and removes (CONFLICTING_OPERATION),
  and remove_all must be the job's first operation (INVALID_OPERATION_ORDER), as the v26 enum
  documentation says. Job-level consent with a DENIED value is refused with
  CUSTOMER_NOT_ACCEPTED_CUSTOMER_DATA_TERMS; a job without consent is accepted (removals need
  none).
* A removed list is gone for both APIs: a job created on it, or run after its removal, fails
  with ``offline_user_data_job_error = INVALID_USER_LIST_ID`` (as for a list that never
  existed), GAQL no longer returns it and its name is free. UNVERIFIED against the live API:
  which error a removed list gets, whether GAQL still lists it, whether its name is reused.
* A run job is RUNNING for ``job_seconds`` after its run, however often its status is read
  (GetOperation or a GAQL search), then SUCCESS; with ``job_seconds=0`` the run's own response
  is already done. Its operations reach the list when it succeeds. Google's examples say
  "Offline user data jobs may take 6 hours or more to complete, so checking the status
  periodically, instead of waiting, can be more efficient" (google-ads-python,
  examples/remarketing/add_customer_match_user_list.py), jobs "can take hours" and it is "far
  more efficient to create a single large job than several smaller jobs"
  (https://developers.google.com/google-ads/api/docs/remarketing/audience-segments/customer-match/get-started);
  running a second job on a list while one is RUNNING fails with
  ``database_error = CONCURRENT_MODIFICATION`` (the common-errors guide,
  https://developers.google.com/google-ads/api/docs/best-practices/common-errors, names it for
  concurrent changes to one resource; UNVERIFIED that the live API answers at the run rather
  than failing the job).
* GAQL: ``SELECT <fields of one resource> FROM user_list|offline_user_data_job
  [WHERE <field> = <literal> [AND ...]] [LIMIT n]``; fields are checked against the v26
  protos, and only selected fields (plus ``resource_name``) are returned. Anything else is
  INVALID_ARGUMENT with a ``query_error``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import grpc
from google.ads.googleads.v26.common.types.consent import Consent
from google.ads.googleads.v26.common.types.offline_user_data import (
    CustomerMatchUserListMetadata,
)
from google.ads.googleads.v26.common.types.user_lists import CrmBasedUserListInfo
from google.ads.googleads.v26.enums.types.consent_status import ConsentStatusEnum
from google.ads.googleads.v26.enums.types.customer_match_upload_key_type import (
    CustomerMatchUploadKeyTypeEnum,
)
from google.ads.googleads.v26.enums.types.offline_user_data_job_type import (
    OfflineUserDataJobTypeEnum,
)
from google.ads.googleads.v26.errors.types import errors
from google.ads.googleads.v26.resources.types.offline_user_data_job import (
    OfflineUserDataJob,
    OfflineUserDataJobMetadata,
)
from google.ads.googleads.v26.resources.types.user_list import UserList
from google.ads.googleads.v26.services.types import (
    google_ads_service,
    offline_user_data_job_service,
    user_list_service,
)
from google.longrunning import operations_pb2
from google.protobuf import duration_pb2, empty_pb2, field_mask_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import status_pb2

from cdp_devkit.sandbox.google.common import (
    MAX_MEMBERSHIP_DAYS,
    MAX_REPORTED_ERRORS,
    AudienceStore,
    Call,
    Metadata,
    Rpc,
    RpcFailure,
    UserListRecord,
    google_ads_list_name,
    pack,
)

VERSION = "v26"
FAILURE_KEY = f"google.ads.googleads.{VERSION}.errors.googleadsfailure-bin"
MAX_IDENTIFIERS_PER_REQUEST = 100_000
MAX_IDENTIFIERS_PER_USER_DATA = 20

_SERVICES = f"google.ads.googleads.{VERSION}.services"
_CUSTOMER = re.compile(r"[0-9]{10}")
_LIST_NAME = re.compile(r"customers/([0-9]{10})/userLists/([0-9]+)")
_JOB_NAME = re.compile(r"customers/([0-9]{10})/offlineUserDataJobs/([0-9]+)")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_COUNTRY = re.compile(r"[A-Za-z]{2}")
_QUERY = re.compile(
    r"\s*SELECT\s+(?P<select>.+?)\s+FROM\s+(?P<resource>\w+)"
    r"(?:\s+WHERE\s+(?P<where>.+?))?(?:\s+LIMIT\s+(?P<limit>\d+))?\s*",
    re.IGNORECASE | re.DOTALL,
)
_CONDITION = re.compile(
    r"\s*(?P<field>[\w.]+)\s*=\s*"
    r"(?:'(?P<single>(?:[^'\\]|\\.)*)'|\"(?P<double>(?:[^\"\\]|\\.)*)\"|(?P<bare>[\w.+-]+))"
    r"\s*(?:AND\b|$)",
    re.IGNORECASE,
)
_SEARCHABLE = ("user_list", "offline_user_data_job")

_DENIED = ConsentStatusEnum.ConsentStatus.DENIED
_CONTACT_INFO = CustomerMatchUploadKeyTypeEnum.CustomerMatchUploadKeyType.CONTACT_INFO
_CUSTOMER_MATCH = OfflineUserDataJobTypeEnum.OfflineUserDataJobType.CUSTOMER_MATCH_USER_LIST
_FAILURE = errors.GoogleAdsFailure.pb()
_ERROR_CODE = errors.ErrorCode.pb()
_ROW = google_ads_service.GoogleAdsRow.pb()


@dataclass(frozen=True)
class AdsError:
    """One ``GoogleAdsError``: ``code_field`` is the ErrorCode oneof member, ``path`` the
    location as (field_name, index or None) pairs."""

    code_field: str
    code_name: str
    message: str
    path: tuple[tuple[str, int | None], ...] = ()
    details: Message | None = None


@dataclass
class _Job:
    customer_id: str
    job_id: int
    list_id: int
    consent: Consent | None
    status: str = "PENDING"
    kind: str | None = None  # "create" or "remove" once the job has either
    staged: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def resource_name(self) -> str:
        return f"customers/{self.customer_id}/offlineUserDataJobs/{self.job_id}"

    @property
    def operation_name(self) -> str:
        return f"customers/{self.customer_id}/operations/{self.job_id}"


def failure(code: grpc.StatusCode, ads_errors: Sequence[AdsError], call: Call) -> RpcFailure:
    """A whole-request failure the library's ExceptionInterceptor can decode."""
    body = failure_message(ads_errors[:MAX_REPORTED_ERRORS], call.request_id)
    message = (
        "Request contains an invalid argument."
        if code == grpc.StatusCode.INVALID_ARGUMENT
        else ads_errors[0].message
    )
    return RpcFailure(code, message, [body], ((FAILURE_KEY, body.SerializeToString()),))


def failure_message(ads_errors: Sequence[AdsError], request_id: str) -> Message:
    body = _FAILURE(request_id=request_id)
    for ads_error in ads_errors:
        enum = _ERROR_CODE.DESCRIPTOR.fields_by_name[ads_error.code_field].enum_type
        item = body.errors.add(message=ads_error.message)
        setattr(
            item.error_code, ads_error.code_field, enum.values_by_name[ads_error.code_name].number
        )
        for name, index in ads_error.path:
            element = item.location.field_path_elements.add(field_name=name)
            if index is not None:
                element.index = index
        if ads_error.details is not None:
            item.details.CopyFrom(ads_error.details)
    return body


def _partial_failure(ads_errors: Sequence[AdsError], request_id: str) -> status_pb2.Status:
    first = ads_errors[0]
    where = ".".join(n if i is None else f"{n}[{i}]" for n, i in first.path)
    text = f"{first.message}, at {where}"
    if len(ads_errors) > 1:
        text = f"Multiple errors in 'details'. First error: {text}"
    return status_pb2.Status(
        code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
        message=text,
        details=[pack(failure_message(ads_errors, request_id))],
    )


def _is_sha256(value: str) -> bool:
    return bool(_HEX_SHA256.fullmatch(value))


class GoogleAdsApi:
    """Handlers for the Google Ads services over the shared :class:`AudienceStore`."""

    def __init__(self, store: AudienceStore, job_seconds: float) -> None:
        if job_seconds < 0:
            raise ValueError("job_seconds must be >= 0")
        self.store = store
        self.job_seconds = job_seconds
        self._jobs: dict[int, _Job] = {}
        self._job_ids = itertools.count(7_200_000_001)

    def rpcs(self) -> list[Rpc]:
        jobs = f"{_SERVICES}.OfflineUserDataJobService"
        ads = f"{_SERVICES}.GoogleAdsService"
        svc = offline_user_data_job_service
        return [
            Rpc(
                f"{_SERVICES}.UserListService",
                "MutateUserLists",
                user_list_service.MutateUserListsRequest,
                self._mutate_user_lists,
            ),
            Rpc(
                jobs, "CreateOfflineUserDataJob", svc.CreateOfflineUserDataJobRequest, self._create
            ),
            Rpc(
                jobs,
                "AddOfflineUserDataJobOperations",
                svc.AddOfflineUserDataJobOperationsRequest,
                self._add_operations,
            ),
            Rpc(jobs, "RunOfflineUserDataJob", svc.RunOfflineUserDataJobRequest, self._run),
            Rpc(
                "google.longrunning.Operations",
                "GetOperation",
                operations_pb2.GetOperationRequest,
                self._get_operation,
            ),
            Rpc(ads, "Search", google_ads_service.SearchGoogleAdsRequest, self._search),
            Rpc(
                ads,
                "SearchStream",
                google_ads_service.SearchGoogleAdsStreamRequest,
                self._search_stream,
                streaming=True,
            ),
        ]

    def admit(self, call: Call) -> None:
        self.store.process_due()
        if not str(call.metadata.get("developer-token", "")).strip():
            error = AdsError(
                "request_error",
                "DEVELOPER_TOKEN_PARAMETER_MISSING",
                "developer-token parameter is missing.",
            )
            raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)
        login = call.metadata.get("login-customer-id")
        if login is not None and not _CUSTOMER.fullmatch(str(login)):
            error = AdsError(
                "header_error",
                "INVALID_LOGIN_CUSTOMER_ID",
                "The login customer ID must be 10 digits without dashes.",
            )
            raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)

    def trailers(self, call: Call) -> Metadata:
        return (("request-id", call.request_id),)

    def fault(self, kind: str, call: Call) -> RpcFailure:
        if kind in ("quota", "daily_quota"):
            daily = kind == "daily_quota"
            details = errors.ErrorDetails.pb()(
                quota_error_details=errors.QuotaErrorDetails.pb()(
                    rate_scope=errors.QuotaErrorDetails.QuotaRateScope.DEVELOPER,
                    rate_name="Number of operations for basic access" if daily else "Requests",
                    retry_delay=duration_pb2.Duration(seconds=86_400 if daily else 30),
                )
            )
            error = AdsError(
                "quota_error",
                "RESOURCE_EXHAUSTED" if daily else "RESOURCE_TEMPORARILY_EXHAUSTED",
                "Too many requests. Retry in " + ("24 hours." if daily else "30 seconds."),
                details=details,
            )
            return failure(grpc.StatusCode.RESOURCE_EXHAUSTED, [error], call)
        if kind == "unavailable":
            return RpcFailure(grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable.")
        if kind == "internal":
            error = AdsError("internal_error", "INTERNAL_ERROR", "An internal error has occurred.")
            return failure(grpc.StatusCode.INTERNAL, [error], call)
        error = AdsError(
            "not_allowlisted_error",
            "CUSTOMER_NOT_ALLOWLISTED_FOR_THIS_FEATURE",
            "Customer is not on the allow-list for this feature.",
        )
        return failure(grpc.StatusCode.PERMISSION_DENIED, [error], call)

    # UserListService

    def _mutate_user_lists(
        self, request: Message, call: Call
    ) -> user_list_service.MutateUserListsResponse:
        self._check_customer(request.customer_id, call)
        if not request.operations:
            _raise_request_error("OPERATION_REQUIRED", "At least one operation is required.", call)
        if any(op.WhichOneof("operation") == "update" for op in request.operations):
            raise RpcFailure(
                grpc.StatusCode.UNIMPLEMENTED,
                "the sandbox models user list creation and removal only",
            )
        ads_errors: list[AdsError] = []
        with self.store.lock:
            names: set[str] = set()
            valid: list[tuple[int, str, str, str, int]] = []
            removals: dict[int, UserListRecord] = {}
            for i, op in enumerate(request.operations):
                if op.WhichOneof("operation") == "remove":
                    problem, record = self._removal(op.remove, request.customer_id, i, removals)
                    if problem is not None:
                        ads_errors.append(problem)
                    else:
                        removals[i] = record
                    continue
                problem, days = _user_list_problem(op.create, i)
                name = op.create.name.strip()
                if problem is None and (
                    name in names or self.store.name_taken(request.customer_id, name)
                ):
                    problem = AdsError(
                        "user_list_error",
                        "NAME_ALREADY_USED",
                        "Name is already being used for another user list for the account.",
                        (("operations", i), ("create", None), ("name", None)),
                    )
                if problem is not None:
                    ads_errors.append(problem)
                    continue
                names.add(name)
                created = op.create
                valid.append((i, name, created.description, created.integration_code, days))
            partial = self._settle(ads_errors, request.partial_failure, call)
            done: dict[int, str] = {}
            if not request.validate_only:
                for i, record in removals.items():
                    self.store.remove(record)
                    done[i] = google_ads_list_name(record.account_id, record.list_id)
                for i, name, description, code, days in valid:
                    record = self.store.create(request.customer_id, name, description, code, days)
                    done[i] = google_ads_list_name(record.account_id, record.list_id)
            results = [done.get(i, "") for i in range(len(request.operations))]
        return user_list_service.MutateUserListsResponse(
            partial_failure_error=partial,
            results=[user_list_service.MutateUserListResult(resource_name=r) for r in results],
        )

    def _removal(
        self,
        resource_name: str,
        customer_id: str,
        i: int,
        removals: dict[int, UserListRecord],
    ) -> tuple[AdsError | None, UserListRecord | None]:
        """(problem, list) for a remove operation (``UserListOperation.remove``, the Google
        Ads reference:
        https://developers.google.com/google-ads/api/reference/rpc/v26/UserListOperation).
        The MutateError names are the documented ones for a resource that is not there or
        named twice; UNVERIFIED that the live API answers a removed list's removal so."""
        at = (("operations", i), ("remove", None))
        match = _LIST_NAME.fullmatch(resource_name)
        if match is None:
            problem = AdsError(
                "request_error", "RESOURCE_NAME_MALFORMED", "Malformed user list name.", at
            )
            return problem, None
        record = (
            self.store.find(match.group(1), int(match.group(2)))
            if match.group(1) == customer_id
            else None
        )
        if record is None:
            problem = AdsError(
                "mutate_error", "RESOURCE_NOT_FOUND", "Requested resource was not found.", at
            )
            return problem, None
        if record in removals.values():
            problem = AdsError(
                "mutate_error",
                "ID_EXISTS_IN_MULTIPLE_MUTATES",
                "Cannot mutate the same resource twice in one request.",
                at,
            )
            return problem, None
        return None, record

    # OfflineUserDataJobService

    def _create(
        self, request: Message, call: Call
    ) -> offline_user_data_job_service.CreateOfflineUserDataJobResponse:
        self._check_customer(request.customer_id, call)
        job = request.job
        if job.type_ != _CUSTOMER_MATCH:
            _raise_field_error(
                "INVALID_VALUE", "Only CUSTOMER_MATCH_USER_LIST jobs are modelled.", "type", call
            )
        if job.WhichOneof("metadata") != "customer_match_user_list_metadata":
            _raise_field_error(
                "REQUIRED",
                "customer_match_user_list_metadata is required.",
                "customer_match_user_list_metadata",
                call,
            )
        metadata = job.customer_match_user_list_metadata
        consent = metadata.consent if metadata.HasField("consent") else None
        if consent is not None and _DENIED in (consent.ad_user_data, consent.ad_personalization):
            error = AdsError(
                "offline_user_data_job_error",
                "CUSTOMER_NOT_ACCEPTED_CUSTOMER_DATA_TERMS",
                "Consent is DENIED for this job.",
                (("job", None), ("customer_match_user_list_metadata", None), ("consent", None)),
            )
            raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)
        with self.store.lock:
            match = _LIST_NAME.fullmatch(metadata.user_list)
            record = (
                self.store.find(match.group(1), int(match.group(2)))
                if match and match.group(1) == request.customer_id
                else None
            )
            if record is None:
                error = AdsError(
                    "offline_user_data_job_error",
                    "INVALID_USER_LIST_ID",
                    "The user list ID provided for the job is invalid.",
                    (
                        ("job", None),
                        ("customer_match_user_list_metadata", None),
                        ("user_list", None),
                    ),
                )
                raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)
            if request.validate_only:
                return offline_user_data_job_service.CreateOfflineUserDataJobResponse()
            stored = _Job(
                request.customer_id,
                next(self._job_ids),
                record.list_id,
                Consent.wrap(consent) if consent is not None else None,
            )
            self._jobs[stored.job_id] = stored
        return offline_user_data_job_service.CreateOfflineUserDataJobResponse(
            resource_name=stored.resource_name
        )

    def _add_operations(
        self, request: Message, call: Call
    ) -> offline_user_data_job_service.AddOfflineUserDataJobOperationsResponse:
        operations = request.operations
        if not operations:
            _raise_request_error("OPERATION_REQUIRED", "At least one operation is required.", call)
        identifiers = sum(
            len(getattr(op, kind).user_identifiers)
            for op in operations
            if (kind := op.WhichOneof("operation")) in ("create", "remove")
        )
        if identifiers > MAX_IDENTIFIERS_PER_REQUEST:
            error = AdsError(
                "offline_user_data_job_error",
                "TOO_MANY_USER_IDENTIFIERS",
                "Maximum number of user identifiers allowed per request is 100,000 and per "
                f"operation is 20; got {identifiers}.",
                (("operations", None),),
            )
            raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)
        ads_errors: list[AdsError] = []
        parsed: list[tuple[int, str, str | None]] = []
        for i, op in enumerate(operations):
            problem, kind, key = _parse_operation(op, i)
            if problem is None and _refused(op, kind, self.store.refused):
                problem = AdsError(
                    "field_error",
                    "INVALID_VALUE",
                    "The value is not acceptable.",
                    (("operations", i), (kind, None)),
                )
            if problem is not None:
                ads_errors.append(problem)
            else:
                parsed.append((i, kind, key))
        with self.store.lock:
            job = self._job(request.resource_name, call)
            if job.status != "PENDING":
                _raise_job_error("JOB_ALREADY_STARTED", "The job has already been run.", call)
            kind_so_far = job.kind
            staged: list[tuple[str, str | None]] = []
            for i, kind, key in parsed:
                if kind == "remove_all" and (i > 0 or job.staged):
                    ads_errors.append(
                        AdsError(
                            "offline_user_data_job_error",
                            "INVALID_OPERATION_ORDER",
                            "A remove-all operation must be the first operation of the job.",
                            (("operations", i), ("remove_all", None)),
                        )
                    )
                    continue
                if kind != "remove_all":
                    if kind_so_far not in (None, kind):
                        ads_errors.append(
                            AdsError(
                                "offline_user_data_job_error",
                                "CONFLICTING_OPERATION",
                                "Mixing creation and removal of offline data in the same job "
                                "is not allowed.",
                                (("operations", i), (kind, None)),
                            )
                        )
                        continue
                    kind_so_far = kind
                staged.append((kind, key))
            ads_errors.sort(key=lambda e: e.path[0][1] or 0)
            partial = self._settle(ads_errors, bool(request.enable_partial_failure), call)
            if not request.validate_only:
                job.staged.extend(staged)
                job.kind = kind_so_far
        return offline_user_data_job_service.AddOfflineUserDataJobOperationsResponse(
            partial_failure_error=partial
        )

    def _run(self, request: Message, call: Call) -> operations_pb2.Operation:
        with self.store.lock:
            job = self._job(request.resource_name, call)
            if job.status != "PENDING":
                _raise_job_error("JOB_ALREADY_STARTED", "The job has already been run.", call)
            record = self.store.lists.get(job.list_id)
            if record is None:
                # The list was removed since the job was created: the job's own error for a
                # list that is not there (UNVERIFIED against the live API).
                _raise_job_error(
                    "INVALID_USER_LIST_ID",
                    "The user list ID provided for the job is invalid.",
                    call,
                )
            if any(
                other.list_id == job.list_id and other.status == "RUNNING"
                for other in self._jobs.values()
            ):
                error = AdsError(
                    "database_error",
                    "CONCURRENT_MODIFICATION",
                    "Multiple requests were attempting to modify the same resource at once."
                    " Retry the request.",
                )
                raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)
            if request.validate_only:
                return operations_pb2.Operation(name=job.operation_name, done=True)
            job.status = "RUNNING"
            if self.job_seconds:
                self.store.schedule(self.job_seconds, lambda: self._complete(job))
            else:
                self._complete(job)
            return self._operation(job)

    def _complete(self, job: _Job) -> None:
        """The job's operations reach the list; a list removed meanwhile fails the job."""
        record = self.store.lists.get(job.list_id)
        if record is None:
            job.status = "FAILED"
            return
        now = self.store.clock()
        for kind, key in job.staged:
            if kind == "create":
                record.members[key] = now
            elif kind == "remove":
                record.members.pop(key, None)
            else:
                record.members.clear()
        job.status = "SUCCESS"

    def _get_operation(self, request: Message, call: Call) -> operations_pb2.Operation:
        with self.store.lock:
            job = next((j for j in self._jobs.values() if j.operation_name == request.name), None)
            if job is None or job.status == "PENDING":
                _raise_request_error(
                    "RESOURCE_NOT_FOUND", f"Operation {request.name!r} not found.", call
                )
            return self._operation(job)

    def _operation(self, job: _Job) -> operations_pb2.Operation:
        done = job.status == "SUCCESS"
        operation = operations_pb2.Operation(name=job.operation_name, done=done)
        operation.metadata.Pack(OfflineUserDataJobMetadata.pb(self._job_metadata(job)))
        if done:
            operation.response.Pack(empty_pb2.Empty())
        return operation

    def _job_metadata(self, job: _Job) -> OfflineUserDataJobMetadata:
        if job.status != "SUCCESS" or job.kind != "create":
            return OfflineUserDataJobMetadata()
        return OfflineUserDataJobMetadata(
            match_rate_range=f"MATCH_RANGE_{self.store.match_rate_suffix()}"
        )

    # GoogleAdsService

    def _search(self, request: Message, call: Call) -> google_ads_service.SearchGoogleAdsResponse:
        rows, mask = self._query(request.customer_id, request.query, call)
        return google_ads_service.SearchGoogleAdsResponse(
            results=[google_ads_service.GoogleAdsRow.wrap(r) for r in rows], field_mask=mask
        )

    def _search_stream(
        self, request: Message, call: Call
    ) -> list[google_ads_service.SearchGoogleAdsStreamResponse]:
        rows, mask = self._query(request.customer_id, request.query, call)
        return [
            google_ads_service.SearchGoogleAdsStreamResponse(
                results=[google_ads_service.GoogleAdsRow.wrap(r) for r in rows],
                field_mask=mask,
                request_id=call.request_id,
            )
        ]

    def _query(
        self, customer_id: str, query: str, call: Call
    ) -> tuple[list[Message], field_mask_pb2.FieldMask]:
        self._check_customer(customer_id, call)
        resource, select, conditions, limit = _parse_query(query, call)
        mask = field_mask_pb2.FieldMask(paths=[".".join(p) for p in select])
        rows: list[Message] = []
        with self.store.lock:
            if resource == "user_list":
                candidates: list[UserListRecord | _Job] = [
                    r for r in self.store.lists.values() if r.account_id == customer_id
                ]
            else:
                candidates = [j for j in self._jobs.values() if j.customer_id == customer_id]
            for candidate in candidates:
                row = self._row(candidate)
                if not all(_value(row, path) == literal for path, literal in conditions):
                    continue
                selected = _ROW()
                field_mask_pb2.FieldMask(
                    paths=[*mask.paths, f"{resource}.resource_name"]
                ).MergeMessage(row, selected)
                rows.append(selected)
                if limit is not None and len(rows) >= limit:
                    break
        return rows, mask

    def _row(self, candidate: UserListRecord | _Job) -> Message:
        if isinstance(candidate, UserListRecord):
            row = google_ads_service.GoogleAdsRow(user_list=self._render_list(candidate))
        else:
            row = google_ads_service.GoogleAdsRow(offline_user_data_job=self._render_job(candidate))
        return google_ads_service.GoogleAdsRow.pb(row)

    def _render_job(self, job: _Job) -> OfflineUserDataJob:
        return OfflineUserDataJob(
            resource_name=job.resource_name,
            id=job.job_id,
            type_="CUSTOMER_MATCH_USER_LIST",
            status=job.status,
            failure_reason="UNSPECIFIED",
            operation_metadata=self._job_metadata(job),
            customer_match_user_list_metadata=CustomerMatchUserListMetadata(
                user_list=google_ads_list_name(job.customer_id, job.list_id),
                consent=job.consent,
            ),
        )

    def _render_list(self, record: UserListRecord) -> UserList:
        count = len(record.members)
        return UserList(
            resource_name=google_ads_list_name(record.account_id, record.list_id),
            id=record.list_id,
            read_only=False,
            name=record.display_name,
            description=record.description,
            integration_code=record.integration_code,
            membership_status="OPEN",
            membership_life_span=record.membership_days,
            size_for_display=count,
            size_for_search=count,
            type_="CRM_BASED",
            access_reason="OWNED",
            account_user_list_status="ENABLED",
            eligible_for_search=True,
            eligible_for_display=True,
            match_rate_percentage=self.store.match_rate_percent if count else 0,
            crm_based_user_list=CrmBasedUserListInfo(
                upload_key_type="CONTACT_INFO", data_source_type="FIRST_PARTY"
            ),
        )

    # helpers

    def _check_customer(self, customer_id: str, call: Call) -> None:
        if not _CUSTOMER.fullmatch(customer_id):
            _raise_request_error(
                "INVALID_CUSTOMER_ID", "customer_id must be 10 digits without dashes.", call
            )

    def _job(self, resource_name: str, call: Call) -> _Job:
        match = _JOB_NAME.fullmatch(resource_name)
        if match is None:
            _raise_request_error(
                "RESOURCE_NAME_MALFORMED", f"Malformed job name {resource_name!r}.", call
            )
        job = self._jobs.get(int(match.group(2)))
        if job is None or job.customer_id != match.group(1):
            _raise_request_error("RESOURCE_NOT_FOUND", f"No job {resource_name!r}.", call)
        return job

    def _settle(
        self, ads_errors: list[AdsError], partial: bool, call: Call
    ) -> status_pb2.Status | None:
        """Fail the whole request, or describe the failed operations under partial failure."""
        if not ads_errors:
            return None
        if not partial:
            raise failure(grpc.StatusCode.INVALID_ARGUMENT, ads_errors, call)
        return _partial_failure(ads_errors, call.request_id)


def _raise_request_error(name: str, message: str, call: Call) -> NoReturn:
    raise failure(
        grpc.StatusCode.INVALID_ARGUMENT, [AdsError("request_error", name, message)], call
    )


def _raise_job_error(name: str, message: str, call: Call) -> NoReturn:
    error = AdsError("offline_user_data_job_error", name, message)
    raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)


def _raise_field_error(name: str, message: str, field_name: str, call: Call) -> NoReturn:
    error = AdsError("field_error", name, message, (("job", None), (field_name, None)))
    raise failure(grpc.StatusCode.INVALID_ARGUMENT, [error], call)


def _user_list_problem(user_list: Message, i: int) -> tuple[AdsError | None, int]:
    """(first problem or None, membership days) for a user list to create."""
    at = (("operations", i), ("create", None))
    if not user_list.name.strip():
        return AdsError(
            "field_error", "REQUIRED", "The name is required.", (*at, ("name", None))
        ), 0
    if user_list.WhichOneof("user_list") != "crm_based_user_list":
        return (
            AdsError(
                "user_list_error",
                "CONCRETE_TYPE_REQUIRED",
                "The sandbox models CRM-based lists only: set crm_based_user_list.",
                at,
            ),
            0,
        )
    if user_list.crm_based_user_list.upload_key_type != _CONTACT_INFO:
        return (
            AdsError(
                "field_error",
                "INVALID_VALUE",
                "The sandbox models CONTACT_INFO lists only.",
                (*at, ("crm_based_user_list", None), ("upload_key_type", None)),
            ),
            0,
        )
    days = MAX_MEMBERSHIP_DAYS
    if user_list.HasField("membership_life_span"):
        days = user_list.membership_life_span
        if not 0 < days <= MAX_MEMBERSHIP_DAYS:
            return (
                AdsError(
                    "range_error",
                    "TOO_HIGH" if days > MAX_MEMBERSHIP_DAYS else "TOO_LOW",
                    f"membership_life_span must lie in 1..{MAX_MEMBERSHIP_DAYS} days.",
                    (*at, ("membership_life_span", None)),
                ),
                0,
            )
    return None, days


def _refused(op: Message, kind: str, refused: frozenset[str]) -> bool:
    if not refused or kind not in ("create", "remove"):
        return False
    return any(
        getattr(identifier, identifier.WhichOneof("identifier") or "hashed_email", "") in refused
        for identifier in getattr(op, kind).user_identifiers
    )


def _parse_operation(op: Message, i: int) -> tuple[AdsError | None, str, str | None]:
    """(problem, kind, member key) for one OfflineUserDataJobOperation."""
    kind = op.WhichOneof("operation")
    if kind is None:
        problem = AdsError(
            "field_error", "REQUIRED", "The operation is empty.", (("operations", i),)
        )
        return problem, "", None
    if kind == "remove_all":
        return None, kind, None
    user_data = getattr(op, kind)
    at = (("operations", i), (kind, None))

    def job_error(name: str, message: str, *path: tuple[str, int | None]) -> AdsError:
        return AdsError("offline_user_data_job_error", name, message, (*at, *path))

    if user_data.HasField("transaction_attribute") or user_data.HasField("user_attribute"):
        problem = job_error(
            "ATTRIBUTES_NOT_APPLICABLE_FOR_CUSTOMER_MATCH_USER_LIST",
            "User attributes cannot be uploaded into a Customer Match user list.",
        )
        return problem, kind, None
    identifiers = user_data.user_identifiers
    if not identifiers:
        problem = job_error("MISSING_USER_IDENTIFIER", "The user identifier is missing.")
        return problem, kind, None
    if len(identifiers) > MAX_IDENTIFIERS_PER_USER_DATA:
        problem = job_error(
            "TOO_MANY_USER_IDENTIFIERS",
            "Maximum number of user identifiers allowed per operation is 20.",
            ("user_identifiers", None),
        )
        return problem, kind, None
    keys: dict[str, str] = {}
    for j, identifier in enumerate(identifiers):
        which = identifier.WhichOneof("identifier")
        where = ("user_identifiers", j)
        if which in ("hashed_email", "hashed_phone_number"):
            value = getattr(identifier, which)
            if not _is_sha256(value):
                problem = job_error(
                    "INVALID_SHA256_FORMAT",
                    "The SHA256 encoded value is malformed.",
                    where,
                    (which, None),
                )
                return problem, kind, None
            keys.setdefault(which, value.lower())
        elif which == "address_info":
            address = identifier.address_info
            for name in ("hashed_first_name", "hashed_last_name"):
                if not _is_sha256(getattr(address, name)):
                    problem = job_error(
                        "INVALID_SHA256_FORMAT",
                        "The SHA256 encoded value is malformed.",
                        where,
                        ("address_info", None),
                        (name, None),
                    )
                    return problem, kind, None
            if not _COUNTRY.fullmatch(address.country_code):
                problem = job_error(
                    "INVALID_COUNTRY_CODE",
                    "The country code is invalid.",
                    where,
                    ("address_info", None),
                    ("country_code", None),
                )
                return problem, kind, None
            if not address.postal_code:
                problem = job_error(
                    "MISSING_USER_IDENTIFIER",
                    "Address matching needs a postal code.",
                    where,
                    ("address_info", None),
                    ("postal_code", None),
                )
                return problem, kind, None
            keys.setdefault(
                "address_info",
                ":".join(
                    [
                        address.hashed_first_name.lower(),
                        address.hashed_last_name.lower(),
                        address.country_code.upper(),
                        address.postal_code,
                    ]
                ),
            )
        elif which is None:
            problem = job_error("MISSING_USER_IDENTIFIER", "Empty user identifier.", where)
            return problem, kind, None
        else:
            problem = job_error(
                "INCOMPATIBLE_UPLOAD_KEY_TYPE",
                "Upload data is not compatible with the CONTACT_INFO list.",
                where,
                (which, None),
            )
            return problem, kind, None
    if "hashed_email" in keys:
        return None, kind, f"email:{keys['hashed_email']}"
    if "hashed_phone_number" in keys:
        return None, kind, f"phone:{keys['hashed_phone_number']}"
    return None, kind, f"address:{keys['address_info']}"


def _query_error(name: str, message: str, call: Call) -> RpcFailure:
    return failure(grpc.StatusCode.INVALID_ARGUMENT, [AdsError("query_error", name, message)], call)


def _parse_query(
    query: str, call: Call
) -> tuple[str, list[list[str]], list[tuple[list[str], str]], int | None]:
    """(resource, selected field paths, WHERE conditions, LIMIT) of a supported GAQL query."""
    match = _QUERY.fullmatch(query)
    if match is None:
        raise _query_error("QUERY_ERROR", "The sandbox understands SELECT ... FROM ... only.", call)
    resource = match.group("resource")
    if resource not in _SEARCHABLE:
        raise _query_error(
            "PROHIBITED_RESOURCE_TYPE_IN_FROM_CLAUSE",
            f"The sandbox serves FROM {' or '.join(_SEARCHABLE)} only.",
            call,
        )
    select = [_field_path(f.strip(), resource, call) for f in match.group("select").split(",")]
    conditions: list[tuple[list[str], str]] = []
    where = match.group("where") or ""
    position = 0
    while position < len(where):
        condition = _CONDITION.match(where, position)
        if condition is None:
            raise _query_error(
                "UNEXPECTED_INPUT",
                "The sandbox supports WHERE <field> = <value> [AND ...] only.",
                call,
            )
        literal = next(
            value for value in condition.group("single", "double", "bare") if value is not None
        )
        path = _field_path(condition.group("field"), resource, call)
        conditions.append((path, re.sub(r"\\(.)", r"\1", literal)))
        position = condition.end()
    limit = int(match.group("limit")) if match.group("limit") else None
    return resource, select, conditions, limit


def _field_path(name: str, resource: str, call: Call) -> list[str]:
    """GAQL field name -> descriptor field names on GoogleAdsRow (``type`` is ``type_``)."""
    parts = name.split(".")
    if parts[0] != resource or len(parts) < 2:
        raise _query_error(
            "PROHIBITED_RESOURCE_TYPE_IN_SELECT_CLAUSE",
            f"{name!r} is not a field of {resource}.",
            call,
        )
    descriptor = _ROW.DESCRIPTOR
    path: list[str] = []
    for index, part in enumerate(parts):
        fields = descriptor.fields_by_name
        found = fields.get(part) or fields.get(f"{part}_")
        last = index == len(parts) - 1
        if (
            found is None
            or found.is_repeated
            or (not last and found.type != FieldDescriptor.TYPE_MESSAGE)
            or (last and found.type == FieldDescriptor.TYPE_MESSAGE)
        ):
            raise _query_error("UNRECOGNIZED_FIELD", f"Unrecognized field {name!r}.", call)
        path.append(found.name)
        descriptor = found.message_type
    return path


def _value(row: Message, path: list[str]) -> str:
    """A field as GAQL literals spell it: enum names, TRUE/FALSE, decimal numbers."""
    message = row
    for part in path[:-1]:
        message = getattr(message, part)
    found = message.DESCRIPTOR.fields_by_name[path[-1]]
    value = getattr(message, path[-1])
    if found.type == FieldDescriptor.TYPE_ENUM:
        return found.enum_type.values_by_number[value].name
    if found.type == FieldDescriptor.TYPE_BOOL:
        return "TRUE" if value else "FALSE"
    return str(value)
