"""The Google gRPC sandbox driven by the real clients: google-ads-datamanager and google-ads v26.

Clients are built exactly as the sandbox module docstring prescribes (an injected plaintext
channel; for Google Ads the library's own Metadata/Exception interceptors), so these tests also
pin down how production code must construct them. Every call passes ``retry=None`` so a failure
is one server hit.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.ads import datamanager_v1 as dm
from google.ads.datamanager_v1.services.ingestion_service.transports import (
    IngestionServiceGrpcTransport,
)
from google.ads.datamanager_v1.services.user_list_service.transports import (
    UserListServiceGrpcTransport,
)
from google.ads.googleads.errors import GoogleAdsException
from google.ads.googleads.interceptors import ExceptionInterceptor, MetadataInterceptor
from google.ads.googleads.v26.common.types import offline_user_data
from google.ads.googleads.v26.errors.types.errors import GoogleAdsError, GoogleAdsFailure
from google.ads.googleads.v26.resources.types.offline_user_data_job import OfflineUserDataJob
from google.ads.googleads.v26.resources.types.user_list import UserList
from google.ads.googleads.v26.services.services import (
    google_ads_service,
    offline_user_data_job_service,
    user_list_service,
)
from google.ads.googleads.v26.services.types import offline_user_data_job_service as job_types
from google.ads.googleads.v26.services.types import user_list_service as list_types
from google.api_core import exceptions
from google.rpc import error_details_pb2

from cdp_devkit.sandbox.google.sandbox import GoogleSandbox

ACCOUNT = "1234567890"
OTHER_ACCOUNT = "5555555555"
MANAGER = "9876543210"
DEV_TOKEN = "sandbox-dev-token"
TIMEOUT = 5.0


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# Data Manager helpers


@dataclass
class DataManager:
    user_lists: dm.UserListServiceClient
    ingestion: dm.IngestionServiceClient


GRANTED = dm.Consent(ad_user_data="CONSENT_GRANTED", ad_personalization="CONSENT_GRANTED")
ACCEPTED = dm.TermsOfService(customer_match_terms_of_service_status="ACCEPTED")


def create_dm_list(client: DataManager, account: str = ACCOUNT, **fields) -> dm.UserList:
    defaults = {
        "display_name": unique("dm"),
        "ingested_user_list_info": dm.IngestedUserListInfo(upload_key_types=["CONTACT_ID"]),
    }
    user_list = dm.UserList(**{**defaults, **fields})
    return client.user_lists.create_user_list(
        parent=f"accountTypes/GOOGLE_ADS/accounts/{account}",
        user_list=user_list,
        retry=None,
        timeout=TIMEOUT,
    )


def destination(user_list: dm.UserList | int, account: str = ACCOUNT) -> dm.Destination:
    list_id = user_list if isinstance(user_list, int) else user_list.id
    return dm.Destination(
        operating_account=dm.ProductAccount(account_type="GOOGLE_ADS", account_id=account),
        login_account=dm.ProductAccount(account_type="GOOGLE_ADS", account_id=MANAGER),
        product_destination_id=str(list_id),
    )


def email_member(email: str, *extra: dm.UserIdentifier) -> dm.AudienceMember:
    identifiers = [dm.UserIdentifier(email_address=sha(email)), *extra]
    return dm.AudienceMember(user_data=dm.UserData(user_identifiers=identifiers))


def ingest_request(
    user_list: dm.UserList, members: list[dm.AudienceMember], **overrides
) -> dm.IngestAudienceMembersRequest:
    fields = {
        "destinations": [destination(user_list)],
        "audience_members": members,
        "consent": GRANTED,
        "terms_of_service": ACCEPTED,
        "encoding": dm.Encoding.HEX,
        **overrides,
    }
    return dm.IngestAudienceMembersRequest(**fields)


def ingest(client: DataManager, request: dm.IngestAudienceMembersRequest) -> str:
    response = client.ingestion.ingest_audience_members(
        request=request, retry=None, timeout=TIMEOUT
    )
    return response.request_id


def bad_request_fields(error: exceptions.GoogleAPICallError) -> list[str]:
    return [
        violation.field
        for detail in error.details
        if isinstance(detail, error_details_pb2.BadRequest)
        for violation in detail.field_violations
    ]


# Google Ads helpers


@dataclass
class Ads:
    channel: grpc.Channel
    user_lists: user_list_service.UserListServiceClient
    jobs: offline_user_data_job_service.OfflineUserDataJobServiceClient
    search: google_ads_service.GoogleAdsServiceClient


def ads_clients(
    address: str, developer_token: str | None = DEV_TOKEN, login_customer_id: str | None = MANAGER
) -> Ads:
    channel = grpc.intercept_channel(
        grpc.insecure_channel(address),
        MetadataInterceptor(developer_token, login_customer_id, None),
        ExceptionInterceptor("v26", use_proto_plus=True),
    )
    jobs = offline_user_data_job_service
    return Ads(
        channel,
        user_list_service.UserListServiceClient(
            transport=user_list_service.transports.UserListServiceGrpcTransport(channel=channel)
        ),
        jobs.OfflineUserDataJobServiceClient(
            transport=jobs.transports.OfflineUserDataJobServiceGrpcTransport(channel=channel)
        ),
        google_ads_service.GoogleAdsServiceClient(
            transport=google_ads_service.transports.GoogleAdsServiceGrpcTransport(channel=channel)
        ),
    )


def create_ads_list(ads: Ads, life_span: int = 30) -> str:
    operation = list_types.UserListOperation(
        create=UserList(
            name=unique("ads"),
            membership_life_span=life_span,
            crm_based_user_list={"upload_key_type": "CONTACT_INFO"},
        )
    )
    response = ads.user_lists.mutate_user_lists(
        customer_id=ACCOUNT, operations=[operation], retry=None, timeout=TIMEOUT
    )
    return response.results[0].resource_name


def create_job(ads: Ads, user_list: str, consent: dict[str, str] | None = None) -> str:
    metadata = offline_user_data.CustomerMatchUserListMetadata(
        user_list=user_list,
        consent=consent or {"ad_user_data": "GRANTED", "ad_personalization": "GRANTED"},
    )
    job = OfflineUserDataJob(
        type_="CUSTOMER_MATCH_USER_LIST", customer_match_user_list_metadata=metadata
    )
    response = ads.jobs.create_offline_user_data_job(
        customer_id=ACCOUNT, job=job, retry=None, timeout=TIMEOUT
    )
    return response.resource_name


def create_op(*hashed_emails: str) -> job_types.OfflineUserDataJobOperation:
    identifiers = [offline_user_data.UserIdentifier(hashed_email=h) for h in hashed_emails]
    return job_types.OfflineUserDataJobOperation(
        create=offline_user_data.UserData(user_identifiers=identifiers)
    )


def add_operations(
    ads: Ads, job: str, operations: list, *, partial_failure: bool = True
) -> job_types.AddOfflineUserDataJobOperationsResponse:
    request = job_types.AddOfflineUserDataJobOperationsRequest(
        resource_name=job, operations=operations, enable_partial_failure=partial_failure
    )
    return ads.jobs.add_offline_user_data_job_operations(
        request=request, retry=None, timeout=TIMEOUT
    )


def search(ads: Ads, query: str) -> list:
    return list(ads.search.search(customer_id=ACCOUNT, query=query, retry=None, timeout=TIMEOUT))


def job_row(ads: Ads, job: str):
    (row,) = search(
        ads,
        "SELECT offline_user_data_job.resource_name, offline_user_data_job.status, "
        "offline_user_data_job.failure_reason, "
        "offline_user_data_job.operation_metadata.match_rate_range "
        f"FROM offline_user_data_job WHERE offline_user_data_job.resource_name = '{job}'",
    )
    return row.offline_user_data_job


def error_code(error: GoogleAdsError) -> tuple[str, str]:
    """(ErrorCode oneof member, enum name), e.g. ("request_error", "RESOURCE_NOT_FOUND")."""
    code = error.error_code
    member = type(code).pb(code).WhichOneof("error_code")
    return member, getattr(code, member).name


# fixtures


@pytest.fixture(scope="module")
def sandbox() -> Iterator[GoogleSandbox]:
    """Data Manager requests processed by the next call, Google Ads jobs running for half a
    second (the asynchronous processing and a job's time have their own tests)."""
    with GoogleSandbox(processing_seconds=0, job_seconds=0.5) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh_log(sandbox: GoogleSandbox) -> None:
    sandbox.clear_requests()
    sandbox.clear_faults()


@pytest.fixture(scope="module")
def datamanager(sandbox: GoogleSandbox) -> Iterator[DataManager]:
    channel = grpc.insecure_channel(sandbox.address)
    yield DataManager(
        dm.UserListServiceClient(transport=UserListServiceGrpcTransport(channel=channel)),
        dm.IngestionServiceClient(transport=IngestionServiceGrpcTransport(channel=channel)),
    )
    channel.close()


@pytest.fixture(scope="module")
def ads(sandbox: GoogleSandbox) -> Iterator[Ads]:
    clients = ads_clients(sandbox.address)
    yield clients
    clients.channel.close()


# Data Manager


def test_dm_create_ingest_status_and_size(sandbox: GoogleSandbox, datamanager: DataManager):
    created = create_dm_list(datamanager, membership_duration=timedelta(days=30))
    assert created.name == f"accountTypes/GOOGLE_ADS/accounts/{ACCOUNT}/userLists/{created.id}"
    assert created.membership_duration == timedelta(days=30)

    members = [
        email_member("ana@example.com", dm.UserIdentifier(phone_number=sha("+5511999990000"))),
        email_member("bo@example.com"),
        dm.AudienceMember(
            user_data=dm.UserData(
                user_identifiers=[
                    dm.UserIdentifier(
                        address=dm.AddressInfo(
                            given_name=sha("cy"),
                            family_name=sha("dee"),
                            region_code="BR",
                            postal_code="01310-100",
                        )
                    )
                ]
            )
        ),
    ]
    ingest(datamanager, ingest_request(created, members, validate_only=True))
    assert sandbox.members(created.id) == set()

    request_id = ingest(datamanager, ingest_request(created, members))
    assert sandbox.members(created.name) == {
        f"email:{sha('ana@example.com')}",
        f"email:{sha('bo@example.com')}",
        f"address:{sha('cy')}:{sha('dee')}:BR:01310-100",
    }

    status = datamanager.ingestion.retrieve_request_status(
        request={"request_id": request_id}, retry=None, timeout=TIMEOUT
    )
    (per_destination,) = status.request_status_per_destination
    assert per_destination.request_status == dm.RequestStatusPerDestination.RequestStatus.SUCCESS
    assert per_destination.destination.product_destination_id == str(created.id)
    user_data = per_destination.audience_members_ingestion_status.user_data_ingestion_status
    assert (user_data.record_count, user_data.user_identifier_count) == (3, 4)
    assert user_data.upload_match_rate_range == dm.MatchRateRange.MATCH_RATE_RANGE_71_TO_80

    login = ("login-account", f"accountTypes/GOOGLE_ADS/accounts/{MANAGER}")
    fetched = datamanager.user_lists.get_user_list(
        name=created.name, retry=None, timeout=TIMEOUT, metadata=[login]
    )
    assert sandbox.requests("GetUserList")[0].metadata["login-account"] == login[1]
    assert fetched.size_info.search_network_members_count == 3
    assert fetched.size_info.display_network_members_count == 3
    assert fetched.ingested_user_list_info.contact_id_info.match_rate_percentage == 72
    listed = datamanager.user_lists.list_user_lists(
        parent=f"accountTypes/GOOGLE_ADS/accounts/{ACCOUNT}", retry=None, timeout=TIMEOUT
    )
    assert created.name in {user_list.name for user_list in listed}

    validated, recorded = sandbox.requests("IngestAudienceMembers")
    assert validated.request["validate_only"] is True
    assert recorded.request["consent"] == {
        "ad_user_data": "CONSENT_GRANTED",
        "ad_personalization": "CONSENT_GRANTED",
    }
    assert recorded.request["terms_of_service"] == {
        "customer_match_terms_of_service_status": "ACCEPTED"
    }
    assert recorded.code == grpc.StatusCode.OK


def test_dm_validate_only_request_has_no_status(datamanager: DataManager):
    created = create_dm_list(datamanager)
    request_id = ingest(
        datamanager, ingest_request(created, [email_member("x@y.z")], validate_only=True)
    )
    with pytest.raises(exceptions.InvalidArgument) as raised:
        datamanager.ingestion.retrieve_request_status(
            request={"request_id": request_id}, retry=None, timeout=TIMEOUT
        )
    assert raised.value.reason == "INVALID_REQUEST_ID"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"membership_duration": timedelta(days=541)}, "MEMBERSHIP_DURATION_TOO_LONG"),
        ({"membership_duration": timedelta(hours=36)}, "INVALID_ARGUMENT"),
        (
            {"ingested_user_list_info": {"upload_key_types": ["MOBILE_ID"]}},
            "UNSUPPORTED_USER_LIST_UPLOAD_KEY_TYPES",
        ),
        ({"display_name": ""}, "REQUIRED_FIELD_MISSING"),
    ],
)
def test_dm_create_list_rejects(datamanager: DataManager, fields: dict, reason: str):
    with pytest.raises(exceptions.InvalidArgument) as raised:
        create_dm_list(datamanager, **fields)
    assert raised.value.reason == reason


