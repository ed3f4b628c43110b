"""Data Manager API (``google.ads.datamanager.v1``) half of the Google gRPC sandbox.

Serves ``UserListService`` (Create/Get/List/DeleteUserList) and the audience methods of
``IngestionService``. Like the real API it fails fast: any violation fails the whole request
with INVALID_ARGUMENT, a ``google.rpc.ErrorInfo`` (reason = the first violation's
``ErrorReason`` name, domain ``datamanager.googleapis.com``) and a ``google.rpc.BadRequest``
listing up to :data:`MAX_REPORTED_ERRORS` field violations.

An accepted request is only acknowledged: like the real API it is processed later, and records
can still fail then. The diagnostics guide
(https://developers.google.com/data-manager/api/devguides/diagnostics) has the caller capture
each ``request_id`` and poll ``RetrieveRequestStatus`` until every destination reaches
SUCCESS, PARTIAL_SUCCESS or FAILED, 30 minutes to 24 hours later. The sandbox applies a request
``processing_seconds`` after it was acknowledged (in order), and answers PROCESSING until then;
members given to ``fail_in_processing`` fail at that point: left out of the list, counted in
``error_info.error_counts`` (PROCESSING_ERROR_REASON_INVALID_FORMAT) of a PARTIAL_SUCCESS, or
FAILED when no record succeeded. As in the API, the status counts failed records and never
names them. A member's add time (``remove_as_of_time`` compares against it) is the request's
receipt; UNVERIFIED whether Google stamps receipt or processing.

Choices where the documentation leaves room (cf. the google-data-manager.md research notes):

* Consent: ``ErrorReason`` has no consent value, so the sandbox borrows
  ``ProcessingErrorReason`` names: ``PROCESSING_ERROR_REASON_NO_CONSENT`` when a member's
  effective consent (its own ``consent`` fields, else the request's) leaves ``ad_user_data`` or
  ``ad_personalization`` unspecified, ``PROCESSING_ERROR_REASON_DENIED_CONSENT`` when either is
  DENIED. The live API may accept such members and only count them in diagnostics; the sandbox
  rejects them because sending them is a bug on our side.
* Only ``user_data`` and ``composite_data`` members (Customer Match contact data) are modelled;
  others are INVALID_AUDIENCE_MEMBER. ``encryption_info`` is UNIMPLEMENTED.
* Account ids must be ASCII digits (whether the live API takes dashes is unverified).
* ``DeleteUserList`` (https://developers.google.com/data-manager/api/reference/rest/v1/
  accountTypes.accounts.userLists/delete) removes the list, for the Google Ads API too. Reading
  or deleting it again is NOT_FOUND, as the standard delete method has it (AIP-135); ingesting
  into it or removing from it fails as for a list that never existed: INVALID_ARGUMENT with
  INVALID_USER_LIST_ID on ``destinations[i].product_destination_id``. What the live API
  answers for a deleted list is UNVERIFIED.
* Quota faults carry ErrorInfo reason ``RATE_LIMIT_EXCEEDED`` (google.api.ErrorReason) with
  ``metadata["quota_limit"]``: the documented ``IngestionMutateRequestsPer{Minute,Day}PerProject``
  for the three audience mutations; ``RetrieveRequestStatus`` and UserListService get
  sandbox-made names (``IngestionReadRequests…``, ``RequestsPer…PerProject``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from google.ads import datamanager_v1 as dm
from google.protobuf import duration_pb2, empty_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from cdp_devkit.sandbox.google.common import (
    MAX_MEMBERSHIP_DAYS,
    MAX_REPORTED_ERRORS,
    AudienceStore,
    Call,
    Metadata,
    Rpc,
    RpcFailure,
    UserListRecord,
    data_manager_list_name,
    sha256_key,
)

DOMAIN = "datamanager.googleapis.com"
MAX_AUDIENCE_MEMBERS = 10_000
MAX_IDENTIFIERS_PER_MEMBER = 10
MAX_DESTINATIONS = 10
LIST_PAGE_SIZE = 100

_INGESTION = "google.ads.datamanager.v1.IngestionService"
_USER_LISTS = "google.ads.datamanager.v1.UserListService"
_MUTATIONS = frozenset(
    {"IngestAudienceMembers", "RemoveAudienceMembers", "RemoveAllAudienceMembers"}
)
_DIGITS = re.compile(r"[0-9]+")
_REGION = re.compile(r"[A-Z]{2}")
_DIGEST_LIKE = re.compile(r"[0-9a-fA-F]{64}|[A-Za-z0-9+/]{43}=")
_ACCOUNT = re.compile(r"accountTypes/GOOGLE_ADS/accounts/([0-9]+)")
_LIST_NAME = re.compile(r"accountTypes/GOOGLE_ADS/accounts/([0-9]+)/userLists/([0-9]+)")
_LOGIN_HEADER = re.compile(r"accountTypes/[A-Z_]+/accounts/[0-9]+")

_S = dm.RequestStatusPerDestination
_GOOGLE_ADS = dm.ProductAccount.AccountType.GOOGLE_ADS
_CONTACT_ID = dm.IngestedUserListInfo.UploadKeyType.CONTACT_ID
_GRANTED = dm.ConsentStatus.CONSENT_GRANTED
_DENIED = dm.ConsentStatus.CONSENT_DENIED
_DATA_TYPES = (
    _S.DataType.EMAIL,
    _S.DataType.PHONE_NUMBER,
    _S.DataType.ADDRESS,
    _S.DataType.IP_ADDRESS,
)


class Violations:
    """Field violations of one request, reported together as a single INVALID_ARGUMENT."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str]] = []  # (field, reason, description)
        self._fields: set[str] = set()

    @property
    def full(self) -> bool:
        """Enough to report: validation stops here, which keeps huge bad requests cheap."""
        return len(self.items) >= MAX_REPORTED_ERRORS

    def add(self, field: str, reason: str, description: str) -> None:
        if field not in self._fields and not self.full:
            self._fields.add(field)
            self.items.append((field, reason, description))

    def raise_if_any(self) -> None:
        if self.items:
            field, reason, description = self.items[0]
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT,
                reason,
                f"{description} ({field})",
                violations=self.items,
            )


