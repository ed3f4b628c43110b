"""Google's clients, built for Google itself or for the loopback gRPC sandbox.

Both libraries only dial TLS with credentials, so for the sandbox their transports get an
insecure channel instead (the transport then never looks for credentials). The Google Ads
channel keeps the library's own interceptors: the metadata one adds the developer token
and login customer id, the exception one turns failures into ``GoogleAdsException``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.ads import datamanager_v1 as dm
from google.ads.datamanager_v1.services.ingestion_service.transports import (
    IngestionServiceGrpcTransport,
)
from google.ads.datamanager_v1.services.user_list_service.transports import (
    UserListServiceGrpcTransport,
)
from google.ads.googleads.client import GoogleAdsClient
from google.ads.googleads.interceptors.exception_interceptor import ExceptionInterceptor
from google.ads.googleads.interceptors.metadata_interceptor import MetadataInterceptor
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
    UserListServiceGrpcTransport as AdsUserListServiceGrpcTransport,
)

ADS_VERSION = "v26"


@dataclass(frozen=True)
class DataManagerClients:
    ingestion: dm.IngestionServiceClient
    user_lists: dm.UserListServiceClient


@dataclass(frozen=True)
class GoogleAdsServices:
    user_lists: UserListServiceClient
    jobs: OfflineUserDataJobServiceClient
    search: GoogleAdsServiceClient


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
            UserListServiceClient(transport=AdsUserListServiceGrpcTransport(channel=channel)),
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