def test_dm_display_names_are_unique_per_account(datamanager: DataManager):
    first = create_dm_list(datamanager)
    with pytest.raises(exceptions.InvalidArgument) as raised:
        create_dm_list(datamanager, display_name=first.display_name)
    assert raised.value.reason == "DISPLAY_NAME_ALREADY_USED"
    assert create_dm_list(datamanager, OTHER_ACCOUNT, display_name=first.display_name).id


def test_dm_remove_members(sandbox: GoogleSandbox, datamanager: DataManager):
    created = create_dm_list(datamanager)
    emails = ["a@example.com", "b@example.com", "c@example.com"]
    ingest(datamanager, ingest_request(created, [email_member(e) for e in emails]))

    response = datamanager.ingestion.remove_audience_members(
        request=dm.RemoveAudienceMembersRequest(
            destinations=[destination(created)],
            audience_members=[email_member("b@example.com")],
            encoding=dm.Encoding.HEX,
        ),
        retry=None,
        timeout=TIMEOUT,
    )
    assert sandbox.members(created.id) == {f"email:{sha(e)}" for e in emails if e[0] != "b"}
    status = datamanager.ingestion.retrieve_request_status(
        request={"request_id": response.request_id}, retry=None, timeout=TIMEOUT
    )
    removal = status.request_status_per_destination[0].audience_members_removal_status
    assert removal.user_data_removal_status.record_count == 1