def error(
    code: grpc.StatusCode,
    reason: str,
    message: str,
    *,
    metadata: dict[str, str] | None = None,
    violations: Sequence[tuple[str, str, str]] = (),
    domain: str = DOMAIN,
) -> RpcFailure:
    details: list[Message] = [
        error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata or {})
    ]
    if violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=field, description=description, reason=why
                    )
                    for field, why, description in violations
                ]
            )
        )
    return RpcFailure(code, message, details)


@dataclass(frozen=True)
class _Member:
    key: str
    # identifiers by DataType order: email, phone, address, ip
    counts: tuple[int, int, int, int]
    references: tuple[str, ...]


@dataclass(frozen=True)
class _Target:
    index: int  # into request.destinations
    list_id: int
    reference: str


class DataManagerApi:
    """Handlers for the Data Manager services over the shared :class:`AudienceStore`."""

    def __init__(self, store: AudienceStore, processing_seconds: float) -> None:
        if processing_seconds < 0:
            raise ValueError("processing_seconds must be >= 0")
        self.store = store
        self.processing_seconds = processing_seconds
        # Final statuses, and the requests acknowledged but not yet processed (with the
        # destinations they name, for their PROCESSING status).
        self._statuses: dict[str, list[dm.RequestStatusPerDestination]] = {}
        self._processing: dict[str, list[dm.Destination]] = {}

    def rpcs(self) -> list[Rpc]:
        return [
            Rpc(_USER_LISTS, "CreateUserList", dm.CreateUserListRequest, self._create_list),
            Rpc(_USER_LISTS, "GetUserList", dm.GetUserListRequest, self._get_list),
            Rpc(_USER_LISTS, "ListUserLists", dm.ListUserListsRequest, self._list_lists),
            Rpc(_USER_LISTS, "DeleteUserList", dm.DeleteUserListRequest, self._delete_list),
            Rpc(_INGESTION, "IngestAudienceMembers", dm.IngestAudienceMembersRequest, self._ingest),
            Rpc(_INGESTION, "RemoveAudienceMembers", dm.RemoveAudienceMembersRequest, self._remove),
            Rpc(
                _INGESTION,
                "RemoveAllAudienceMembers",
                dm.RemoveAllAudienceMembersRequest,
                self._remove_all,
            ),
            Rpc(_INGESTION, "RetrieveRequestStatus", dm.RetrieveRequestStatusRequest, self._status),
        ]

    def admit(self, call: Call) -> None:
        self.store.process_due()
        login = call.metadata.get("login-account")
        if login is not None and not _LOGIN_HEADER.fullmatch(str(login)):
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_RESOURCE_NAME",
                "login-account header must look like accountTypes/GOOGLE_ADS/accounts/123",
            )

    def trailers(self, call: Call) -> Metadata:
        return ()

    def fault(self, kind: str, call: Call) -> RpcFailure:
        if kind in ("quota", "daily_quota"):
            if call.method in _MUTATIONS:
                family, per_day = "IngestionMutateRequests", "100000"
            elif call.method == "RetrieveRequestStatus":
                family, per_day = "IngestionReadRequests", "100000"
            else:
                family, per_day = "Requests", "50000"
            per_minute = kind == "quota"
            limit = f"{family}Per{'Minute' if per_minute else 'Day'}PerProject"
            value = "300" if per_minute else per_day
            return error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "RATE_LIMIT_EXCEEDED",
                f"Quota exceeded for quota metric '{limit}' of service '{DOMAIN}'.",
                metadata={"quota_limit": limit, "quota_limit_value": value, "service": DOMAIN},
                domain="googleapis.com",
            )
        if kind == "unavailable":
            return RpcFailure(grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable.")
        if kind == "internal":
            return error(grpc.StatusCode.INTERNAL, "INTERNAL_ERROR", "Internal error encountered.")
        return error(
            grpc.StatusCode.PERMISSION_DENIED,
            "NOT_ALLOWLISTED",
            "The caller is not allowlisted for this feature.",
        )

    # UserListService

    def _create_list(self, request: Message, call: Call) -> dm.UserList:
        account = _ACCOUNT.fullmatch(request.parent)
        if account is None:
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_RESOURCE_NAME",
                "parent must be accountTypes/GOOGLE_ADS/accounts/ID",
            )
        violations = Violations()
        user_list = request.user_list
        display_name = user_list.display_name.strip()
        if not display_name:
            violations.add(
                "user_list.display_name", "REQUIRED_FIELD_MISSING", "display_name is required"
            )
        if user_list.WhichOneof("user_list_info") != "ingested_user_list_info":
            violations.add(
                "user_list.ingested_user_list_info",
                "REQUIRED_FIELD_MISSING",
                "the sandbox models Customer Match lists: ingested_user_list_info is required",
            )
        else:
            info = user_list.ingested_user_list_info
            if list(info.upload_key_types) != [_CONTACT_ID]:
                violations.add(
                    "user_list.ingested_user_list_info.upload_key_types",
                    "UNSUPPORTED_USER_LIST_UPLOAD_KEY_TYPES",
                    "upload_key_types must be exactly [CONTACT_ID]",
                )
            source = info.contact_id_info.data_source_type
            if source not in (0, dm.DataSourceType.DATA_SOURCE_TYPE_FIRST_PARTY):
                violations.add(
                    "user_list.ingested_user_list_info.contact_id_info.data_source_type",
                    "UNSUPPORTED_INGESTED_USER_LIST_INFO_CONFIG",
                    "only first-party contact data is modelled",
                )
        days = MAX_MEMBERSHIP_DAYS
        if user_list.HasField("membership_duration"):
            duration = user_list.membership_duration
            if duration.nanos or duration.seconds <= 0 or duration.seconds % 86_400:
                violations.add(
                    "user_list.membership_duration",
                    "INVALID_ARGUMENT",
                    "membership_duration must be a positive whole number of days",
                )
            elif duration.seconds // 86_400 > MAX_MEMBERSHIP_DAYS:
                violations.add(
                    "user_list.membership_duration",
                    "MEMBERSHIP_DURATION_TOO_LONG",
                    f"membership_duration exceeds {MAX_MEMBERSHIP_DAYS} days",
                )
            else:
                days = duration.seconds // 86_400
        violations.raise_if_any()
        account_id = account.group(1)
        with self.store.lock:
            if self.store.name_taken(account_id, display_name):
                violations.add(
                    "user_list.display_name",
                    "DISPLAY_NAME_ALREADY_USED",
                    f"a user list named {display_name!r} already exists",
                )
                violations.raise_if_any()
            if request.validate_only:
                return dm.UserList(display_name=display_name)
            record = self.store.create(
                account_id,
                display_name,
                user_list.description,
                user_list.integration_code,
                days,
            )
            return self._render(record)

    def _named_list(self, name: str) -> UserListRecord:
        """The list a request names (caller holds the lock)."""
        match = _LIST_NAME.fullmatch(name)
        if match is None:
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_RESOURCE_NAME",
                "malformed user list name",
            )
        record = self.store.find(match.group(1), int(match.group(2)))
        if record is None:
            raise error(grpc.StatusCode.NOT_FOUND, "NOT_FOUND", f"{name} not found")
        return record

    def _get_list(self, request: Message, call: Call) -> dm.UserList:
        with self.store.lock:
            return self._render(self._named_list(request.name))

    def _delete_list(self, request: Message, call: Call) -> empty_pb2.Empty:
        with self.store.lock:
            record = self._named_list(request.name)
            if not request.validate_only:
                self.store.remove(record)
        return empty_pb2.Empty()

    def _list_lists(self, request: Message, call: Call) -> dm.ListUserListsResponse:
        account = _ACCOUNT.fullmatch(request.parent)
        if account is None:
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_RESOURCE_NAME", "malformed parent"
            )
        if request.filter:
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_FILTER",
                "the sandbox does not model ListUserLists filters",
            )
        if request.page_token and not _DIGITS.fullmatch(request.page_token):
            raise error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN", "bad page_token")
        start = int(request.page_token or 0)
        size = request.page_size if request.page_size > 0 else LIST_PAGE_SIZE
        with self.store.lock:
            records = sorted(
                (r for r in self.store.lists.values() if r.account_id == account.group(1)),
                key=lambda r: r.list_id,
            )
            page = [self._render(r) for r in records[start : start + size]]
        more = start + size < len(records)
        return dm.ListUserListsResponse(
            user_lists=page, next_page_token=str(start + size) if more else ""
        )

    def _render(self, record: UserListRecord) -> dm.UserList:
        count = len(record.members)
        return dm.UserList(
            name=data_manager_list_name(record.account_id, record.list_id),
            id=record.list_id,
            read_only=False,
            display_name=record.display_name,
            description=record.description,
            integration_code=record.integration_code,
            membership_status=dm.UserList.MembershipStatus.OPEN,
            membership_duration=duration_pb2.Duration(seconds=record.membership_days * 86_400),
            access_reason=dm.UserList.AccessReason.OWNED,
            account_access_status=dm.UserList.AccessStatus.ENABLED,
            size_info=dm.SizeInfo(
                display_network_members_count=count,
                search_network_members_count=count,
                youtube_members_count=count,
                gmail_members_count=count,
            ),
            target_network_info=dm.TargetNetworkInfo(
                eligible_for_display=True, eligible_for_search=True
            ),
            ingested_user_list_info=dm.IngestedUserListInfo(
                upload_key_types=[_CONTACT_ID],
                contact_id_info=dm.ContactIdInfo(
                    data_source_type=dm.DataSourceType.DATA_SOURCE_TYPE_FIRST_PARTY,
                    match_rate_percentage=self.store.match_rate_percent if count else 0,
                ),
            ),
        )

    # IngestionService

    def _ingest(self, request: Message, call: Call) -> dm.IngestAudienceMembersResponse:
        violations = Violations()
        if (
            request.terms_of_service.customer_match_terms_of_service_status
            != dm.TermsOfServiceStatus.ACCEPTED
        ):
            violations.add(
                "terms_of_service.customer_match_terms_of_service_status",
                "TERMS_AND_CONDITIONS_NOT_SIGNED",
                "the Customer Match terms of service must be ACCEPTED",
            )
        members = self._members(request, violations, check_consent=True)
        with self.store.lock:
            targets = self._targets(request, members, violations)
            violations.raise_if_any()
            if not request.validate_only:
                received = self.store.clock()

                def ingest(target: _Target) -> dm.RequestStatusPerDestination:
                    chosen = _for_target(members, target)
                    record = self.store.lists.get(target.list_id)
                    applied = [m for m in chosen if not self._fails_in_processing(m)]
                    if record is not None:
                        for member in applied:
                            record.members[member.key] = received
                    status = self._ingest_status(request, target, applied)
                    return _with_failures(status, len(chosen) - len(applied), record is None)

                self._acknowledge(request, call, targets, ingest)
        return dm.IngestAudienceMembersResponse(request_id=call.request_id)

    def _fails_in_processing(self, member: _Member) -> bool:
        return member.key.split(":", 1)[1] in self.store.failing_in_processing

    def _acknowledge(
        self,
        request: Message,
        call: Call,
        targets: list[_Target],
        apply: Callable[[_Target], dm.RequestStatusPerDestination],
    ) -> None:
        """Process the request `processing_seconds` from now (caller holds the lock)."""
        request_id = call.request_id
        self._processing[request_id] = [
            dm.Destination.wrap(request.destinations[t.index]) for t in targets
        ]

        def process() -> None:
            del self._processing[request_id]
            self._statuses[request_id] = [apply(target) for target in targets]

        self.store.schedule(self.processing_seconds, process)

    def _remove(self, request: Message, call: Call) -> dm.RemoveAudienceMembersResponse:
        violations = Violations()
        members = self._members(request, violations, check_consent=False)
        with self.store.lock:
            targets = self._targets(request, members, violations)
            violations.raise_if_any()
            if not request.validate_only:

                def remove(target: _Target) -> dm.RequestStatusPerDestination:
                    chosen = _for_target(members, target)
                    record = self.store.lists.get(target.list_id)
                    if record is not None:
                        for member in chosen:
                            record.members.pop(member.key, None)
                    status = self._removal_status(request, target, chosen)
                    return _with_failures(status, 0, record is None)

                self._acknowledge(request, call, targets, remove)
        return dm.RemoveAudienceMembersResponse(request_id=call.request_id)

    def _remove_all(self, request: Message, call: Call) -> dm.RemoveAllAudienceMembersResponse:
        violations = Violations()
        with self.store.lock:
            now = self.store.clock()
            cutoff: float | None = None
            if request.HasField("remove_as_of_time"):
                stamp = request.remove_as_of_time
                cutoff = stamp.seconds + stamp.nanos / 1e9
                if cutoff > now:
                    violations.add(
                        "remove_as_of_time",
                        "INVALID_REMOVE_AS_OF_TIME",
                        "remove_as_of_time must not be in the future",
                    )
            targets = self._targets(request, [], violations)
            violations.raise_if_any()
            if not request.validate_only:

                def remove_all(target: _Target) -> dm.RequestStatusPerDestination:
                    record = self.store.lists.get(target.list_id)
                    if record is not None:
                        stale = [
                            k
                            for k, added in record.members.items()
                            if cutoff is None or added < cutoff
                        ]
                        for key in stale:
                            del record.members[key]
                    status = _S(
                        destination=dm.Destination.wrap(request.destinations[target.index]),
                        request_status=_S.RequestStatus.SUCCESS,
                        remove_all_audience_members_status=_S.RemoveAllAudienceMembersStatus(),
                    )
                    return _with_failures(status, 0, record is None)

                self._acknowledge(request, call, targets, remove_all)
        return dm.RemoveAllAudienceMembersResponse(request_id=call.request_id)

    def _status(self, request: Message, call: Call) -> dm.RetrieveRequestStatusResponse:
        with self.store.lock:
            statuses = self._statuses.get(request.request_id)
            processing = self._processing.get(request.request_id)
        if processing is not None:
            return dm.RetrieveRequestStatusResponse(
                request_status_per_destination=[
                    _S(destination=d, request_status=_S.RequestStatus.PROCESSING)
                    for d in processing
                ]
            )
        if statuses is None:
            raise error(
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST_ID",
                f"unknown request_id {request.request_id!r} (validate_only requests have none)",
                violations=[("request_id", "INVALID_REQUEST_ID", "unknown request_id")],
            )
        return dm.RetrieveRequestStatusResponse(request_status_per_destination=statuses)

    def _members(
        self, request: Message, violations: Violations, *, check_consent: bool
    ) -> list[_Member]:
        """Parse and validate members; raises at once on request-level limit violations."""
        audience = request.audience_members
        if len(audience) > MAX_AUDIENCE_MEMBERS:
            violations.add(
                "audience_members",
                "TOO_MANY_AUDIENCE_MEMBERS",
                f"at most {MAX_AUDIENCE_MEMBERS} audience members per request, got {len(audience)}",
            )
        elif not audience:
            violations.add("audience_members", "REQUIRED_FIELD_MISSING", "no audience members")
        if request.HasField("encryption_info"):
            raise RpcFailure(
                grpc.StatusCode.UNIMPLEMENTED, "the sandbox does not model encrypted uploads"
            )
        if request.encoding not in (dm.Encoding.HEX, dm.Encoding.BASE64):
            violations.add("encoding", "REQUIRED_FIELD_MISSING", "encoding must be HEX or BASE64")
        violations.raise_if_any()
        base64_encoded = request.encoding == dm.Encoding.BASE64
        consent = request.consent if check_consent else None  # removals carry no consent
        members: list[_Member] = []
        kinds: set[str] = set()
        for i, member in enumerate(audience):
            if violations.full:
                break
            kind = member.WhichOneof("data")
            kinds.add(str(kind))
            if kind == "user_data":
                user_data, ips, prefix = member.user_data, 0, f"audience_members[{i}].user_data"
            elif kind == "composite_data":
                composite = member.composite_data
                user_data, ips = composite.user_data, len(composite.ip_data)
                prefix = f"audience_members[{i}].composite_data.user_data"
            else:
                violations.add(
                    f"audience_members[{i}]",
                    "INVALID_AUDIENCE_MEMBER",
                    "only user_data and composite_data members are modelled",
                )
                continue
            if len(kinds) > 1:
                violations.add(
                    f"audience_members[{i}]",
                    "MULTIPLE_DATA_TYPES_NOT_ALLOWED",
                    "all members of a request must use the same data type",
                )
            if consent is not None:
                _check_consent(member, consent, i, violations)
            parsed = _parse_identifiers(user_data, prefix, base64_encoded, violations)
            if parsed is not None and _refused(user_data, self.store.refused):
                violations.add(
                    f"audience_members[{i}]", "INVALID_FORMAT", "member refused by the platform"
                )
                continue
            if parsed is not None:
                key, email, phone, address = parsed
                refs = tuple(member.destination_references)
                members.append(_Member(key, (email, phone, address, ips), refs))
        return members

    def _targets(
        self, request: Message, members: list[_Member], violations: Violations
    ) -> list[_Target]:
        """Validate destinations against the store (caller holds the lock)."""
        destinations = request.destinations
        if not destinations:
            violations.add("destinations", "REQUIRED_FIELD_MISSING", "no destinations")
        if len(destinations) > MAX_DESTINATIONS:
            violations.add(
                "destinations",
                "TOO_MANY_DESTINATIONS",
                f"at most {MAX_DESTINATIONS} destinations per request",
            )
            return []
        targets: list[_Target] = []
        references: set[str] = set()
        for i, destination in enumerate(destinations):
            prefix = f"destinations[{i}]"
            if destination.reference:
                if destination.reference in references:
                    violations.add(
                        f"{prefix}.reference",
                        "DUPLICATE_DESTINATION_REFERENCE",
                        "destination references must be unique",
                    )
                references.add(destination.reference)
            for role in ("operating_account", "login_account"):
                if role == "login_account" and not destination.HasField(role):
                    continue
                account = getattr(destination, role)
                if account.account_type != _GOOGLE_ADS:
                    violations.add(
                        f"{prefix}.{role}.account_type",
                        "INVALID_DESTINATION",
                        "the sandbox models GOOGLE_ADS accounts only",
                    )
                if not _DIGITS.fullmatch(account.account_id):
                    violations.add(
                        f"{prefix}.{role}.account_id",
                        "INVALID_DESTINATION",
                        "account_id must be digits only",
                    )
            if destination.HasField("linked_account"):
                violations.add(
                    f"{prefix}.linked_account",
                    "LINKED_ACCOUNT_ONLY_ALLOWED_WITH_DATA_PARTNER_LOGIN_ACCOUNT",
                    "linked_account is for data partners only",
                )
            account_id = destination.operating_account.account_id
            list_id = destination.product_destination_id
            record = (
                self.store.find(account_id, int(list_id)) if _DIGITS.fullmatch(list_id) else None
            )
            if record is None:
                violations.add(
                    f"{prefix}.product_destination_id",
                    "INVALID_USER_LIST_ID",
                    f"no user list {list_id!r} in account {account_id!r}",
                )
                continue
            targets.append(_Target(i, record.list_id, destination.reference))
        for i, member in enumerate(members):
            unknown = set(member.references) - references
            if unknown:
                violations.add(
                    f"audience_members[{i}].destination_references",
                    "INVALID_DESTINATION",
                    f"unknown destination references {sorted(unknown)}",
                )
        return targets

    def _ingest_status(
        self, request: Message, target: _Target, members: list[_Member]
    ) -> dm.RequestStatusPerDestination:
        records = len(members)
        match_range = (
            dm.MatchRateRange[f"MATCH_RATE_RANGE_{self.store.match_rate_suffix()}"]
            if records
            else dm.MatchRateRange.MATCH_RATE_RANGE_UNKNOWN
        )
        if request.audience_members[0].WhichOneof("data") == "composite_data":
            status = _S.IngestAudienceMembersStatus(
                composite_data_ingestion_status=_S.IngestCompositeDataStatus(
                    record_count=records,
                    data_type_counts=_type_counts(members),
                    upload_match_rate_range=match_range,
                )
            )
        else:
            status = _S.IngestAudienceMembersStatus(
                user_data_ingestion_status=_S.IngestUserDataStatus(
                    record_count=records,
                    user_identifier_count=sum(sum(m.counts[:3]) for m in members),
                    upload_match_rate_range=match_range,
                )
            )
        return _S(
            destination=dm.Destination.wrap(request.destinations[target.index]),
            request_status=_S.RequestStatus.SUCCESS,
            audience_members_ingestion_status=status,
        )

    def _removal_status(
        self, request: Message, target: _Target, members: list[_Member]
    ) -> dm.RequestStatusPerDestination:
        records = len(members)
        if request.audience_members[0].WhichOneof("data") == "composite_data":
            status = _S.RemoveAudienceMembersStatus(
                composite_data_removal_status=_S.RemoveCompositeDataStatus(
                    record_count=records, data_type_counts=_type_counts(members)
                )
            )
        else:
            status = _S.RemoveAudienceMembersStatus(
                user_data_removal_status=_S.RemoveUserDataStatus(
                    record_count=records,
                    user_identifier_count=sum(sum(m.counts[:3]) for m in members),
                )
            )
        return _S(
            destination=dm.Destination.wrap(request.destinations[target.index]),
            request_status=_S.RequestStatus.SUCCESS,
            audience_members_removal_status=status,
        )


