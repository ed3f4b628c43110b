"""How to reach Google: its endpoints, or the loopback sandbox named by `GOOGLE_SANDBOX_ADDRESS`.

Credentials: the Data Manager API and the Google Ads API both use Google application
default credentials (a service account through `GOOGLE_APPLICATION_CREDENTIALS`, or the
environment's identity); the Google Ads developer token is the destination's
`developer_token` reference.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import dagster as dg

from cdp_assets.activation.destinations import Destination

if TYPE_CHECKING:
    from cdp_assets.google.data_manager import DataManagerAudiences
    from cdp_assets.google.google_ads import GoogleAdsAudiences


class GoogleResource(dg.ConfigurableResource):
    sandbox_address: str | None = None
    attempts: int = 6
    retry_base_seconds: float = 5.0

    def _sandbox(self) -> str | None:
        return self.sandbox_address or os.environ.get("GOOGLE_SANDBOX_ADDRESS")

    def audiences_for(self, destination: Destination) -> DataManagerAudiences | GoogleAdsAudiences:
        # Google's generated clients take seconds to import: only the steps that push pay it,
        # not every process that loads the code location.
        from cdp_assets.google.clients import data_manager_clients, google_ads_services
        from cdp_assets.google.data_manager import DataManagerAudiences
        from cdp_assets.google.google_ads import GoogleAdsAudiences

        retry = {"attempts": self.attempts, "retry_base_seconds": self.retry_base_seconds}
        if destination.platform == "google_ads":
            services = google_ads_services(
                destination.credential("developer_token"),
                destination.login_account_id,
                self._sandbox(),
            )
            return GoogleAdsAudiences(destination, services, **retry)
        return DataManagerAudiences(destination, data_manager_clients(self._sandbox()), **retry)