def test_dm_a_deleted_list_is_not_found(sandbox: GoogleSandbox, datamanager: DataManager):
    created = create_dm_list(datamanager)
    ingest(datamanager, ingest_request(created, [email_member("gone@example.com")]))
    datamanager.user_lists.delete_user_list(name=created.name, retry=None, timeout=TIMEOUT)
    assert created.id not in [lst.list_id for lst in sandbox.user_lists()]
    listed = datamanager.user_lists.list_user_lists(
        parent=f"accountTypes/GOOGLE_ADS/accounts/{ACCOUNT}", retry=None, timeout=TIMEOUT
    )
    assert created.id not in [lst.id for lst in listed]
    for call in (
        lambda: datamanager.user_lists.get_user_list(name=created.name, retry=None),
        lambda: datamanager.user_lists.delete_user_list(name=created.name, retry=None),
    ):
        with pytest.raises(exceptions.NotFound):
            call()
    with pytest.raises(exceptions.InvalidArgument) as raised:
        ingest(datamanager, ingest_request(created, [email_member("late@example.com")]))
    assert raised.value.reason == "INVALID_USER_LIST_ID"
    assert bad_request_fields(raised.value) == ["destinations[0].product_destination_id"]
    # Its display name is free again.
    assert create_dm_list(datamanager, display_name=created.display_name).id != created.id


def test_dm_remove_all_as_of_time_keeps_members_added_after_it(
    sandbox: GoogleSandbox, datamanager: DataManager
):
    created = create_dm_list(datamanager)
    old = [email_member("old1@example.com"), email_member("kept@example.com")]
    ingest(datamanager, ingest_request(created, old))
    cutoff = datetime.now(UTC)
    ingest(datamanager, ingest_request(created, [email_member("kept@example.com")]))

    def remove_all(as_of: datetime | None) -> None:
        request = dm.RemoveAllAudienceMembersRequest(destinations=[destination(created)])
        if as_of is not None:
            request.remove_as_of_time = as_of
        datamanager.ingestion.remove_all_audience_members(
            request=request, retry=None, timeout=TIMEOUT
        )

    with pytest.raises(exceptions.InvalidArgument) as raised:
        remove_all(datetime.now(UTC) + timedelta(minutes=5))
    assert raised.value.reason == "INVALID_REMOVE_AS_OF_TIME"
    assert len(sandbox.members(created.id)) == 2

    remove_all(cutoff)
    assert sandbox.members(created.id) == {f"email:{sha('kept@example.com')}"}
    remove_all(None)
    assert sandbox.members(created.id) == set()