def _with_failures(
    status: dm.RequestStatusPerDestination, failed: int, list_gone: bool
) -> dm.RequestStatusPerDestination:
    """The status once processed: records that failed make it PARTIAL_SUCCESS, or FAILED when
    none succeeded (or the list was deleted in the meantime)."""
    records = _record_count(status)
    if list_gone:
        status.request_status = _S.RequestStatus.FAILED
        failed = max(failed, records, 1)
    elif failed:
        status.request_status = (
            _S.RequestStatus.PARTIAL_SUCCESS if records else _S.RequestStatus.FAILED
        )
    if failed:
        status.error_info = dm.ErrorInfo(
            error_counts=[
                dm.ErrorCount(
                    record_count=failed,
                    reason=dm.ProcessingErrorReason.PROCESSING_ERROR_REASON_INVALID_FORMAT,
                )
            ]
        )
    return status


def _record_count(status: dm.RequestStatusPerDestination) -> int:
    ingestion = status.audience_members_ingestion_status
    if ingestion.user_data_ingestion_status:
        return ingestion.user_data_ingestion_status.record_count
    if ingestion.composite_data_ingestion_status:
        return ingestion.composite_data_ingestion_status.record_count
    return 0


def _for_target(members: list[_Member], target: _Target) -> list[_Member]:
    return [m for m in members if not m.references or target.reference in m.references]


