"""VTEX legacy collections (collection -> subcollection -> SKUs) as an activation platform.

VTEX has no bulk write that reliably reindexes, and fast successive "add SKU to
subcollection" calls deadlock, so SKUs go one call each, serially, paced; a deadlock is a 5xx,
which the client retries with backoff. The collection and its subcollection are created once,
with every field the Catalog API spec requires, and their ids kept in our own table. Each is
looked up by name before it is created (the collection through the search by terms, removed
from the spec as deprecated, without which a collection cannot be found by name), so a lost
id or a lost create reply finds the one made before instead of a duplicate.

A SKU write is confirmed only by VTEX's success: a SKU already in the subcollection (409) is
there; a 404 or another refusal rejects that SKU with VTEX's answer, unless the subcollection
itself is gone, which raises ``AudienceGone`` so the sync creates it again. A SKU id that is
not a number is rejected without a call. The products listing lags writes (it is read from
the search index), so it is read only by ``replace``, whose repair tolerates the lag; a SKU
``replace`` could not remove is reported as still held (``BatchResult.unremoved``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from cdp_assets.activation.destinations import DestinationAudience
from cdp_assets.activation.sync import AudienceGone, BatchResult, Row
from cdp_assets.vtex.client import VtexAuthError, VtexClient, VtexError, VtexRequestFailed

PAGE_SIZE = 50
SEARCH_PAGE_SIZE = 100
# VtexClient's text for a refused call: "{method} {path} answered HTTP {status}: {body}".
ANSWERED = re.compile(r"answered HTTP (\d{3})")
ALREADY_THERE = 409


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
            reply = self.client.request(method, path, json_body=body)
        finally:
            self._last_write = time.monotonic()
        return reply.data if reply is not None else None

    def matchable(self, row: Row) -> bool:
        return True

    def ensure_audience(self, target: DestinationAudience) -> str:
        """The collection and subcollection of the audience, each found by name before it is
        created: a create whose reply was lost, or an id we lost, finds the one made before."""
        name = f"{target.audience} ({target.destination.tenant_id})"
        collection = self._find_collection(name)
        if collection is None:
            now = datetime.now()
            collection = self._write(
                "POST",
                "/api/catalog/pvt/collection",
                {
                    "Name": name,
                    "Description": "Kept in sync by the customer data platform.",
                    "Searchable": False,
                    "Highlight": False,
                    "DateFrom": _local(now),
                    "DateTo": _local(now + timedelta(days=3650)),
                    "TotalProducts": 0,
                    "Type": "Manual",
                },
            )["Id"]
        subcollection = next(
            (s["Id"] for s in self._subcollections(collection) if s.get("Name") == target.audience),
            None,
        )
        if subcollection is None:
            subcollection = self._write(
                "POST",
                "/api/catalog/pvt/subcollection",
                {
                    "CollectionId": collection,
                    "Name": target.audience,
                    "Type": "Inclusive",
                    "PreSale": False,
                    "Release": False,
                },
            )["Id"]
        return f"{collection}/{subcollection}"

    def _find_collection(self, name: str) -> int | None:
        """The oldest collection named exactly `name`, through every page of the search by
        terms (the name's words; VTEX answers the collections "related to" them). None when
        there is none, or when VTEX no longer serves the search (deprecated in its spec)."""
        path = f"/api/catalog_system/pvt/collection/search/{quote(name, safe='')}"
        found: list[int] = []
        page = 1
        while True:
            params = {"page": page, "pageSize": SEARCH_PAGE_SIZE, "orderByAsc": "true"}
            reply = self.client.get(path, params=params, not_found_ok=True)
            data = reply.data if reply is not None else None
            if not isinstance(data, dict):
                return None
            found += [item["id"] for item in data.get("items", []) if item.get("name") == name]
            if page >= data.get("paging", {}).get("pages", 0):
                return min(found, default=None)
            page += 1

    def _subcollections(self, collection: int | str) -> list[dict[str, Any]]:
        """The collection's subcollections; none when the collection is gone."""
        reply = self.client.get(
            f"/api/catalog/pvt/collection/{collection}/subcollection", not_found_ok=True
        )
        listed = reply.data if reply is not None else None
        return listed if isinstance(listed, list) else []

    def _each_sku(self, platform_id: str, rows: list[Row], method: str) -> BatchResult:
        subcollection = platform_id.split("/")[1]
        rejected: dict[int, str] = {}
        path = f"/api/catalog/pvt/subcollection/{subcollection}/stockkeepingunit"
        for index, (sku_id, *_) in enumerate(rows):
            if not sku_id.isdigit():
                rejected[index] = f"SKU id {sku_id!r} is not a number"
                continue
            try:
                if method == "POST":
                    self._write("POST", path, {"SkuId": int(sku_id)})
                else:
                    self._write("DELETE", f"{path}/{sku_id}")
            except (VtexRequestFailed, VtexAuthError):
                raise
            except VtexError as error:
                answered = ANSWERED.search(str(error))
                status = int(answered.group(1)) if answered else None
                if method == "POST" and status == ALREADY_THERE:
                    continue
                if status == 404 and not self._exists(platform_id):
                    raise AudienceGone(platform_id, "HTTP 404", str(error)[:200]) from None
                rejected[index] = str(error)[:200]
        return BatchResult(rejected=rejected, requests=len(rows))

    def _exists(self, platform_id: str) -> bool:
        """Whether the collection still holds the subcollection."""
        collection, subcollection = platform_id.split("/")
        return any(str(s.get("Id")) == subcollection for s in self._subcollections(collection))

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
        leaving = sorted(current - wanted)
        removed = self.remove(platform_id, [[sku] for sku in leaving])
        # Adding what the lagging listing does not show yet is harmless: it is already there.
        positions = [i for i, row in enumerate(desired) if row[0] not in current]
        added = self.add(platform_id, [desired[i] for i in positions])
        # Rejected additions by their position among every row sent, as the sync numbers them.
        rejected = {positions[i]: reason for i, reason in added.rejected.items()}
        return BatchResult(
            rejected=rejected,
            requests=removed.requests + added.requests,
            unremoved={leaving[i]: reason for i, reason in removed.rejected.items()},
        )

    def busy(self, platform_id: str) -> str | None:
        return None

    def match_info(self, platform_id: str) -> dict[str, Any]:
        reply = self.client.get(f"/api/catalog/pvt/collection/{platform_id.split('/')[0]}")
        return {"total_products": (reply.data or {}).get("TotalProducts") if reply else None}