def test_dm_login_account_header_must_name_an_account(datamanager: DataManager):
    created = create_dm_list(datamanager)
    with pytest.raises(exceptions.InvalidArgument) as raised:
        datamanager.user_lists.get_user_list(
            name=created.name, retry=None, timeout=TIMEOUT, metadata=[("login-account", MANAGER)]
        )
    assert raised.value.reason == "INVALID_RESOURCE_NAME"


def test_dm_concurrent_ingests_all_land(sandbox: GoogleSandbox, datamanager: DataManager):
    created = create_dm_list(datamanager)
    batches = [[email_member(f"t{t}-{i}@example.com") for i in range(200)] for t in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        request_ids = list(
            pool.map(lambda batch: ingest(datamanager, ingest_request(created, batch)), batches)
        )
    assert len(set(request_ids)) == 16
    assert len(sandbox.members(created.id)) == 16 * 200


def test_dm_member_limit_and_speed(sandbox: GoogleSandbox, datamanager: DataManager):
    created = create_dm_list(datamanager)
    members = [email_member(f"user{i}@example.com") for i in range(10_001)]

    with pytest.raises(exceptions.InvalidArgument) as raised:
        ingest(datamanager, ingest_request(created, members))
    assert raised.value.reason == "TOO_MANY_AUDIENCE_MEMBERS"
    assert bad_request_fields(raised.value) == ["audience_members"]
    assert sandbox.members(created.id) == set()

    ingest(datamanager, ingest_request(created, members[:10_000]))
    assert len(sandbox.members(created.id)) == 10_000
    accepted = sandbox.requests("IngestAudienceMembers")[-1]
    assert accepted.code == grpc.StatusCode.OK


def test_dm_identifier_limit(datamanager: DataManager):
    created = create_dm_list(datamanager)
    extra = [dm.UserIdentifier(phone_number=sha(f"+1555000{i:04d}")) for i in range(10)]
    with pytest.raises(exceptions.InvalidArgument) as raised:
        ingest(datamanager, ingest_request(created, [email_member("many@example.com", *extra)]))
    assert raised.value.reason == "TOO_MANY_USER_IDENTIFIERS"
    assert bad_request_fields(raised.value) == ["audience_members[0].user_data.user_identifiers"]


@pytest.mark.parametrize(
    ("identifier", "encoding", "reason", "field"),
    [
        (
            dm.UserIdentifier(email_address="not-a-hash"),
            "HEX",
            "INVALID_HEX_ENCODING",
            "email_address",
        ),
        (dm.UserIdentifier(phone_number="ab" * 16), "HEX", "INVALID_SHA256_FORMAT", "phone_number"),
        (
            dm.UserIdentifier(email_address=sha("x")),
            "BASE64",
            "INVALID_SHA256_FORMAT",
            "email_address",
        ),
        (
            dm.UserIdentifier(email_address="%%%="),
            "BASE64",
            "INVALID_BASE64_ENCODING",
            "email_address",
        ),
        (
            dm.UserIdentifier(
                address=dm.AddressInfo(
                    given_name="Ana", family_name=sha("lee"), region_code="US", postal_code="1"
                )
            ),
            "HEX",
            "INVALID_HEX_ENCODING",
            "address.given_name",
        ),
        (
            dm.UserIdentifier(
                address=dm.AddressInfo(
                    given_name=sha("ana"), family_name=sha("lee"), region_code="us", postal_code="1"
                )
            ),
            "HEX",
            "INVALID_REGION_CODE",
            "address.region_code",
        ),
    ],
)
def test_dm_bad_identifiers_fail_the_whole_request(
    sandbox: GoogleSandbox,
    datamanager: DataManager,
    identifier: dm.UserIdentifier,
    encoding: str,
    reason: str,
    field: str,
):
    created = create_dm_list(datamanager)
    digest = hashlib.sha256(b"good@example.com").digest()
    encoded = base64.b64encode(digest).decode() if encoding == "BASE64" else digest.hex()
    good = dm.AudienceMember(
        user_data=dm.UserData(user_identifiers=[dm.UserIdentifier(email_address=encoded)])
    )
    bad = dm.AudienceMember(user_data=dm.UserData(user_identifiers=[identifier]))
    with pytest.raises(exceptions.InvalidArgument) as raised:
        ingest(datamanager, ingest_request(created, [good, bad], encoding=encoding))
    assert raised.value.reason == reason
    assert raised.value.domain == "datamanager.googleapis.com"
    assert bad_request_fields(raised.value) == [
        f"audience_members[1].user_data.user_identifiers[0].{field}"
    ]
    assert sandbox.members(created.id) == set()


def test_dm_base64_and_hex_name_the_same_member(sandbox: GoogleSandbox, datamanager: DataManager):
    created = create_dm_list(datamanager)
    digest = hashlib.sha256(b"b64@example.com").digest()
    member = dm.AudienceMember(
        user_data=dm.UserData(
            user_identifiers=[dm.UserIdentifier(email_address=base64.b64encode(digest).decode())]
        )
    )
    ingest(datamanager, ingest_request(created, [member], encoding="BASE64"))
    assert sandbox.members(created.id) == {f"email:{digest.hex()}"}

    datamanager.ingestion.remove_audience_members(
        request=dm.RemoveAudienceMembersRequest(
            destinations=[destination(created)],
            audience_members=[email_member("b64@example.com")],
            encoding=dm.Encoding.HEX,
        ),
        retry=None,
        timeout=TIMEOUT,
    )
    assert sandbox.members(created.id) == set()


@pytest.mark.parametrize(
    ("overrides", "reason", "field"),
    [
        (
            {"terms_of_service": None},
            "TERMS_AND_CONDITIONS_NOT_SIGNED",
            "terms_of_service.customer_match_terms_of_service_status",
        ),
        ({"consent": None}, "PROCESSING_ERROR_REASON_NO_CONSENT", "consent.ad_user_data"),
        (
            {"consent": dm.Consent(ad_user_data="CONSENT_GRANTED")},
            "PROCESSING_ERROR_REASON_NO_CONSENT",
            "consent.ad_personalization",
        ),
        (
            {
                "consent": dm.Consent(
                    ad_user_data="CONSENT_GRANTED", ad_personalization="CONSENT_DENIED"
                )
            },
            "PROCESSING_ERROR_REASON_DENIED_CONSENT",
            "consent.ad_personalization",
        ),
    ],
)
def test_dm_ingest_needs_terms_and_consent(
    sandbox: GoogleSandbox, datamanager: DataManager, overrides: dict, reason: str, field: str
):
    created = create_dm_list(datamanager)
    request = ingest_request(created, [email_member("c@example.com")], **overrides)
    with pytest.raises(exceptions.InvalidArgument) as raised:
        ingest(datamanager, request)
    assert raised.value.reason == reason
    assert field in bad_request_fields(raised.value)
    assert sandbox.members(created.id) == set()


def test_dm_member_consent_overrides_request_consent(
    sandbox: GoogleSandbox, datamanager: DataManager
):
    created = create_dm_list(datamanager)
    member = email_member("own@example.com")
    member.consent = GRANTED
    ingest(datamanager, ingest_request(created, [member], consent=None))
    assert sandbox.members(created.id) == {f"email:{sha('own@example.com')}"}


def test_dm_destination_must_be_a_list_of_the_operating_account(datamanager: DataManager):
    foreign = create_dm_list(datamanager, OTHER_ACCOUNT)
    request = ingest_request(foreign, [email_member("d@example.com")])  # operating = ACCOUNT
    with pytest.raises(exceptions.InvalidArgument) as raised:
        ingest(datamanager, request)
    assert raised.value.reason == "INVALID_USER_LIST_ID"
    assert bad_request_fields(raised.value) == ["destinations[0].product_destination_id"]


@pytest.mark.parametrize(
    ("fault", "error", "reason", "quota_limit"),
    [
        (
            "quota",
            exceptions.ResourceExhausted,
            "RATE_LIMIT_EXCEEDED",
            "IngestionMutateRequestsPerMinutePerProject",
        ),
        (
            "daily_quota",
            exceptions.ResourceExhausted,
            "RATE_LIMIT_EXCEEDED",
            "IngestionMutateRequestsPerDayPerProject",
        ),
        ("unavailable", exceptions.ServiceUnavailable, None, None),
        ("internal", exceptions.InternalServerError, "INTERNAL_ERROR", None),
        ("not_allowlisted", exceptions.PermissionDenied, "NOT_ALLOWLISTED", None),
    ],
)
def test_dm_injected_faults(
    sandbox: GoogleSandbox,
    datamanager: DataManager,
    fault: str,
    error: type[Exception],
    reason: str | None,
    quota_limit: str | None,
):
    created = create_dm_list(datamanager)
    request = ingest_request(created, [email_member("f@example.com")])
    sandbox.inject("IngestAudienceMembers", fault)
    with pytest.raises(error) as raised:
        ingest(datamanager, request)
    assert raised.value.reason == reason
    if quota_limit is not None:
        assert raised.value.metadata["quota_limit"] == quota_limit
    assert sandbox.members(created.id) == set()

    ingest(datamanager, request)
    assert len(sandbox.members(created.id)) == 1
    codes = [c.code for c in sandbox.requests("IngestAudienceMembers")]
    assert codes == [raised.value.grpc_status_code, grpc.StatusCode.OK]


@pytest.mark.timeout(30)
def test_dm_a_call_never_answered_waits_for_the_clients_deadline(
    sandbox: GoogleSandbox, datamanager: DataManager
):
    created = create_dm_list(datamanager)
    request = ingest_request(created, [email_member("late@example.com")])
    sandbox.inject("IngestAudienceMembers", "never_answer")
    started = time.monotonic()
    with pytest.raises(exceptions.DeadlineExceeded):
        datamanager.ingestion.ingest_audience_members(request=request, retry=None, timeout=1)
    assert 1 <= time.monotonic() - started < 5
    assert sandbox.members(created.id) == set()
    time.sleep(0.2)  # the sandbox records the call once it noticed the client gave up
    codes = [c.code for c in sandbox.requests("IngestAudienceMembers")]
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED]


