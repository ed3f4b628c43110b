"""Legacy CMS collections of one account: collection -> subcollections -> SKUs, kept in memory.

Writes are the only state the client changes in the sandbox; they never touch the generated store.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdp_assets.sandbox.generator import Store

SUBCOLLECTION_TYPES = ("Inclusive", "Exclusive")


class NotFound(LookupError):
    """The collection or subcollection does not exist (404)."""


@dataclass
class _Collection:
    document: dict[str, Any]
    subcollections: list[int] = field(default_factory=list)


@dataclass
class _Subcollection:
    document: dict[str, Any]
    skus: dict[int, None] = field(default_factory=dict)  # insertion-ordered set


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

    def create(self, body: Any) -> dict[str, Any]:
        body = _object(body)
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

    def delete(self, collection_id: int) -> None:
        collection = self._collection(collection_id)
        for sub_id in collection.subcollections:
            del self._subcollections[sub_id]
        del self._collections[collection_id]

    def create_subcollection(self, body: Any) -> dict[str, Any]:
        body = _object(body)
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
        subcollection.skus[sku_id] = None
        return {"SubCollectionId": sub_id, "SkuId": sku_id}

    def remove_sku(self, sub_id: int, sku_id: int) -> None:
        self._subcollection(sub_id).skus.pop(sku_id, None)

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

    def _members(self, collection: _Collection) -> list[dict[str, Any]]:
        """SKUs of the inclusive subcollections minus those of the exclusive ones, in order."""
        from cdp_assets.sandbox.documents import product_name

        store = self._store
        subs = [self._subcollections[s] for s in collection.subcollections]
        excluded = {sku for s in subs if s.document["Type"] == "Exclusive" for sku in s.skus}
        rows: list[dict[str, Any]] = []
        seen: set[int] = set()
        for sub in subs:
            if sub.document["Type"] != "Inclusive":
                continue
            for sku_id in sub.skus:
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
