"""How to reach Google: its endpoints, or the loopback sandbox named by `GOOGLE_SANDBOX_ADDRESS`.

Credentials: the Data Manager API and the Google Ads API both use Google application
default credentials (a service account through `GOOGLE_APPLICATION_CREDENTIALS`, or the
environment's identity); the Google Ads developer token is the destination's
`developer_token` reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import dagster as dg

from cdp_assets.activation.destinations import Destination
from cdp_assets.lib import settings

if TYPE_CHECKING:
    from cdp_assets.activation.google.data_manager import DataManagerAudiences
    from cdp_assets.activation.google.google_ads import GoogleAdsAudiences


class _CallSettings(TypedDict):
    attempts: int
    retry_base_seconds: float
    call_timeout_seconds: float


class GoogleResource(dg.ConfigurableResource):
    """`timeout_seconds`: every call's gRPC deadline (a Google Ads job's wait has its own)."""

    sandbox_address: str | None = None
    attempts: int = 6
    retry_base_seconds: float = 5.0
    timeout_seconds: float = 120.0

    def _sandbox(self) -> str | None:
        return self.sandbox_address or settings.value("GOOGLE_SANDBOX_ADDRESS")

    def audiences_for(self, destination: Destination) -> DataManagerAudiences | GoogleAdsAudiences:
        # Google's generated clients are slow to import (Google Ads' most of all): only the
        # steps that push pay it, for their platform alone.
        settings: _CallSettings = {
            "attempts": self.attempts,
            "retry_base_seconds": self.retry_base_seconds,
            "call_timeout_seconds": self.timeout_seconds,
        }
        if destination.platform == "google_ads":
            from cdp_assets.activation.google.google_ads import (
                GoogleAdsAudiences,
                google_ads_services,
            )

            services = google_ads_services(
                destination.credential("developer_token"),
                destination.login_account_id,
                self._sandbox(),
            )
            return GoogleAdsAudiences(destination, services, **settings)
        from cdp_assets.activation.google.data_manager import (
            DataManagerAudiences,
            data_manager_clients,
        )

        return DataManagerAudiences(destination, data_manager_clients(self._sandbox()), **settings)