# Google Ads


def test_ads_customer_match_flow(sandbox: GoogleSandbox, ads: Ads):
    user_list = create_ads_list(ads)
    job = create_job(ads, user_list)
    assert job_row(ads, job).status.name == "PENDING"

    good = [sha("a@example.com"), sha("b@example.com"), sha("c@example.com")]
    response = add_operations(
        ads, job, [create_op(good[0]), create_op("not-a-sha256"), create_op(good[1], good[2])]
    )
    status = response.partial_failure_error
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    failure = GoogleAdsFailure.deserialize(status.details[0].value)
    (error,) = failure.errors
    assert error_code(error) == ("offline_user_data_job_error", "INVALID_SHA256_FORMAT")
    assert error.location.field_path_elements[0].field_name == "operations"
    assert error.location.field_path_elements[0].index == 1
    assert sandbox.members(user_list) == set()  # staged, not applied before the run

    operation = ads.jobs.run_offline_user_data_job(resource_name=job, retry=None, timeout=TIMEOUT)
    assert sandbox.members(user_list) == set()  # applied when the job succeeds
    assert job_row(ads, job).status.name == "RUNNING"
    sandbox.process_pending()  # the job's time passes
    assert operation.done(retry=None)
    assert sandbox.members(user_list) == {f"email:{good[0]}", f"email:{good[1]}"}
    operation.result(timeout=TIMEOUT)
    assert operation.metadata.match_rate_range.name == "MATCH_RANGE_71_TO_80"
    finished = job_row(ads, job)
    assert finished.status.name == "SUCCESS"
    assert finished.operation_metadata.match_rate_range.name == "MATCH_RANGE_71_TO_80"

    (row,) = search(
        ads,
        "SELECT user_list.size_for_search, user_list.size_for_display, "
        "user_list.match_rate_percentage FROM user_list "
        f"WHERE user_list.resource_name = '{user_list}'",
    )
    assert (row.user_list.size_for_search, row.user_list.size_for_display) == (2, 2)
    assert row.user_list.match_rate_percentage == 72
    assert row.user_list.name == ""  # not selected

    (created,) = sandbox.requests("CreateOfflineUserDataJob")
    metadata = created.request["job"]["customer_match_user_list_metadata"]
    assert metadata["consent"] == {"ad_user_data": "GRANTED", "ad_personalization": "GRANTED"}
    assert created.metadata["developer-token"] == DEV_TOKEN
    assert created.metadata["login-customer-id"] == MANAGER
    assert {c.method for c in sandbox.requests()} >= {"GetOperation", "Search"}


