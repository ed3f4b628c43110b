"""The VTEX client as a Dagster resource; credentials come from the tenant's references."""

import os

import dagster as dg

from cdp_assets.tenants.registry import Tenant
from cdp_assets.vtex.client import VtexClient

VTEX_BASE_URL = "https://{account}.{environment}.com.br"


class VtexResource(dg.ConfigurableResource):
    """How to reach VTEX. Without `base_url_template`, `VTEX_BASE_URL_TEMPLATE` (read at run
    time, so `cdp demo`/`cdp dev` can point it at the loopback sandbox) or VTEX itself."""

    base_url_template: str | None = None
    requests_per_second: float = 80.0  # per account; VTEX allows 100/s on Get order
    max_workers: int = 8
    timeout_seconds: float = 30.0
    max_retries: int = 6
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 60.0

    def client_for(self, tenant: Tenant) -> VtexClient:
        return VtexClient(
            tenant.account_name,
            (
                self.base_url_template or os.environ.get("VTEX_BASE_URL_TEMPLATE", VTEX_BASE_URL)
            ).format(account=tenant.account_name, environment=tenant.environment),
            tenant.credentials(),
            requests_per_second=self.requests_per_second,
            max_workers=self.max_workers,
            timeout_seconds=self.timeout_seconds,
            max_retries=self.max_retries,
            backoff_base_seconds=self.backoff_base_seconds,
            backoff_cap_seconds=self.backoff_cap_seconds,
        )