def _type_counts(members: list[_Member]) -> list[_S.DataTypeCount]:
    totals = [sum(m.counts[k] for m in members) for k in range(4)]
    return [
        _S.DataTypeCount(type_=data_type, count=total)
        for data_type, total in zip(_DATA_TYPES, totals, strict=True)
        if total
    ]


def _check_consent(member: Message, consent: Message, i: int, violations: Violations) -> None:
    own = member.consent if member.HasField("consent") else None
    for name in ("ad_user_data", "ad_personalization"):
        value = getattr(own, name) if own is not None else 0
        field = f"audience_members[{i}].consent.{name}"
        if not value:
            value, field = getattr(consent, name), f"consent.{name}"
        if value == _DENIED:
            violations.add(
                field, "PROCESSING_ERROR_REASON_DENIED_CONSENT", f"{name} consent is DENIED"
            )
        elif value != _GRANTED:
            violations.add(
                field, "PROCESSING_ERROR_REASON_NO_CONSENT", f"{name} consent is not specified"
            )


def _refused(user_data: Message, refused: frozenset[str]) -> bool:
    return bool(refused) and any(
        getattr(identifier, identifier.WhichOneof("identifier") or "email_address", "") in refused
        for identifier in user_data.user_identifiers
    )


def _parse_identifiers(
    user_data: Message, prefix: str, base64_encoded: bool, violations: Violations
) -> tuple[str, int, int, int] | None:
    """(member key, #emails, #phones, #addresses), or None after recording violations."""
    identifiers = user_data.user_identifiers
    if not identifiers:
        violations.add(
            f"{prefix}.user_identifiers", "NO_IDENTIFIERS_PROVIDED", "no user identifiers"
        )
        return None
    if len(identifiers) > MAX_IDENTIFIERS_PER_MEMBER:
        violations.add(
            f"{prefix}.user_identifiers",
            "TOO_MANY_USER_IDENTIFIERS",
            f"at most {MAX_IDENTIFIERS_PER_MEMBER} identifiers per member",
        )
        return None
    keys: dict[str, str] = {}
    counts = {"email_address": 0, "phone_number": 0, "address": 0}
    ok = True
    for j, identifier in enumerate(identifiers):
        which = identifier.WhichOneof("identifier")
        path = f"{prefix}.user_identifiers[{j}]"
        if which is None:
            violations.add(path, "REQUIRED_FIELD_MISSING", "empty user identifier")
            ok = False
            continue
        counts[which] += 1
        if which == "address":
            key = _address_key(identifier.address, f"{path}.address", base64_encoded, violations)
        else:
            key, reason = sha256_key(getattr(identifier, which), base64_encoded)
            if reason is not None:
                violations.add(f"{path}.{which}", reason, f"{which} is not a SHA-256 digest")
        if key is None:
            ok = False
        else:
            keys.setdefault(which, key)
    if not ok:
        return None
    if "email_address" in keys:
        key = f"email:{keys['email_address']}"
    elif "phone_number" in keys:
        key = f"phone:{keys['phone_number']}"
    else:
        key = f"address:{keys['address']}"
    return key, counts["email_address"], counts["phone_number"], counts["address"]


def _address_key(
    address: Message, path: str, base64_encoded: bool, violations: Violations
) -> str | None:
    parts = []
    for name in ("given_name", "family_name"):
        digest, reason = sha256_key(getattr(address, name), base64_encoded)
        if reason is not None:
            violations.add(f"{path}.{name}", reason, f"{name} is not a SHA-256 digest")
            return None
        parts.append(digest)
    if not _REGION.fullmatch(address.region_code):
        violations.add(
            f"{path}.region_code",
            "INVALID_REGION_CODE",
            "region_code must be an unhashed ISO-3166-1 alpha-2 code such as 'US'",
        )
        return None
    if not address.postal_code or _DIGEST_LIKE.fullmatch(address.postal_code):
        violations.add(
            f"{path}.postal_code", "INVALID_POSTAL_CODE", "postal_code is required, unhashed"
        )
        return None
    return ":".join([*parts, address.region_code, address.postal_code])