def test_ads_search_stream_and_lists_shared_with_data_manager(ads: Ads, datamanager: DataManager):
    created = create_dm_list(datamanager)
    ingest(datamanager, ingest_request(created, [email_member("shared@example.com")]))
    query = (
        "SELECT user_list.id, user_list.name, user_list.size_for_search FROM user_list "
        f"WHERE user_list.id = {created.id} AND user_list.type = CRM_BASED LIMIT 5"
    )
    batches = list(ads.search.search_stream(customer_id=ACCOUNT, query=query, retry=None))
    (row,) = [row for batch in batches for row in batch.results]
    assert row.user_list.resource_name == f"customers/{ACCOUNT}/userLists/{created.id}"
    assert (row.user_list.name, row.user_list.size_for_search) == (created.display_name, 1)


def test_ads_without_partial_failure_one_bad_hash_fails_everything(
    sandbox: GoogleSandbox, ads: Ads
):
    user_list = create_ads_list(ads)
    job = create_job(ads, user_list)
    operations = [create_op(sha("ok@example.com")), create_op("zz" * 32)]
    with pytest.raises(GoogleAdsException) as raised:
        add_operations(ads, job, operations, partial_failure=False)
    assert raised.value.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    (error,) = raised.value.failure.errors
    assert error_code(error) == ("offline_user_data_job_error", "INVALID_SHA256_FORMAT")
    assert error.location.field_path_elements[0].index == 1
    assert raised.value.request_id

    ads.jobs.run_offline_user_data_job(resource_name=job, retry=None, timeout=TIMEOUT)
    assert sandbox.members(user_list) == set()
    with pytest.raises(GoogleAdsException) as raised:
        add_operations(ads, job, [create_op(sha("late@example.com"))])
    assert error_code(raised.value.failure.errors[0]) == (
        "offline_user_data_job_error",
        "JOB_ALREADY_STARTED",
    )


def test_ads_identifier_limits(ads: Ads):
    job = create_job(ads, create_ads_list(ads))
    too_wide = create_op(*[sha(f"{i}@example.com") for i in range(21)])
    response = add_operations(ads, job, [create_op(sha("fine@example.com")), too_wide])
    failure = GoogleAdsFailure.deserialize(response.partial_failure_error.details[0].value)
    (error,) = failure.errors
    assert error_code(error) == ("offline_user_data_job_error", "TOO_MANY_USER_IDENTIFIERS")
    assert error.location.field_path_elements[0].index == 1

    # Built on the raw protobuf: 100,001 proto-plus identifiers would dominate the test's time.
    request = job_types.AddOfflineUserDataJobOperationsRequest.pb()(
        resource_name=job, enable_partial_failure=True
    )
    digest = sha("same@example.com")
    for _ in range(5_001):
        identifiers = request.operations.add().create.user_identifiers
        for _ in range(20):
            identifiers.add(hashed_email=digest)
    with pytest.raises(GoogleAdsException) as raised:
        ads.jobs.add_offline_user_data_job_operations(
            request=job_types.AddOfflineUserDataJobOperationsRequest.wrap(request),
            retry=None,
            timeout=TIMEOUT,
        )
    assert error_code(raised.value.failure.errors[0]) == (
        "offline_user_data_job_error",
        "TOO_MANY_USER_IDENTIFIERS",
    )


def test_ads_replace_with_remove_all_and_operation_rules(sandbox: GoogleSandbox, ads: Ads):
    user_list = create_ads_list(ads)
    first = create_job(ads, user_list)
    add_operations(ads, first, [create_op(sha("old@example.com")), create_op(sha("x@y.z"))])
    first_run = ads.jobs.run_offline_user_data_job(resource_name=first, retry=None, timeout=TIMEOUT)
    first_run.result(timeout=TIMEOUT)  # no second job runs on the list before it ends

    replace = create_job(ads, user_list)
    remove_all = job_types.OfflineUserDataJobOperation(remove_all=True)
    remove = job_types.OfflineUserDataJobOperation(
        remove=offline_user_data.UserData(
            user_identifiers=[offline_user_data.UserIdentifier(hashed_email=sha("x@y.z"))]
        )
    )
    response = add_operations(
        ads, replace, [remove_all, create_op(sha("new@example.com")), remove, remove_all]
    )
    failure = GoogleAdsFailure.deserialize(response.partial_failure_error.details[0].value)
    assert [
        (error_code(e)[1], e.location.field_path_elements[0].index) for e in failure.errors
    ] == [
        ("CONFLICTING_OPERATION", 2),
        ("INVALID_OPERATION_ORDER", 3),
    ]
    replacing = ads.jobs.run_offline_user_data_job(
        resource_name=replace, retry=None, timeout=TIMEOUT
    )
    replacing.result(timeout=TIMEOUT)
    assert sandbox.members(user_list) == {f"email:{sha('new@example.com')}"}


