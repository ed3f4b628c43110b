"""The VTEX client as a Dagster resource; credentials come from the tenant's references."""

import dagster as dg

from cdp_assets.lib import settings
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.tenants.registry import Tenant
from cdp_assets.vtex.client import VtexClient


class VtexResource(dg.ConfigurableResource):
    """How to reach VTEX.

    Settings left unset are read at run time from `VTEX_BASE_URL_TEMPLATE` and
    `VTEX_REQUESTS_PER_SECOND`, so `cdp demo` and `cdp dev` can point every run at the
    loopback sandbox; otherwise they default to VTEX itself and 80 requests/s per account
    (VTEX documents 6,000/min for Get order), a budget every process calling the account
    shares through the warehouse.
    """

    base_url_template: str | None = None
    requests_per_second: float | None = None
    max_workers: int = 8
    timeout_seconds: float = 30.0  # the longest silence between two reads
    deadline_seconds: float = 180.0  # a whole request, the largest page included
    max_retries: int = 6
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 60.0
    # After a 429: VTEX's recommended minute when it gives no Retry-After; a Retry-After is
    # honoured up to the cap.
    throttle_backoff_seconds: float = 60.0
    max_retry_after_seconds: float = 300.0
    # A step whose requests still fail after max_retries is retried whole, up to 3 times,
    # after about this long (doubling, with jitter).
    step_retry_base_seconds: float = 30.0
    # Collection writes deadlock on VTEX's side when they come fast; unset means
    # VTEX_COLLECTION_WRITES_PER_SECOND, else 2 per second.
    collection_writes_per_second: float | None = None

    def collection_write_rate(self) -> float:
        return self.collection_writes_per_second or settings.positive_number(
            "VTEX_COLLECTION_WRITES_PER_SECOND"
        )

    def request_rate(self) -> float:
        """Requests per second per account: the client's pace, and the operations metrics'
        request budget."""
        return self.requests_per_second or settings.positive_number("VTEX_REQUESTS_PER_SECOND")

    def client_for(self, tenant: Tenant) -> VtexClient:
        template = self.base_url_template or settings.required("VTEX_BASE_URL_TEMPLATE")
        return VtexClient(
            tenant.account_name,
            template.format(account=tenant.account_name, environment=tenant.environment),
            tenant.credentials(),
            requests_per_second=self.request_rate(),
            max_workers=self.max_workers,
            timeout_seconds=self.timeout_seconds,
            deadline_seconds=self.deadline_seconds,
            max_retries=self.max_retries,
            backoff_base_seconds=self.backoff_base_seconds,
            backoff_cap_seconds=self.backoff_cap_seconds,
            throttle_backoff_seconds=self.throttle_backoff_seconds,
            max_retry_after_seconds=self.max_retry_after_seconds,
            budget_url=migrated_url(),
        )
