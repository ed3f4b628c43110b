"""Legacy CMS collections of one account: collection -> subcollection -> SKUs, kept in memory.

Writes are the only state the client changes in the sandbox; they never touch the generated store.

As VTEX's Catalog API has it: its OpenAPI spec (``catalog-api.json``,
https://developers.vtex.com/docs/api-reference/catalog-api) and its Catalog known issues
(https://github.com/vtexdocs/known-issues, docs/en/known-issues/: deadlocks when adding SKUs to
a subcollection in quick succession, removed products kept until reindexed):
- creating a collection requires every field of the spec's ``required`` list (Name,
  Description, Searchable, Highlight, DateFrom, DateTo, TotalProducts, Type), a subcollection
  CollectionId, Name, Type, PreSale and Release: a body missing one is refused (400);
- adding a SKU to a subcollection that already holds it is refused (``AlreadyThere``, 409;
  the status is the sandbox's choice, VTEX documents none);
- fast successive "add SKU to subcollection" calls deadlock (known issue): ``deadlock_rate``
  of SKU writes are answered 500 with the database's deadlock message, the write undone;
- the products listing is read from the search index, which lags writes: a write shows in
  it only ``listing_lag_seconds`` later;
- ``GET /api/catalog_system/pvt/collection/search`` (every collection) and
  ``.../search/{searchTerms}`` (the collections "related to" the terms) page their answer as
  the spec's "Get all collections" and "Get collections by search terms" do: ``{paging: {page,
  perPage, total, pages, limit}, items: [{id, name, searchable, highlight, dateFrom, dateTo,
  totalSku, totalProducts, type, lastModifiedBy}]}``; page, pageSize and orderByAsc are
  required by the first, optional by the second. Both were removed from the spec as
  deprecated on 2025-06-26 (vtex/openapi-schemas commits e4c7a222 and c32abe9e, whose parents
  hold them). The sandbox's choices where the spec says nothing: a collection is related to
  the terms when its name holds one of their words (case-insensitive), items go by id
  (descending when orderByAsc is false), pageSize defaults to 20 and is cut to ``limit``, and the
  listing reads the collections themselves, without the products listing's lag (VTEX
  documents none);
- ``refused_skus`` (a test's fault, no documented VTEX behaviour): writes of these SKUs to a
  subcollection are answered 404.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdp_devkit.sandbox.vtex.generator import Store

SUBCOLLECTION_TYPES = ("Inclusive", "Exclusive")


COLLECTION_REQUIRED = (
    "Name",
    "Description",
    "Searchable",
    "Highlight",
    "DateFrom",
    "DateTo",
    "TotalProducts",
    "Type",
)
SUBCOLLECTION_REQUIRED = ("CollectionId", "Name", "Type", "PreSale", "Release")
SEARCH_LIMIT = 3000  # the spec's paging "limit": items displayed on a page at most
SEARCH_PAGE_SIZE = 20  # the "search by terms" example's perPage
DEADLOCK_MESSAGE = (
    "Transaction (Process ID 71) was deadlocked on lock resources with another process and"
    " has been chosen as the deadlock victim. Rerun the transaction."
)


class NotFound(LookupError):
    """The collection or subcollection does not exist (404)."""


class AlreadyThere(ValueError):
    """The SKU is already in the subcollection (409)."""


class Deadlocked(RuntimeError):
    """The write was chosen as a deadlock victim and undone (500)."""


def _require(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    missing = [name for name in fields if name not in body]
    if missing:
        raise ValueError(f"Required fields missing: {', '.join(missing)}")


@dataclass
class _Collection:
    document: dict[str, Any]
    subcollections: list[int] = field(default_factory=list)


@dataclass
class _Subcollection:
    document: dict[str, Any]
    skus: dict[int, None] = field(default_factory=dict)  # insertion-ordered set
    # Writes not yet in the products listing: (time.monotonic() of the write, SKU, added?).
    indexing: list[tuple[float, int, bool]] = field(default_factory=list)
    listed: dict[int, None] = field(default_factory=dict)


def _text(body: dict[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be a boolean")
    return value


def _query_int(params: Mapping[str, str], name: str, default: int | None) -> int:
    value = params.get(name)
    if value is None:
        if default is None:
            raise ValueError(f"query parameter {name} is required")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"query parameter {name} must be an integer") from None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


class Collections:
    """Collection state of one account, validated against that account's catalog."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._collections: dict[int, _Collection] = {}
        self._subcollections: dict[int, _Subcollection] = {}
        self._collection_ids = itertools.count(1001)
        self._subcollection_ids = itertools.count(5001)
        self.deadlock_rate = 0.0
        self.listing_lag_seconds = 0.0
        self.refused_skus: frozenset[int] = frozenset()
        self._random = random.Random(0)

    def configure(
        self,
        deadlock_rate: float,
        listing_lag_seconds: float,
        seed: int,
        refused_skus: frozenset[int] = frozenset(),
    ) -> None:
        if not 0.0 <= deadlock_rate < 1.0 or listing_lag_seconds < 0:
            raise ValueError("deadlock_rate must be from 0 to below 1, listing_lag_seconds >= 0")
        self.deadlock_rate, self.listing_lag_seconds = deadlock_rate, listing_lag_seconds
        self.refused_skus = refused_skus
        self._random = random.Random(seed)

    def create(self, body: Any) -> dict[str, Any]:
        body = _object(body)
        _require(body, COLLECTION_REQUIRED)
        collection_id = next(self._collection_ids)
        document = {"Id": collection_id, "Type": "Manual", "TotalProducts": 0}
        document.update(self._collection_fields(body, {}))
        self._collections[collection_id] = _Collection(document)
        return self.get(collection_id)

    def update(self, collection_id: int, body: Any) -> dict[str, Any]:
        collection = self._collection(collection_id)
        collection.document.update(self._collection_fields(_object(body), collection.document))
        return self.get(collection_id)

    def get(self, collection_id: int) -> dict[str, Any]:
        collection = self._collection(collection_id)
        products = {row["ProductId"] for row in self._members(collection)}
        return {**collection.document, "TotalProducts": len(products)}

    def search(self, terms: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        """A page of the collections related to `terms` (every collection without), as the
        query parameters ask for it."""
        page = _query_int(params, "page", None if terms is None else 1)
        page_size = _query_int(params, "pageSize", None if terms is None else SEARCH_PAGE_SIZE)
        ascending = params.get("orderByAsc", None if terms is None else "true")
        if ascending not in ("true", "false"):
            raise ValueError("query parameter orderByAsc must be true or false")
        if page < 1 or page_size < 1:
            raise ValueError("page and pageSize must be >= 1")
        words = (terms or "").lower().split()
        found = sorted(
            (
                collection_id
                for collection_id, collection in self._collections.items()
                if not words or any(w in collection.document["Name"].lower() for w in words)
            ),
            reverse=ascending == "false",
        )
        size = min(page_size, SEARCH_LIMIT)
        start = (page - 1) * size
        return {
            "paging": {
                "page": page,
                "perPage": size,
                "total": len(found),
                "pages": math.ceil(len(found) / size),
                "limit": SEARCH_LIMIT,
            },
            "items": [self._search_item(c) for c in found[start : start + size]],
        }

    def _search_item(self, collection_id: int) -> dict[str, Any]:
        collection = self._collections[collection_id]
        document, members = collection.document, self._members(collection)
        return {
            "id": collection_id,
            "name": document["Name"],
            "searchable": document["Searchable"],
            "highlight": document["Highlight"],
            "dateFrom": document["DateFrom"],
            "dateTo": document["DateTo"],
            "totalSku": len(members),
            "totalProducts": len({row["ProductId"] for row in members}),
            "type": document["Type"],
            "lastModifiedBy": None,
        }

    def delete(self, collection_id: int) -> None:
        collection = self._collection(collection_id)
        for sub_id in collection.subcollections:
            del self._subcollections[sub_id]
        del self._collections[collection_id]

    def create_subcollection(self, body: Any) -> dict[str, Any]:
        body = _object(body)
        _require(body, SUBCOLLECTION_REQUIRED)
        collection_id = body.get("CollectionId")
        if isinstance(collection_id, bool) or not isinstance(collection_id, int):
            raise ValueError("CollectionId must be an integer")
        collection = self._collection(collection_id)
        kind = _text(body, "Type", "Inclusive")
        if kind not in SUBCOLLECTION_TYPES:
            raise ValueError("Type must be Inclusive or Exclusive")
        sub_id = next(self._subcollection_ids)
        document = {
            "Id": sub_id,
            "CollectionId": collection_id,
            "Name": _text(body, "Name"),
            "Type": kind,
            "PreSale": _flag(body, "PreSale", False),
            "Release": _flag(body, "Release", False),
        }
        self._subcollections[sub_id] = _Subcollection(document)
        collection.subcollections.append(sub_id)
        return dict(document)

    def subcollections(self, collection_id: int) -> list[dict[str, Any]]:
        collection = self._collection(collection_id)
        return [dict(self._subcollections[s].document) for s in collection.subcollections]

    def add_sku(self, sub_id: int, body: Any) -> dict[str, Any]:
        subcollection = self._subcollection(sub_id)
        sku_id = _object(body).get("SkuId")
        if isinstance(sku_id, bool) or not isinstance(sku_id, int):
            raise ValueError("SkuId must be an integer")
        if self._store.sku_row(sku_id) is None:
            raise ValueError(f"SKU {sku_id} does not exist")
        self._refuse(sku_id)
        self._maybe_deadlock()
        if sku_id in subcollection.skus:
            raise AlreadyThere(f"SKU {sku_id} is already in subcollection {sub_id}")
        subcollection.skus[sku_id] = None
        subcollection.indexing.append((time.monotonic(), sku_id, True))
        return {"SubCollectionId": sub_id, "SkuId": sku_id}

    def remove_sku(self, sub_id: int, sku_id: int) -> None:
        subcollection = self._subcollection(sub_id)
        self._refuse(sku_id)
        self._maybe_deadlock()
        subcollection.skus.pop(sku_id, None)
        subcollection.indexing.append((time.monotonic(), sku_id, False))

    def delete_subcollection(self, sub_id: int) -> None:
        subcollection = self._subcollection(sub_id)
        self._collections[subcollection.document["CollectionId"]].subcollections.remove(sub_id)
        del self._subcollections[sub_id]

    def _refuse(self, sku_id: int) -> None:
        if sku_id in self.refused_skus:
            raise NotFound(f"SKU {sku_id} not found")

    def _maybe_deadlock(self) -> None:
        if self.deadlock_rate and self._random.random() < self.deadlock_rate:
            raise Deadlocked(DEADLOCK_MESSAGE)

    def products(self, collection_id: int, page: int, page_size: int) -> dict[str, Any]:
        rows = self._members(self._collection(collection_id))
        start = (page - 1) * page_size
        return {
            "Page": page,
            "Size": page_size,
            "TotalRows": len(rows),
            "TotalPage": math.ceil(len(rows) / page_size),
            "Data": rows[start : start + page_size],
        }

    def _collection(self, collection_id: int) -> _Collection:
        collection = self._collections.get(collection_id)
        if collection is None:
            raise NotFound(f"collection {collection_id} not found")
        return collection

    def _subcollection(self, sub_id: int) -> _Subcollection:
        subcollection = self._subcollections.get(sub_id)
        if subcollection is None:
            raise NotFound(f"subcollection {sub_id} not found")
        return subcollection

    def _collection_fields(self, body: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        return {
            "Name": _text(body, "Name", current.get("Name")),
            "Description": _text(body, "Description", current.get("Description", "")),
            "Searchable": _flag(body, "Searchable", current.get("Searchable", False)),
            "Highlight": _flag(body, "Highlight", current.get("Highlight", False)),
            "DateFrom": _text(body, "DateFrom", current.get("DateFrom")),
            "DateTo": _text(body, "DateTo", current.get("DateTo")),
        }

    def _indexed(self, subcollection: _Subcollection) -> dict[int, None]:
        """The subcollection's SKUs as the search index has them: writes older than the lag."""
        indexed_before = time.monotonic() - self.listing_lag_seconds
        pending = subcollection.indexing
        done = 0
        while done < len(pending) and pending[done][0] <= indexed_before:
            _, sku_id, added = pending[done]
            if added:
                subcollection.listed[sku_id] = None
            else:
                subcollection.listed.pop(sku_id, None)
            done += 1
        del pending[:done]
        return subcollection.listed

    def _members(self, collection: _Collection) -> list[dict[str, Any]]:
        """SKUs of the inclusive subcollections minus those of the exclusive ones, in order."""
        from cdp_devkit.sandbox.vtex.documents import product_name

        store = self._store
        subs = [self._subcollections[s] for s in collection.subcollections]
        excluded = {
            sku for s in subs if s.document["Type"] == "Exclusive" for sku in self._indexed(s)
        }
        rows: list[dict[str, Any]] = []
        seen: set[int] = set()
        for sub in subs:
            if sub.document["Type"] != "Inclusive":
                continue
            for sku_id in self._indexed(sub):
                if sku_id in excluded or sku_id in seen:
                    continue
                seen.add(sku_id)
                sku_row = store.sku_row(sku_id)
                assert sku_row is not None  # add_sku only accepts existing SKUs
                product_row = int(store.catalog.sku_product[sku_row])
                rows.append(
                    {
                        "ProductId": int(store.catalog.product_id[product_row]),
                        "SkuId": sku_id,
                        "SubCollectionId": sub.document["Id"],
                        "Position": len(rows) + 1,
                        "ProductName": product_name(store, product_row),
                        "SkuImageUrl": (
                            f"https://{store.account}.vteximg.com.br/arquivos/ids/"
                            f"{sku_id}/{sku_id}.jpg"
                        ),
                    }
                )
        return rows