def test_ads_job_needs_an_existing_list_and_no_denied_consent(ads: Ads):
    with pytest.raises(GoogleAdsException) as raised:
        create_job(ads, f"customers/{ACCOUNT}/userLists/1")
    assert error_code(raised.value.failure.errors[0]) == (
        "offline_user_data_job_error",
        "INVALID_USER_LIST_ID",
    )
    with pytest.raises(GoogleAdsException) as raised:
        create_job(
            ads, create_ads_list(ads), {"ad_user_data": "GRANTED", "ad_personalization": "DENIED"}
        )
    assert error_code(raised.value.failure.errors[0]) == (
        "offline_user_data_job_error",
        "CUSTOMER_NOT_ACCEPTED_CUSTOMER_DATA_TERMS",
    )


def test_ads_a_removed_list_takes_no_more_jobs(sandbox: GoogleSandbox, ads: Ads):
    user_list = create_ads_list(ads)
    started = create_job(ads, user_list)
    add_operations(ads, started, [create_op(sha("early@example.com"))])
    remove = list_types.UserListOperation(remove=user_list)
    response = ads.user_lists.mutate_user_lists(
        customer_id=ACCOUNT, operations=[remove], retry=None, timeout=TIMEOUT
    )
    assert response.results[0].resource_name == user_list
    assert (
        search(
            ads, f"SELECT user_list.id FROM user_list WHERE user_list.resource_name = '{user_list}'"
        )
        == []
    )
    for call in (
        lambda: create_job(ads, user_list),
        lambda: ads.jobs.run_offline_user_data_job(resource_name=started, retry=None),
    ):
        with pytest.raises(GoogleAdsException) as raised:
            call()
        assert error_code(raised.value.failure.errors[0]) == (
            "offline_user_data_job_error",
            "INVALID_USER_LIST_ID",
        )
    with pytest.raises(GoogleAdsException) as raised:
        ads.user_lists.mutate_user_lists(
            customer_id=ACCOUNT, operations=[remove], retry=None, timeout=TIMEOUT
        )
    assert error_code(raised.value.failure.errors[0]) == ("mutate_error", "RESOURCE_NOT_FOUND")
    with pytest.raises(KeyError):
        sandbox.members(user_list)


def test_ads_user_list_rules(ads: Ads):
    with pytest.raises(GoogleAdsException) as raised:
        create_ads_list(ads, life_span=541)
    assert error_code(raised.value.failure.errors[0]) == ("range_error", "TOO_HIGH")


def test_ads_missing_developer_token(sandbox: GoogleSandbox):
    anonymous = ads_clients(sandbox.address, developer_token=None)
    try:
        with pytest.raises(GoogleAdsException) as raised:
            search(anonymous, "SELECT user_list.id FROM user_list")
    finally:
        anonymous.channel.close()
    assert error_code(raised.value.failure.errors[0]) == (
        "request_error",
        "DEVELOPER_TOKEN_PARAMETER_MISSING",
    )
    (call,) = sandbox.requests("Search")
    assert "developer-token" not in call.metadata
    assert call.code == grpc.StatusCode.INVALID_ARGUMENT


def test_ads_login_customer_id_must_be_ten_digits(sandbox: GoogleSandbox):
    dashed = ads_clients(sandbox.address, login_customer_id="987-654-3210")
    try:
        with pytest.raises(GoogleAdsException) as raised:
            search(dashed, "SELECT user_list.id FROM user_list")
    finally:
        dashed.channel.close()
    assert error_code(raised.value.failure.errors[0]) == (
        "header_error",
        "INVALID_LOGIN_CUSTOMER_ID",
    )


def test_ads_not_allowlisted_fault_is_a_google_ads_exception(sandbox: GoogleSandbox, ads: Ads):
    job = create_job(ads, create_ads_list(ads))
    sandbox.inject("AddOfflineUserDataJobOperations", "not_allowlisted")
    with pytest.raises(GoogleAdsException) as raised:
        add_operations(ads, job, [create_op(sha("n@example.com"))])
    assert raised.value.error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_code(raised.value.failure.errors[0]) == (
        "not_allowlisted_error",
        "CUSTOMER_NOT_ALLOWLISTED_FOR_THIS_FEATURE",
    )
    assert (
        add_operations(ads, job, [create_op(sha("n@example.com"))]).partial_failure_error.code == 0
    )


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("quota", exceptions.ResourceExhausted),
        ("daily_quota", exceptions.ResourceExhausted),
        ("internal", exceptions.InternalServerError),
        ("unavailable", exceptions.ServiceUnavailable),
    ],
)
def test_ads_faults_the_interceptor_leaves_raw(
    sandbox: GoogleSandbox, ads: Ads, fault: str, error: type[Exception]
):
    user_list = create_ads_list(ads)
    job = create_job(ads, user_list)
    add_operations(ads, job, [create_op(sha("q@example.com"))])
    sandbox.inject("RunOfflineUserDataJob", fault, times=2)
    for _ in range(2):
        with pytest.raises(error) as raised:
            ads.jobs.run_offline_user_data_job(resource_name=job, retry=None, timeout=TIMEOUT)
        assert not isinstance(raised.value, GoogleAdsException)
    assert sandbox.members(user_list) == set()
    ads.jobs.run_offline_user_data_job(resource_name=job, retry=None, timeout=TIMEOUT).result(
        timeout=TIMEOUT
    )
    assert sandbox.members(user_list) == {f"email:{sha('q@example.com')}"}


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT campaign.id FROM campaign", "PROHIBITED_RESOURCE_TYPE_IN_FROM_CLAUSE"),
        ("SELECT user_list.nope FROM user_list", "UNRECOGNIZED_FIELD"),
        ("SELECT user_list.id FROM user_list WHERE user_list.id > 3", "UNEXPECTED_INPUT"),
        ("DELETE everything", "QUERY_ERROR"),
    ],
)
def test_ads_unsupported_gaql_is_rejected(ads: Ads, query: str, reason: str):
    with pytest.raises(GoogleAdsException) as raised:
        search(ads, query)
    assert error_code(raised.value.failure.errors[0]) == ("query_error", reason)


