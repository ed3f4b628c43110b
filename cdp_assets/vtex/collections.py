"""VTEX legacy collections (collection -> subcollection -> SKUs) as an activation platform.

VTEX has no bulk write that reliably reindexes, and fast successive "add SKU to
subcollection" calls deadlock, so SKUs go one call each, serially, paced. The collection
and its subcollection are created once and their ids kept in our own table (the listing
endpoints are deprecated).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from cdp_assets.activation.destinations import DestinationAudience
from cdp_assets.activation.sync import BatchResult, Row
from cdp_assets.vtex.client import VtexAuthError, VtexClient, VtexError, VtexRequestFailed

PAGE_SIZE = 50


def _local(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S")  # VTEX wants local time without an offset


class VtexCollections:
    """Collections of one VTEX account, written at most ``writes_per_second``."""

    batch_size = 100  # SKUs between two state commits

    def __init__(self, client: VtexClient, writes_per_second: float = 2.0) -> None:
        self.client = client
        self.interval = 1.0 / writes_per_second
        self._last_write = 0.0

    def _write(self, method: str, path: str, body: Any = None) -> Any:
        wait = self._last_write + self.interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            reply = self.client.request(method, path, json_body=body, not_found_ok=True)
        finally:
            self._last_write = time.monotonic()
        return reply.data if reply is not None else None

    def matchable(self, row: Row) -> bool:
        return True

    def ensure_audience(self, target: DestinationAudience) -> str:
        now = datetime.now()
        collection = self._write(
            "POST",
            "/api/catalog/pvt/collection",
            {
                "Name": f"{target.audience} ({target.destination.tenant_id})",
                "Description": "Kept in sync by the customer data platform.",
                "Searchable": False,
                "Highlight": False,
                "DateFrom": _local(now),
                "DateTo": _local(now + timedelta(days=3650)),
            },
        )
        subcollection = self._write(
            "POST",
            "/api/catalog/pvt/subcollection",
            {"CollectionId": collection["Id"], "Name": target.audience, "Type": "Inclusive"},
        )
        return f"{collection['Id']}/{subcollection['Id']}"

    def _each_sku(self, platform_id: str, rows: list[Row], method: str) -> BatchResult:
        subcollection = platform_id.split("/")[1]
        rejected: dict[int, str] = {}
        for index, (sku_id, *_) in enumerate(rows):
            path = f"/api/catalog/pvt/subcollection/{subcollection}/stockkeepingunit"
            try:
                if method == "POST":
                    self._write("POST", path, {"SkuId": int(sku_id)})
                else:
                    self._write("DELETE", f"{path}/{sku_id}")
            except (VtexRequestFailed, VtexAuthError):
                raise
            except VtexError as error:  # a 4xx about this SKU (e.g. it no longer exists)
                rejected[index] = str(error)[:200]
        return BatchResult(rejected=rejected, requests=len(rows))

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._each_sku(platform_id, rows, "POST")

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._each_sku(platform_id, rows, "DELETE")

    def current_skus(self, platform_id: str) -> list[str]:
        collection, subcollection = platform_id.split("/")
        skus: list[str] = []
        page = 1
        while True:
            reply = self.client.get(
                f"/api/catalog/pvt/collection/{collection}/products",
                params={"page": page, "pageSize": PAGE_SIZE},
            )
            data = reply.data if reply is not None else {}
            skus += [
                str(row["SkuId"])
                for row in data.get("Data", [])
                if str(row.get("SubCollectionId")) == subcollection
            ]
            if page >= data.get("TotalPage", 0):
                return skus
            page += 1

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult:
        """Reconcile with what VTEX lists now, not with our state: the on-demand repair."""
        desired = [row for batch in batches for row in batch]
        wanted = {row[0] for row in desired}
        current = set(self.current_skus(platform_id))
        removed = self.remove(platform_id, [[sku] for sku in sorted(current - wanted)])
        added = self.add(platform_id, [row for row in desired if row[0] not in current])
        return BatchResult(requests=removed.requests + added.requests)

    def busy(self, platform_id: str) -> str | None:
        return None

    def match_info(self, platform_id: str) -> dict[str, Any]:
        reply = self.client.get(f"/api/catalog/pvt/collection/{platform_id.split('/')[0]}")
        return {"total_products": (reply.data or {}).get("TotalProducts") if reply else None}
