"""Benchmark workloads: how many tenants, customers, orders, products and audience members.

`seed` is the old system's documented load (41 tenants, about 150,000 customers, 1,000,000
orders, 50,000 products / 200,000 SKUs, 90,000 customers in Meta audiences, a daily increment
of about 12,000 orders); `small` is a smoke test for CI and `large` shows how cost grows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from cdp_assets.tenants.registry import vtex_orders_available_from
from cdp_devkit.sandbox import StoreSpec

# The stores' histories start inside the two years VTEX serves orders for (a week inside, so a
# run lasting past midnight still reads them whole): every order syncs from the API.
HISTORY_MARGIN = timedelta(days=7)
# Each product has 1..7 SKUs, uniformly: 4 on average, so 50,000 products are 200,000 SKUs.
MAX_SKUS_PER_PRODUCT = 7
# Guest checkouts become customers of their own in the marts; a low share keeps the number of
# customers close to the registered (Master Data) ones, as in the old system's figures.
GUEST_SHARE = 0.02
# Tenant sizes follow a power law: a few large stores and a long tail, like a real agency's.
SIZE_EXPONENT = 0.8
# Of the daily increment, this share is new orders; the rest are status changes.
NEW_ORDER_SHARE = 0.75


@dataclass(frozen=True)
class Scale:
    name: str
    tenants: int
    customers: int
    orders: int
    products: int
    meta_members: int  # customers to put in Meta audiences, across tenants
    increment_orders: int  # new + changed orders of the daily increment
    write_path_documents: int  # order documents each write method lands
    google: bool  # also push the audiences to Google Data Manager
    fraction: float = 1.0  # share of the history generated (see `reduced`)

    def reduced(self, fraction: float) -> Scale:
        """The same tenants and daily increment over a fraction of the history (customers,
        orders, catalog, audience members, write-path documents): for a machine on which the
        whole scale would take too long. Reports say so."""
        if not 0 < fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")
        return replace(
            self,
            customers=round(self.customers * fraction),
            orders=round(self.orders * fraction),
            products=round(self.products * fraction),
            meta_members=round(self.meta_members * fraction),
            write_path_documents=round(self.write_path_documents * fraction),
            fraction=fraction,
        )

    def weights(self) -> list[float]:
        raw = [1.0 / (rank + 1) ** SIZE_EXPONENT for rank in range(self.tenants)]
        total = sum(raw)
        return [w / total for w in raw]

    def store_specs(self, history_end: datetime) -> list[StoreSpec]:
        """One synthetic VTEX store per tenant, largest first; totals match the scale."""
        weights = self.weights()
        customers = _apportion(self.customers, weights, minimum=150)
        orders = _apportion(self.orders, weights, minimum=600)
        products = _apportion(self.products, weights, minimum=20)
        return [
            StoreSpec(
                account=tenant_id(rank),
                seed=1000 + rank,
                customers=customers[rank],
                orders=orders[rank],
                products=products[rank],
                max_skus_per_product=MAX_SKUS_PER_PRODUCT,
                history_start=(vtex_orders_available_from(history_end) + HISTORY_MARGIN).date(),
                history_end=history_end,
                guest_share=GUEST_SHARE,
            )
            for rank in range(self.tenants)
        ]

    def increment(self) -> list[tuple[int, int]]:
        """(new, changed) orders per tenant for the daily increment, proportional to size."""
        weights = self.weights()
        new = _apportion(round(self.increment_orders * NEW_ORDER_SHARE), weights, minimum=1)
        changed = _apportion(self.increment_orders - sum(new), weights, minimum=1)
        return list(zip(new, changed, strict=True))


def tenant_id(rank: int) -> str:
    """Tenant ids double as VTEX account names: lower-case letters and digits."""
    return f"bench{rank + 1:02d}"


def _apportion(total: int, weights: list[float], minimum: int) -> list[int]:
    """Integers proportional to `weights`, each at least `minimum`, summing to `total` (the
    rounding remainder goes to the largest share) unless the minimums alone exceed it."""
    counts = [max(minimum, int(total * w)) for w in weights]
    counts[0] = max(minimum, counts[0] + total - sum(counts))
    return counts


SCALES: dict[str, Scale] = {
    scale.name: scale
    for scale in (
        Scale(
            name="small",
            tenants=2,
            customers=2_400,
            orders=12_000,
            products=200,
            meta_members=1_400,
            increment_orders=400,
            write_path_documents=10_000,
            google=True,
        ),
        Scale(
            name="seed",
            tenants=41,
            customers=150_000,
            orders=1_000_000,
            products=50_000,
            meta_members=90_000,
            increment_orders=12_000,
            write_path_documents=100_000,
            google=True,
        ),
        Scale(
            name="large",
            tenants=41,
            customers=1_000_000,
            orders=5_000_000,
            products=50_000,
            meta_members=600_000,
            increment_orders=60_000,
            write_path_documents=200_000,
            google=True,
        ),
    )
}