def test_inject_validates_its_arguments(sandbox: GoogleSandbox):
    with pytest.raises(ValueError, match="unknown RPC"):
        sandbox.inject("IngestEvents", "quota")
    with pytest.raises(ValueError, match="unknown fault"):
        sandbox.inject("Search", "slow")


def test_recorded_calls_time_their_handling(sandbox: GoogleSandbox, ads: Ads):
    started = time.perf_counter()
    search(ads, "SELECT user_list.id FROM user_list")
    (call,) = sandbox.requests("Search")
    assert 0 <= call.seconds <= time.perf_counter() - started
    assert call.service == "google.ads.googleads.v26.services.GoogleAdsService"
    assert call.request == {"customer_id": ACCOUNT, "query": "SELECT user_list.id FROM user_list"}


def test_ads_a_second_job_cannot_run_on_a_list_while_one_runs(ads: Ads):
    user_list = create_ads_list(ads)
    first, second = create_job(ads, user_list), create_job(ads, user_list)
    add_operations(ads, first, [create_op(sha("one@example.com"))])
    add_operations(ads, second, [create_op(sha("two@example.com"))])
    running = ads.jobs.run_offline_user_data_job(resource_name=first, retry=None, timeout=TIMEOUT)
    with pytest.raises(GoogleAdsException) as raised:
        ads.jobs.run_offline_user_data_job(resource_name=second, retry=None, timeout=TIMEOUT)
    assert [error_code(e) for e in raised.value.failure.errors] == [
        ("database_error", "CONCURRENT_MODIFICATION")
    ]
    running.result(timeout=TIMEOUT)
    ads.jobs.run_offline_user_data_job(resource_name=second, retry=None, timeout=TIMEOUT)


def test_ads_a_job_runs_for_its_time_however_often_its_status_is_read():
    """A job takes time, not status reads: "Offline user data jobs may take 6 hours or more to
    complete" (google-ads-python, examples/remarketing/add_customer_match_user_list.py); a
    few seconds here."""
    seconds = 3.0
    with GoogleSandbox(job_seconds=seconds) as slow:
        client = ads_clients(slow.address)
        user_list = create_ads_list(client)
        first, second = create_job(client, user_list), create_job(client, user_list)
        add_operations(client, first, [create_op(sha("one@example.com"))])
        add_operations(client, second, [create_op(sha("two@example.com"))])
        run = client.jobs.run_offline_user_data_job(resource_name=first, retry=None)
        started = time.monotonic()
        reads = 0
        while time.monotonic() < started + seconds - 1.0:
            assert job_row(client, first).status.name == "RUNNING"
            assert not run.done(retry=None)
            reads += 1
        assert reads > 20 and slow.members(user_list) == set()
        with pytest.raises(GoogleAdsException) as raised:
            client.jobs.run_offline_user_data_job(resource_name=second, retry=None)
        assert error_code(raised.value.failure.errors[0]) == (
            "database_error",
            "CONCURRENT_MODIFICATION",
        )
        time.sleep(max(0.0, started + seconds - time.monotonic()) + 0.1)
        assert job_row(client, first).status.name == "SUCCESS"
        assert run.done(retry=None)
        assert slow.members(user_list) == {f"email:{sha('one@example.com')}"}
        client.channel.close()


def dm_status(client: DataManager, request_id: str) -> dm.RequestStatusPerDestination:
    (per_destination,) = client.ingestion.retrieve_request_status(
        request={"request_id": request_id}, retry=None, timeout=TIMEOUT
    ).request_status_per_destination
    return per_destination


def test_dm_requests_are_processed_after_their_acknowledgement():
    """Google processes an acknowledged request later, and records can fail then
    (https://developers.google.com/data-manager/api/devguides/diagnostics)."""
    with GoogleSandbox(processing_seconds=3600) as slow:
        client = next(datamanager.__wrapped__(slow))
        user_list = create_dm_list(client)
        slow.fail_in_processing([sha("late@example.com")])
        members = [email_member("ok@example.com"), email_member("late@example.com")]
        request_id = ingest(client, ingest_request(user_list, members))
        assert dm_status(client, request_id).request_status.name == "PROCESSING"
        assert slow.members(user_list.id) == set()
        slow.process_pending()
        done = dm_status(client, request_id)
        assert done.request_status.name == "PARTIAL_SUCCESS"
        (count,) = done.error_info.error_counts
        assert (count.record_count, count.reason.name) == (
            1,
            "PROCESSING_ERROR_REASON_INVALID_FORMAT",
        )
        assert slow.members(user_list.id) == {f"email:{sha('ok@example.com')}"}
