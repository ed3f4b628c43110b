"""Loopback VTEX sandbox: real HTTP against a sandbox subprocess, responses checked against VTEX's
OpenAPI specs, and the generated stores checked for the shape downstream analytics rely on."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests
from openapi_schema_validator import OAS30Validator

from cdp_devkit.sandbox import (
    MALFORMED_KINDS,
    SandboxProcess,
    Store,
    StoreSpec,
    credentials_for,
    history_end_today,
    parse_ticks,
)

SPECS_DIR = Path("/work/shared/reference/vtex-openapi")
ORDERS_API = "orders-api.json"
CATALOG_API = "catalog-api.json"
MASTERDATA_API = "masterdata-v1-api.json"

# "acme" is never mutated, so it stays equal to an in-process Store built from the same spec. Its
# orders lie within the two years VTEX serves (a window relative to today).
TODAY = history_end_today()
ACME_BUSY_DAY = (TODAY - timedelta(days=400)).date()
ACME = StoreSpec(
    "acme",
    seed=3,
    orders=4000,
    customers=900,
    products=120,
    malformed_orders=8,
    history_start=(TODAY - timedelta(days=600)).date(),
    history_end=TODAY,
    busy_day=ACME_BUSY_DAY,
    busy_day_orders=3200,
)
BETA = StoreSpec("beta", seed=2, orders=300, customers=60, products=30)
GAMMA = StoreSpec("gamma", seed=5, orders=600, customers=150, products=40)  # mutation tests
AFTER_BUSY_DAY = ACME_BUSY_DAY + timedelta(days=1)
BUSY_DAY = f"creationDate:[{ACME_BUSY_DAY}T00:00:00.000Z TO {AFTER_BUSY_DAY}T00:00:00.000Z]"
VTEX_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7}\+00:00")


# ----- helpers ------------------------------------------------------------------------------------


@cache
def _spec(name: str) -> dict[str, Any]:
    return json.loads((SPECS_DIR / name).read_text())


@cache
def _validator(spec_name: str, path: str, method: str) -> OAS30Validator | None:
    response = _spec(spec_name)["paths"][path][method]["responses"]["200"]
    content = response.get("content")
    if not content:
        return None
    schema = next(iter(content.values()))["schema"]
    # Local $refs (#/components/...) resolve against the root schema, so graft the components on.
    return OAS30Validator({**schema, "components": _spec(spec_name)["components"]})


def assert_valid(spec_name: str, path: str, method: str, response: requests.Response) -> Any:
    """The response is a 200 whose body validates against the spec's 200 schema for the path."""
    assert response.status_code == 200, response.text[:500]
    validator = _validator(spec_name, path, method.lower())
    if validator is None:  # the spec documents a bodiless 200
        assert response.content == b""
        return None
    body = response.json()
    errors = list(validator.iter_errors(body))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
    return body


def vtex_session(account: str) -> requests.Session:
    session = requests.Session()
    app_key, app_token = credentials_for(account)
    session.headers.update(
        {
            "X-VTEX-API-AppKey": app_key,
            "X-VTEX-API-AppToken": app_token,
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
    )
    return session


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess([ACME, BETA, GAMMA]) as process:
        yield process


@pytest.fixture(scope="module")
def acme_store() -> Store:
    return Store(ACME)


@pytest.fixture
def faults(sandbox: SandboxProcess) -> Iterator[SandboxProcess]:
    yield sandbox
    sandbox.clear_faults()


@pytest.fixture
def acme(sandbox: SandboxProcess) -> tuple[requests.Session, str]:
    return vtex_session("acme"), sandbox.account_url("acme") + "/api"


# ----- store generation ---------------------------------------------------------------------------


def test_spec_parse_and_cli_round_trip() -> None:
    spec = StoreSpec.parse(
        "acme:orders=20000,customers=5000,products=500,seed=1,"
        "busy_day=2024-03-15,busy_day_orders=3500,guest_share=0.2"
    )
    assert spec == StoreSpec(
        "acme",
        orders=20000,
        customers=5000,
        products=500,
        busy_day=date(2024, 3, 15),
        busy_day_orders=3500,
        guest_share=0.2,
    )
    assert StoreSpec.parse(spec.to_cli()) == spec
    assert StoreSpec.parse("solo") == StoreSpec("solo")
    assert StoreSpec("x").history_end == history_end_today()
    with pytest.raises(ValueError):
        StoreSpec.parse("acme:ordres=5")
    with pytest.raises(ValueError):
        StoreSpec("Bad_Name")


def test_same_spec_renders_identical_documents_and_seeds_differ() -> None:
    spec = StoreSpec("det", seed=11, orders=800, customers=200, products=50, malformed_orders=4)
    first, second = Store(spec), Store(spec)
    assert first.order_ids() == second.order_ids()
    for order_id in first.order_ids()[::7]:
        assert first.order_document(order_id) == second.order_document(order_id)
    for product_id in first.product_ids()[::5]:
        assert first.product_document(product_id) == second.product_document(product_id)
    for sku_id in first.sku_ids()[::9]:
        assert first.sku_document(sku_id) == second.sku_document(sku_id)
    for customer_id in first.customer_ids()[::5]:
        assert first.customer_document(customer_id) == second.customer_document(customer_id)

    other = Store(StoreSpec("det", seed=12, orders=800, customers=200, products=50))
    assert other.order_ids() != first.order_ids()
    assert other.customer_ids() != first.customer_ids()
    assert other.order_document(other.order_ids()[0]) != first.order_document(first.order_ids()[0])


def test_million_order_store_builds_fast_with_consistent_shape() -> None:
    spec = StoreSpec(
        "big", orders=1_000_000, customers=150_000, products=50_000, max_skus_per_product=7
    )
    started = time.perf_counter()
    store = Store(spec)
    elapsed = time.perf_counter() - started
    print(
        f"\n1,000,000 orders / 150,000 customers / {len(store.catalog.sku_id):,} SKUs "
        f"generated in {elapsed:.2f} s"
    )
    assert elapsed < 60
    orders, catalog = store.orders, store.catalog
    assert len(orders) == 1_000_000 and len(catalog.product_id) == 50_000
    assert 150_000 < len(catalog.sku_id) < 250_000

    ids = store.order_ids()
    assert len(set(ids)) == len(ids)
    assert np.all(np.diff(orders.created) >= 0)  # sorted by creationDate
    assert np.all(orders.last_change >= orders.created)
    assert np.all(orders.last_change <= store.history_end_ticks)
    assert np.all(np.diff(catalog.sku_id) > 0) and catalog.sku_id.max() < 2**31
    # Every item references an existing SKU, and totals add up to the order value.
    assert orders.item_sku.min() >= 0 and orders.item_sku.max() < len(catalog.sku_id)
    starts = orders.item_start[:-1]
    assert np.array_equal(
        orders.items_total, np.add.reduceat(orders.item_price * orders.item_quantity, starts)
    )
    assert np.array_equal(
        orders.discounts,
        np.add.reduceat(
            (orders.item_selling_price - orders.item_price) * orders.item_quantity, starts
        ),
    )
    assert np.array_equal(orders.value, orders.items_total + orders.discounts + orders.shipping)
    assert set(np.diff(orders.item_start).tolist()) <= {1, 2, 3, 4, 5}

    known_skus = set(store.sku_ids())
    product_of_sku = {
        sku: pid
        for pid, row in zip(store.product_ids(), range(50_000), strict=True)
        for sku in store.skus_of_product_row(row)
    }
    for row in range(0, 1_000_000, 997):
        document = orjson.loads(store.order_document(ids[row]))
        assert document["value"] == sum(total["value"] for total in document["totals"])
        for item in document["items"]:
            assert int(item["id"]) in known_skus
            assert product_of_sku[int(item["id"])] == int(item["productId"])

    registered = orders.buyer[orders.buyer < spec.customers]
    per_customer = np.bincount(registered)
    per_customer = per_customer[per_customer > 0]
    one_time = float((per_customer == 1).mean())
    print(f"one-time buyers {one_time:.1%}, max orders per customer {per_customer.max()}")
    assert 0.3 <= one_time <= 0.8
    assert per_customer.max() >= 10
    guests = float((orders.buyer >= spec.customers).mean())
    assert 0.08 <= guests <= 0.12


def test_generated_people_exercise_identity_resolution(acme_store: Store) -> None:
    customers = [acme_store.customer_document(c) for c in acme_store.customer_ids()]
    names = {c["firstName"] for c in customers} | {c["lastName"] for c in customers}
    assert any(n in names for n in ("José", "Conceição", "João"))
    emails = [c["email"] for c in customers]
    assert any(e != e.strip() for e in emails) and any(e != e.lower() for e in emails)
    normalised = Counter(e.strip().lower() for e in emails)
    by_document: dict[str, set[str]] = {}
    for c in customers:
        by_document.setdefault(c["document"], set()).add(c["email"].strip().lower())
    # Same person, two CL records with different e-mails; and same address in another case.
    assert any(len(found) > 1 for found in by_document.values())
    assert any(count > 1 for count in normalised.values())
    assert all(re.fullmatch(r"\d{11}", c["document"]) for c in customers)
    assert len({re.sub(r"\d", "9", c["phone"]) for c in customers}) >= 3  # several formats
    assert len({c["userId"] for c in customers}) == len(customers)

    cl_users = {c["userId"] for c in customers}
    statuses, guests = Counter(), 0
    order_ids = acme_store.order_ids()
    for order_id in order_ids[::10]:
        if acme_store.is_malformed(order_id):
            continue
        document = orjson.loads(acme_store.order_document(order_id))
        profile = document["clientProfileData"]
        assert re.fullmatch(r"[0-9a-f]{32}@ct\.vtex\.com\.br", profile["email"])
        guests += profile["userProfileId"] not in cl_users
        statuses[document["status"]] += 1
        assert VTEX_TIME.fullmatch(document["creationDate"])
        assert VTEX_TIME.fullmatch(document["lastChange"])
        assert document["hostname"] == "acme"
        assert document["shippingData"]["address"]["country"] == "BRA"
        assert document["storePreferencesData"]["timeZone"] == "E. South America Standard Time"
    assert statuses.most_common(1)[0][0] == "invoiced" and statuses["canceled"] > 0
    assert 0.05 < guests / sum(statuses.values()) < 0.2


def test_recent_orders_are_still_in_progress() -> None:
    recent = StoreSpec("recent", orders=2000, history_start=(TODAY - timedelta(days=60)).date())
    store = Store(recent)
    last_days = [orjson.loads(store.order_document(o)) for o in store.order_ids()[-200:]]
    statuses = Counter(document["status"] for document in last_days)
    assert {
        "ready-for-handling",
        "handling",
        "payment-pending",
        "waiting-for-sellers-confirmation",
    } <= set(statuses)
    for document in last_days:
        if document["status"] == "payment-pending":
            assert document["authorizedDate"] is None
        elif document["status"] != "canceled":  # some cancellations happen before payment
            assert document["authorizedDate"] is not None
        assert (document["invoicedDate"] is None) == (document["status"] != "invoiced")


# ----- OMS ----------------------------------------------------------------------------------------


def test_order_list_validates_and_enforces_caps(
    acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    path = "/api/oms/pvt/orders"
    params = {"f_creationDate": BUSY_DAY, "per_page": 100, "orderBy": "creationDate,asc"}
    first = assert_valid(
        ORDERS_API, path, "get", session.get(api + "/oms/pvt/orders", params={**params, "page": 1})
    )
    assert first["paging"]["total"] > 3000 and len(first["list"]) == 100
    assert all(
        item["items"] is None and isinstance(item["totalValue"], int) for item in first["list"]
    )
    created = [item["creationDate"] for item in first["list"]]
    assert created == sorted(created)

    page_30 = session.get(api + "/oms/pvt/orders", params={**params, "page": 30}).json()
    assert len(page_30["list"]) == 100
    page_31 = assert_valid(
        ORDERS_API, path, "get", session.get(api + "/oms/pvt/orders", params={**params, "page": 31})
    )
    assert page_31["list"] == [] and page_31["paging"]["total"] == first["paging"]["total"]
    assert page_31["paging"]["pages"] > 30

    too_big = session.get(api + "/oms/pvt/orders", params={**params, "per_page": 101})
    assert too_big.status_code == 400

    # Inclusive bounds: a window that starts exactly at an order's creation instant contains it.
    row = len(acme_store.orders) // 2
    stamp = orjson.loads(acme_store.order_document(acme_store.order_id_at(row)))["creationDate"]
    exact = f"creationDate:[{stamp} TO {stamp}]".replace("+00:00", "Z")
    hit = session.get(api + "/oms/pvt/orders", params={"f_creationDate": exact}).json()
    assert [item["orderId"] for item in hit["list"]] == [acme_store.order_id_at(row)]

    canceled = session.get(
        api + "/oms/pvt/orders", params={"f_status": "canceled,payment-pending", "per_page": 100}
    ).json()
    assert {item["status"] for item in canceled["list"]} <= {"canceled", "payment-pending"}
    expected = int(np.isin(acme_store.orders.status, [1, 4]).sum())
    assert canceled["paging"]["total"] == expected


def test_order_detail_serves_the_store_truth(
    acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    ids = acme_store.order_ids()
    multi_item = [
        o
        for o in ids[:400]
        if not acme_store.is_malformed(o)
        and len(orjson.loads(acme_store.order_document(o))["items"]) >= 3
    ][:3]
    assert multi_item
    for order_id in [*ids[:5:2], *multi_item, ids[-1]]:
        if acme_store.is_malformed(order_id):
            continue
        response = session.get(f"{api}/oms/pvt/orders/{order_id}")
        assert_valid(ORDERS_API, "/api/oms/pvt/orders/{orderId}", "get", response)
        assert response.content == acme_store.order_document(order_id)
    assert session.get(f"{api}/oms/pvt/orders/9999999999999-01").status_code == 404
    # The served bytes are the store's bytes (above), so a wide sample can skip the HTTP round
    # trip: every status, payment group and marketing variant must validate too.
    validator = _validator(ORDERS_API, "/api/oms/pvt/orders/{orderId}", "get")
    assert validator is not None
    variants = set()
    for order_id in ids[::20]:
        if not acme_store.is_malformed(order_id):
            document = orjson.loads(acme_store.order_document(order_id))
            assert not list(validator.iter_errors(document)), order_id
            variants.add(
                (
                    document["status"],
                    document["marketingData"] is None,
                    document["paymentData"]["transactions"][0]["payments"][0]["group"],
                )
            )
    assert len(variants) >= 12


def test_malformed_orders_are_served_broken_with_status_200(
    acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    broken = [o for o in acme_store.order_ids() if acme_store.is_malformed(o)]
    assert len(broken) == ACME.malformed_orders
    kinds = Counter(acme_store.malformed_kind(o) for o in broken)
    assert set(kinds) == set(MALFORMED_KINDS)
    for order_id in broken:
        response = session.get(f"{api}/oms/pvt/orders/{order_id}")
        assert response.status_code == 200
        assert response.content == acme_store.order_document(order_id)
        kind = acme_store.malformed_kind(order_id)
        if kind == "unparseable":
            with pytest.raises(ValueError):
                response.json()
            continue
        document = response.json()
        if kind == "missing_lastChange":
            assert "lastChange" not in document
        elif kind == "value_not_numeric":
            assert isinstance(document["value"], str) and not document["value"].isdigit()
        else:
            assert "orderId" not in document


def test_order_routes_serve_the_orders_of_the_last_two_years_only(sandbox: SandboxProcess) -> None:
    """VTEX's List orders and Get order: "You can only access information from orders created
    in the last two years". The export (the truth) keeps every order."""
    session, api = vtex_session("beta"), sandbox.account_url("beta") + "/api"
    now = datetime.now(UTC)
    try:
        served_from = now.replace(year=now.year - 2)
    except ValueError:  # 29 February
        served_from = now.replace(year=now.year - 2, day=28)
    created = {
        row["key"]: datetime.fromisoformat(row["doc"]["creationDate"])
        for row in sandbox.export("beta", "orders")
        if not row["malformed"]
    }
    older = sorted((at, key) for key, at in created.items() if at < served_from)
    recent = sorted((at, key) for key, at in created.items() if at >= served_from)
    assert older and recent  # the store reaches further back than two years

    tomorrow = (now + timedelta(days=1)).date()
    everything = f"creationDate:[{BETA.history_start}T00:00:00.000Z TO {tomorrow}T00:00:00.000Z]"
    listed = session.get(
        api + "/oms/pvt/orders",
        params={"f_creationDate": everything, "per_page": 100, "orderBy": "creationDate,asc"},
    ).json()
    assert listed["paging"]["total"] == len(recent)
    assert listed["list"][0]["orderId"] == recent[0][1]
    assert session.get(f"{api}/oms/pvt/orders/{older[-1][1]}").status_code == 404
    assert session.get(f"{api}/oms/pvt/orders/{recent[0][1]}").status_code == 200


def test_authentication_and_unknown_account(sandbox: SandboxProcess) -> None:
    url = sandbox.account_url("acme") + "/api/oms/pvt/orders"
    app_key, app_token = credentials_for("acme")
    assert re.fullmatch(r"[0-9a-f]{40}", app_token) and app_key == "vtexappkey-acme-SANDBOX"
    wrong = requests.get(
        url, headers={"X-VTEX-API-AppKey": app_key, "X-VTEX-API-AppToken": "0" * 40}
    )
    assert wrong.status_code == 401 and "error" in wrong.json()
    assert requests.get(url).status_code == 401
    other_accounts_key = requests.get(
        url,
        headers=dict(
            zip(("X-VTEX-API-AppKey", "X-VTEX-API-AppToken"), credentials_for("beta"), strict=True)
        ),
    )
    assert other_accounts_key.status_code == 401
    lower_case = requests.get(
        url, headers={"x-vtex-api-appkey": app_key, "x-vtex-api-apptoken": app_token}
    )
    assert lower_case.status_code == 200
    unknown = vtex_session("nobody").get(sandbox.account_url("nobody") + "/api/oms/pvt/orders")
    assert unknown.status_code == 404


# ----- catalog ------------------------------------------------------------------------------------


def test_catalog_routes_validate_and_match_the_store(
    acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    ids_path = "/api/catalog_system/pvt/products/GetProductAndSkuIds"
    relation: dict[str, list[int]] = {}
    first = 1
    while True:
        body = assert_valid(
            CATALOG_API,
            ids_path,
            "get",
            session.get(
                api + "/catalog_system/pvt/products/GetProductAndSkuIds",
                params={"_from": first, "_to": first + 49},
            ),
        )
        relation.update(body["data"])
        if body["range"]["to"] >= body["range"]["total"]:
            break
        first += 50
    assert [int(p) for p in relation] == acme_store.product_ids()
    assert (
        session.get(
            api + "/catalog_system/pvt/products/GetProductAndSkuIds",
            params={"_from": 1, "_to": 251},
        ).status_code
        == 400
    )

    sku_path = "/api/catalog_system/pvt/sku/stockkeepingunitids"
    skus: list[int] = []
    page = 1
    while True:
        batch = assert_valid(
            CATALOG_API,
            sku_path,
            "get",
            session.get(
                api + "/catalog_system/pvt/sku/stockkeepingunitids",
                params={"page": page, "pagesize": 100},
            ),
        )
        if not batch:
            break
        skus += batch
        page += 1
    assert skus == acme_store.sku_ids() == sorted(s for v in relation.values() for s in v)
    assert (
        session.get(
            api + "/catalog_system/pvt/sku/stockkeepingunitids",
            params={"page": 1, "pagesize": 1001},
        ).status_code
        == 400
    )
    assert (
        session.get(
            api + "/catalog_system/pvt/sku/stockkeepingunitids", params={"page": 1}
        ).status_code
        == 400
    )

    for product_id in acme_store.product_ids()[:3]:
        body = assert_valid(
            CATALOG_API,
            "/api/catalog/pvt/product/{productId}",
            "get",
            session.get(f"{api}/catalog/pvt/product/{product_id}"),
        )
        assert body == acme_store.product_document(product_id)
    for sku_id in skus[:3]:
        body = assert_valid(
            CATALOG_API,
            "/api/catalog_system/pvt/sku/stockkeepingunitbyid/{skuId}",
            "get",
            session.get(f"{api}/catalog_system/pvt/sku/stockkeepingunitbyid/{sku_id}"),
        )
        assert body["Id"] == sku_id and sku_id in relation[str(body["ProductId"])]
    assert session.get(f"{api}/catalog/pvt/product/999999999").status_code == 404
    assert (
        session.get(f"{api}/catalog_system/pvt/sku/stockkeepingunitbyid/999999999").status_code
        == 404
    )


def test_collections_lifecycle(acme: tuple[requests.Session, str], acme_store: Store) -> None:
    session, api = acme
    base = api + "/catalog/pvt"
    created = assert_valid(
        CATALOG_API,
        "/api/catalog/pvt/collection",
        "post",
        session.post(
            f"{base}/collection",
            json={
                "Name": "Top CLV",
                "Description": "segment",
                "Searchable": False,
                "Highlight": False,
                "DateFrom": "2026-01-01T00:00:00",
                "DateTo": "2027-01-01T00:00:00",
                "TotalProducts": 0,
                "Type": "Manual",
            },
        ),
    )
    collection = created["Id"]
    assert created["Type"] == "Manual" and created["TotalProducts"] == 0
    updated = assert_valid(
        CATALOG_API,
        "/api/catalog/pvt/collection/{collectionId}",
        "put",
        session.put(f"{base}/collection/{collection}", json={"Name": "Top CLV 2"}),
    )
    assert updated["Name"] == "Top CLV 2" and updated["DateTo"] == "2027-01-01T00:00:00"
    sub = assert_valid(
        CATALOG_API,
        "/api/catalog/pvt/subcollection",
        "post",
        session.post(
            f"{base}/subcollection",
            json={
                "CollectionId": collection,
                "Name": "group 1",
                "Type": "Inclusive",
                "PreSale": False,
                "Release": False,
            },
        ),
    )
    assert sub["CollectionId"] == collection
    listed = assert_valid(
        CATALOG_API,
        "/api/catalog/pvt/collection/{collectionId}/subcollection",
        "get",
        session.get(f"{base}/collection/{collection}/subcollection"),
    )
    assert [s["Id"] for s in listed] == [sub["Id"]]

    sku_path = "/api/catalog/pvt/subcollection/{subCollectionId}/stockkeepingunit"
    skus = acme_store.sku_ids()[:5]
    for sku_id in skus:
        added = assert_valid(
            CATALOG_API,
            sku_path,
            "post",
            session.post(
                f"{base}/subcollection/{sub['Id']}/stockkeepingunit", json={"SkuId": sku_id}
            ),
        )
        assert added == {"SubCollectionId": sub["Id"], "SkuId": sku_id}
    assert (
        session.post(
            f"{base}/subcollection/{sub['Id']}/stockkeepingunit", json={"SkuId": 1}
        ).status_code
        == 400
    )
    assert_valid(
        CATALOG_API,
        sku_path + "/{skuId}",
        "delete",
        session.delete(f"{base}/subcollection/{sub['Id']}/stockkeepingunit/{skus[0]}"),
    )

    products_path = "/api/catalog/pvt/collection/{collectionId}/products"
    page = assert_valid(
        CATALOG_API,
        products_path,
        "get",
        session.get(f"{base}/collection/{collection}/products", params={"page": 1, "pageSize": 3}),
    )
    assert page["TotalRows"] == 4 and page["TotalPage"] == 2 and len(page["Data"]) == 3
    assert [row["SkuId"] for row in page["Data"]] == skus[1:4]
    got = assert_valid(
        CATALOG_API,
        "/api/catalog/pvt/collection/{collectionId}",
        "get",
        session.get(f"{base}/collection/{collection}"),
    )
    assert got["TotalProducts"] == len({acme_store.sku_document(s)["ProductId"] for s in skus[1:]})
    assert_valid(
        CATALOG_API,
        "/api/catalog/pvt/collection/{collectionId}",
        "delete",
        session.delete(f"{base}/collection/{collection}"),
    )
    assert session.get(f"{base}/collection/{collection}").status_code == 404


# ----- Master Data --------------------------------------------------------------------------------


def test_search_paging_with_rest_range(
    acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    path = "/api/dataentities/{acronym}/search"
    url = api + "/dataentities/CL/search"
    params = {"_fields": "id,userId,email,updatedIn", "_sort": "updatedIn ASC"}
    seen: list[str] = []
    start = 0
    while True:
        response = session.get(
            url, params=params, headers={"REST-Range": f"resources={start}-{start + 100}"}
        )
        page = assert_valid(MASTERDATA_API, path, "get", response)
        assert response.headers["REST-Content-Range"] == (
            f"resources={start}-{min(start + 100, 900) if start < 900 else start}/900"
        )
        if not page:
            break
        assert set(page[0]) == {"id", "userId", "email", "updatedIn"}
        seen += [document["id"] for document in page]
        start += 100
    assert sorted(seen) == sorted(acme_store.customer_ids())
    updated = [acme_store.customer_document(c)["updatedIn"] for c in seen]
    assert updated == sorted(updated)

    target = acme_store.customer_document(acme_store.customer_ids()[17])
    by_user = session.get(
        url,
        params={"userId": target["userId"], "_fields": "_all"},
        headers={"REST-Range": "resources=0-10"},
    ).json()
    assert by_user == [target]
    # Half a year of acme's history, from a day to the last second of another.
    since = (TODAY - timedelta(days=340)).date().isoformat()
    last_day = (TODAY - timedelta(days=160)).date().isoformat()
    until = f"{last_day}T23:59:59Z"
    window = session.get(
        url,
        params={"_where": f"updatedIn between {since} AND {until}", "_fields": "id"},
        headers={"REST-Range": "resources=0-100"},
    )
    updated_ticks = acme_store.buyers.updated
    expected = int(
        ((updated_ticks >= parse_ticks(since)) & (updated_ticks <= parse_ticks(until))).sum()
    )
    assert expected > 0
    assert window.headers["REST-Content-Range"].endswith(f"/{expected}")
    later = session.get(
        url,
        params={"_where": f"updatedIn>{last_day} AND isNewsletterOptIn=true"},
        headers={"REST-Range": "resources=0-1"},
    )
    assert later.status_code == 200 and set(later.json()[0]) == {"id"}
    for bad_range in ("resources=0-101", "resources=9990-10010"):
        assert session.get(url, headers={"REST-Range": bad_range}).status_code == 400
    assert (
        session.get(
            url, params={"_where": "updatedIn >> 3"}, headers={"REST-Range": "resources=0-1"}
        ).status_code
        == 400
    )


def test_scroll_returns_every_document_once(
    acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    url = api + "/dataentities/CL/scroll"
    response = session.get(url, params={"_size": 250, "_fields": "id,email"})
    token = response.headers["X-VTEX-MD-TOKEN"]
    assert response.headers["REST-Content-Total"] == "900"
    ids: list[str] = []
    while True:
        page = assert_valid(MASTERDATA_API, "/api/dataentities/{acronym}/scroll", "get", response)
        if not page:
            break
        ids += [document["id"] for document in page]
        response = session.get(url, params={"_token": token})
    assert len(ids) == len(set(ids)) and set(ids) == set(acme_store.customer_ids())
    assert session.get(url, params={"_token": token}).status_code == 400  # exhausted
    assert session.get(url, params={"_size": 1001}).status_code == 400


# ----- feed and mutations -------------------------------------------------------------------------


def _drain(session: requests.Session, url: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        batch = assert_valid(
            ORDERS_API, "/api/orders/feed", "get", session.get(url, params={"maxlot": 10})
        )
        if not batch:
            return events
        events += batch


def test_mutation_changes_exactly_the_returned_orders_and_feeds_events(
    sandbox: SandboxProcess,
) -> None:
    session, api = vtex_session("gamma"), sandbox.account_url("gamma") + "/api"
    feed, config = api + "/orders/feed", api + "/orders/feed/config"
    assert session.get(feed, params={"maxlot": 10}).status_code == 404  # no feed yet
    assert session.get(config).status_code == 404
    assert_valid(
        ORDERS_API,
        "/api/orders/feed/config",
        "post",
        session.post(
            config,
            json={
                "filter": {
                    "type": "FromWorkflow",
                    "status": [
                        "order-created",
                        "ready-for-handling",
                        "payment-pending",
                        "invoiced",
                        "canceled",
                        "waiting-for-sellers-confirmation",
                    ],
                },
                "queue": {
                    "visibilityTimeoutInSeconds": 1,
                    "MessageRetentionPeriodInSeconds": 345600,
                },
            },
        ),
    )
    assert session.get(feed, params={"maxlot": 11}).status_code == 400

    truth = Store(GAMMA)
    before = {row["key"]: row["doc"] for row in sandbox.export("gamma", "orders")}
    # After every order's last change, so each changed order is stamped at `at` itself.
    at = GAMMA.history_end + timedelta(minutes=1)
    stamp = f"{at:%Y-%m-%dT%H:%M:%S}"
    affected = sandbox.mutate("gamma", seed=1, changed=7, new=3, at=at)
    assert affected == truth.mutate(1, 7, 3, at)  # the same mutation is deterministic
    after = {row["key"]: row["doc"] for row in sandbox.export("gamma", "orders")}
    changed, new = affected[:7], affected[7:]
    assert set(after) - set(before) == set(new) and set(before) <= set(after)
    for order_id, document in before.items():
        if order_id in changed:
            moved = after[order_id]
            assert moved["status"] != document["status"]
            assert moved["lastChange"] > document["lastChange"]
            assert moved["lastChange"].startswith(f"{stamp}.0")
            assert {k for k in moved if moved[k] != document[k]} <= {
                "status",
                "statusDescription",
                "lastChange",
                "invoicedDate",
                "authorizedDate",
                "packageAttachment",
                "cancellationData",
                "cancelReason",
                "allowCancellation",
            }
        else:
            assert after[order_id] == document
    for order_id in new:
        assert_valid(
            ORDERS_API,
            "/api/oms/pvt/orders/{orderId}",
            "get",
            session.get(f"{api}/oms/pvt/orders/{order_id}"),
        )
        assert after[order_id]["creationDate"] <= f"{stamp}.0000000+00:00"
        assert orjson.dumps(after[order_id]) == truth.order_document(order_id)

    events = _drain(session, feed)
    assert {event["orderId"] for event in events} == set(affected)
    assert {e["state"] for e in events if e["orderId"] in new} >= {"order-created"}
    status = assert_valid(ORDERS_API, "/api/orders/feed/config", "get", session.get(config))
    assert status["quantity"] == len(events)
    assert _drain(session, feed) == []  # invisible while the visibility timeout runs
    time.sleep(1.2)
    again = _drain(session, feed)
    assert sorted(e["eventId"] for e in again) == sorted(e["eventId"] for e in events)
    assert_valid(
        ORDERS_API,
        "/api/orders/feed",
        "post",
        session.post(feed, json={"handles": [e["handle"] for e in again]}),
    )
    time.sleep(1.2)
    assert _drain(session, feed) == []
    assert session.get(config).json()["quantity"] == 0

    # A FromWorkflow filter only delivers events into its statuses.
    session.post(
        config,
        json={
            "filter": {"type": "FromWorkflow", "status": ["canceled"]},
            "queue": {"visibilityTimeoutInSeconds": 60},
        },
    )
    sandbox.mutate("gamma", seed=2, changed=20, new=2, at=at + timedelta(minutes=1))
    canceled = _drain(session, feed)
    assert canceled and {event["state"] for event in canceled} == {"canceled"}
    assert_valid(ORDERS_API, "/api/orders/feed/config", "delete", session.delete(config))
    assert session.get(config).status_code == 404


# ----- faults -------------------------------------------------------------------------------------


def test_rate_limit_and_server_error_faults(
    faults: SandboxProcess, acme: tuple[requests.Session, str]
) -> None:
    session, api = acme
    url = api + "/catalog_system/pvt/sku/stockkeepingunitids?page=1&pagesize=10"
    faults.set_faults({"seed": 1, "rate_429": 1.0, "retry_after": 2})
    limited = session.get(url)
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "2"

    faults.set_faults({"seed": 3, "rate_5xx": 1.0})
    responses = [session.get(url) for _ in range(24)]
    assert {r.status_code for r in responses} == {500, 502, 503, 504}
    assert all(r.text.startswith("<html>") for r in responses if r.status_code == 502)

    faults.set_faults({"seed": 1, "rate_429": 1.0, "routes": ["orders"]})
    assert session.get(url).status_code == 200  # catalog is not in the faulted routes
    assert session.get(api + "/oms/pvt/orders").status_code == 429
    faults.clear_faults()
    assert session.get(url).status_code == 200
    assert faults.stats()["accounts"]["acme"]["faults"]["5xx"] >= 24


def test_fault_sequence_is_reproducible_from_the_seed(
    faults: SandboxProcess, acme: tuple[requests.Session, str]
) -> None:
    session, api = acme
    url = api + "/catalog_system/pvt/sku/stockkeepingunitids?page=1&pagesize=10"

    def run() -> list[int]:
        faults.set_faults({"seed": 7, "rate_429": 0.3, "rate_5xx": 0.3, "retry_after": 0})
        return [session.get(url).status_code for _ in range(30)]

    first = run()
    assert first == run()
    assert 200 in first and 429 in first and set(first) & {500, 502, 503, 504}
    assert (
        requests.post(
            faults.base_url + "/_sandbox/faults", json={"rate_429": 0.7, "rate_5xx": 0.7}
        ).status_code
        == 400
    )
    assert (
        requests.post(faults.base_url + "/_sandbox/faults", json={"rate_492": 0.1}).status_code
        == 400
    )


def test_reset_fault_breaks_the_connection(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    url = f"{api}/oms/pvt/orders/{acme_store.order_ids()[0]}"
    faults.set_faults({"rate_reset": 1.0})
    resets = faults.stats()["accounts"]["acme"]["faults"].get("reset", 0)
    for _ in range(3):
        with pytest.raises((requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
            session.get(url)
    assert faults.stats()["accounts"]["acme"]["faults"]["reset"] == resets + 3
    faults.clear_faults()
    assert session.get(url).content == acme_store.order_document(acme_store.order_ids()[0])


def test_truncate_fault_sends_complete_response_with_half_a_body(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    order_id = acme_store.order_ids()[1]
    faults.set_faults({"rate_truncate": 1.0})
    response = session.get(f"{api}/oms/pvt/orders/{order_id}")
    assert response.status_code == 200
    assert int(response.headers["Content-Length"]) == len(response.content)
    assert len(response.content) == len(acme_store.order_document(order_id)) // 2
    with pytest.raises(ValueError):
        response.json()
    faults.clear_faults()
    assert session.get(f"{api}/oms/pvt/orders/{order_id}").json()["orderId"] == order_id


def test_slow_fault_delays_without_blocking_the_server(
    faults: SandboxProcess, acme: tuple[requests.Session, str]
) -> None:
    session, api = acme
    faults.set_faults({"rate_slow": 1.0, "slow_seconds": 1.0})
    timings: dict[str, float] = {}

    def slow_call() -> None:
        started = time.perf_counter()
        assert (
            session.get(
                api + "/catalog_system/pvt/sku/stockkeepingunitids",
                params={"page": 1, "pagesize": 5},
            ).status_code
            == 200
        )
        timings["slow"] = time.perf_counter() - started

    worker = threading.Thread(target=slow_call)
    worker.start()
    time.sleep(0.2)
    started = time.perf_counter()
    assert requests.get(faults.base_url + "/_sandbox/health").status_code == 200
    timings["health"] = time.perf_counter() - started
    worker.join()
    assert timings["slow"] >= 1.0 and timings["health"] < 0.5


def test_duplicate_pages_and_feed_events(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    faults.set_faults({"seed": 5, "duplicate_pages": True, "duplicate_feed_events": True})
    params = {"f_creationDate": BUSY_DAY, "per_page": 100, "orderBy": "creationDate,asc"}
    page_1 = session.get(api + "/oms/pvt/orders", params={**params, "page": 1}).json()["list"]
    page_2 = session.get(api + "/oms/pvt/orders", params={**params, "page": 2}).json()["list"]
    repeated = len(page_2) - 100
    assert 1 <= repeated <= 3 and page_2[:repeated] == page_1[-repeated:]

    url = api + "/dataentities/CL/scroll"
    response = session.get(url, params={"_size": 200, "_fields": "id"})
    ids: list[str] = []
    while page := response.json():
        ids += [document["id"] for document in page]
        response = session.get(url, params={"_token": response.headers["X-VTEX-MD-TOKEN"]})
    assert len(ids) > len(set(ids)) and set(ids) == set(acme_store.customer_ids())

    feed_session = vtex_session("beta")
    beta = faults.account_url("beta") + "/api/orders/feed"
    feed_session.post(beta + "/config", json={"queue": {"visibilityTimeoutInSeconds": 60}})
    faults.mutate("beta", seed=9, changed=10, new=0, at=datetime(2026, 12, 2, tzinfo=UTC))
    events = feed_session.get(beta, params={"maxlot": 10}).json()
    event_ids = [event["eventId"] for event in events]
    assert len(event_ids) > len(set(event_ids))
    feed_session.delete(beta + "/config")


def test_a_scroll_token_moves_on_whether_or_not_its_answer_arrived_and_expires(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    url = api + "/dataentities/CL/scroll"
    ids = acme_store.customer_ids()
    by_update = [ids[row] for row in np.argsort(acme_store.buyers.updated, kind="stable")]
    params = {"_size": 200, "_fields": "id", "_sort": "updatedIn ASC"}
    first = session.get(url, params=params)
    token = first.headers["X-VTEX-MD-TOKEN"]
    assert [document["id"] for document in first.json()] == by_update[:200]
    faults.set_faults({"rate_reset": 1.0, "routes": ["masterdata"]})
    with pytest.raises((requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        session.get(url, params={"_token": token})  # the second page, lost on the way
    faults.clear_faults()
    third = session.get(url, params={"_token": token}).json()
    assert [document["id"] for document in third] == by_update[400:600]

    # Expired as after 20 idle minutes: the third request with a token fails.
    faults.set_faults({"expire_scroll_after_pages": 2})
    response = session.get(url, params=params)
    token = response.headers["X-VTEX-MD-TOKEN"]
    assert len(session.get(url, params={"_token": token}).json()) == 200
    expired = session.get(url, params={"_token": token})
    assert expired.status_code == 400 and "expired" in expired.text


def test_endless_listings_never_reach_their_end(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    skus = acme_store.sku_ids()
    last_page = -(-len(skus) // 100)
    faults.set_faults({"endless_listings": True})
    sku_url = api + "/catalog_system/pvt/sku/stockkeepingunitids"
    past_end = session.get(sku_url, params={"page": last_page + 5, "pagesize": 100}).json()
    assert past_end == skus[(last_page - 1) * 100 :]

    products = len(acme_store.product_ids())
    window = session.get(
        api + "/catalog_system/pvt/products/GetProductAndSkuIds",
        params={"_from": products + 1, "_to": products + 50},
    ).json()
    assert window["data"] == {} and window["range"]["total"] > products + 50

    url = api + "/dataentities/CL/scroll"
    response = session.get(url, params={"_size": 500, "_fields": "id"})
    token = response.headers["X-VTEX-MD-TOKEN"]
    sizes = [len(response.json())]
    for _ in range(3):
        sizes.append(len(session.get(url, params={"_token": token}).json()))
    assert sizes == [500, 400, 500, 400]  # 900 customers, and again from the start


def test_malformed_envelopes(faults: SandboxProcess, acme: tuple[requests.Session, str]) -> None:
    session, api = acme
    faults.set_faults(
        {
            "malformed_envelopes": {
                "scroll_documents": "no_token_header",
                "sku_ids": "wrong_type",
                "product_and_sku_ids": "empty_body",
            }
        }
    )
    scroll = session.get(api + "/dataentities/CL/scroll", params={"_size": 10})
    assert len(scroll.json()) == 10 and "X-VTEX-MD-TOKEN" not in scroll.headers
    skus = session.get(
        api + "/catalog_system/pvt/sku/stockkeepingunitids", params={"page": 1, "pagesize": 5}
    )
    assert skus.status_code == 200 and len(skus.json()["items"]) == 5
    products = session.get(
        api + "/catalog_system/pvt/products/GetProductAndSkuIds", params={"_from": 1, "_to": 5}
    )
    assert products.status_code == 200 and products.content == b""
    assert faults.stats()["accounts"]["acme"]["faults"]["malformed_envelope"] >= 3
    with pytest.raises(requests.HTTPError):
        faults.set_faults({"malformed_envelopes": {"sku_ids": "garbled"}})


def test_broken_feed_deliveries_and_orders_whose_get_fails(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session = vtex_session("beta")
    feed = faults.account_url("beta") + "/api/orders/feed"
    session.post(feed + "/config", json={"queue": {"visibilityTimeoutInSeconds": 60}})
    faults.mutate("beta", seed=11, changed=4, new=0, at=datetime(2026, 12, 3, tzinfo=UTC))
    defects = ["no_handle", "null_order_id", "integer_order_id", "not_an_object"]
    faults.set_faults({"feed_event_defects": defects})
    lot = session.get(feed, params={"maxlot": 10}).json()
    session.delete(feed + "/config")
    intact = [event for event in lot if isinstance(event, dict) and "handle" in event]
    assert len(lot) == 8 and len(intact) == 6
    assert [event for event in lot if isinstance(event, str)] != []
    assert [event for event in lot if isinstance(event, dict) and "handle" not in event] != []
    order_ids = [event["orderId"] for event in intact]
    assert None in order_ids and any(isinstance(order_id, int) for order_id in order_ids)

    acme_session, api = acme
    missing, failing, garbled = acme_store.order_ids()[:3]
    faults.set_faults({"failing_orders": {missing: "404", failing: "5xx", garbled: "unparseable"}})
    assert acme_session.get(f"{api}/oms/pvt/orders/{missing}").status_code == 404
    assert acme_session.get(f"{api}/oms/pvt/orders/{failing}").status_code == 503
    unparseable = acme_session.get(f"{api}/oms/pvt/orders/{garbled}")
    assert unparseable.status_code == 200
    with pytest.raises(ValueError):
        unparseable.json()


def test_order_faults_answer_what_vtex_was_seen_answering(
    faults: SandboxProcess, acme: tuple[requests.Session, str], acme_store: Store
) -> None:
    session, api = acme
    poisoned, future, unlisted = [
        o for o in acme_store.order_ids() if not acme_store.is_malformed(o)
    ][:3]
    product = str(acme_store.product_ids()[0])
    faults.set_faults(
        {
            "poison_documents": [poisoned, product],
            "future_stamp_orders": [future],
            "unlisted_order_ids": [unlisted],
            "list_total_excess": 5,
        }
    )
    body = session.get(f"{api}/oms/pvt/orders/{poisoned}").content
    assert b'"discount":1e-20000' in body and orjson.loads(body)["orderId"] == poisoned
    assert b'"discount":1e-20000' in session.get(f"{api}/catalog/pvt/product/{product}").content
    stamped = session.get(f"{api}/oms/pvt/orders/{future}").json()
    assert stamped["lastChange"].startswith("9999-12-31")

    window = {"f_creationDate": f"creationDate:[{ACME.history_start}T00:00:00.000Z TO *]"}
    params = {**window, "per_page": 100, "orderBy": "creationDate,asc"}
    listed = session.get(api + "/oms/pvt/orders", params=params).json()
    entries = listed["list"]
    assert [entry for entry in entries if "orderId" not in entry]  # the unlisted one
    assert unlisted not in {entry.get("orderId") for entry in entries}
    assert listed["paging"]["total"] == len(acme_store.orders) + 5

    faults.set_faults({"list_answer": "empty_page"})
    empty = session.get(api + "/oms/pvt/orders", params=params).json()
    assert empty["list"] == [] and empty["paging"]["total"] == 0
    assert len(session.get(api + "/oms/pvt/orders", params=params).json()["list"]) == 100
    faults.set_faults({"list_answer": "null_list", "list_answer_calls": 2})
    answers = [session.get(api + "/oms/pvt/orders", params=params).json() for _ in range(3)]
    assert [answer["list"] is None for answer in answers] == [True, True, False]
    with pytest.raises(requests.HTTPError):
        faults.set_faults({"list_answer": "garbled"})


def test_faults_never_change_the_truth(faults: SandboxProcess, acme_store: Store) -> None:
    # Runs after the fault tests; admin routes (the export) are never faulted.
    faults.set_faults({"seed": 1, "rate_5xx": 0.5, "rate_truncate": 0.3, "duplicate_pages": True})
    exported = list(faults.export("acme", "orders"))
    assert [row["key"] for row in exported] == acme_store.order_ids()
    for row in exported:
        expected = acme_store.order_document(row["key"])
        served = row["doc"].encode() if isinstance(row["doc"], str) else orjson.dumps(row["doc"])
        assert served == expected
        assert row["malformed"] == acme_store.is_malformed(row["key"])
    customers = {row["key"]: row["doc"] for row in faults.export("acme", "customers")}
    assert customers == {c: acme_store.customer_document(c) for c in acme_store.customer_ids()}
    assert set(next(iter(customers.values()))) == {
        "id",
        "accountId",
        "accountName",
        "dataEntityId",
        "userId",
        "email",
        "firstName",
        "lastName",
        "document",
        "documentType",
        "phone",
        "isNewsletterOptIn",
        "createdIn",
        "updatedIn",
    }
    projected = next(faults.export("acme", "customers", fields=["userId", "email"]))
    full = customers[projected["key"]]
    assert projected["doc"] == {"userId": full["userId"], "email": full["email"]}
    products = [row["doc"] for row in faults.export("acme", "products")]
    assert products == [acme_store.product_document(p) for p in acme_store.product_ids()]
    skus = [int(row["key"]) for row in faults.export("acme", "skus")]
    assert skus == acme_store.sku_ids()


def test_startup_failure_reports_the_subprocess_output() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = SandboxProcess([BETA], port=taken.getsockname()[1], startup_timeout=30)
        with pytest.raises(RuntimeError, match="address already in use"):
            process.start()


def test_serving_rate_is_reported(sandbox: SandboxProcess, acme_store: Store) -> None:
    session, api = vtex_session("acme"), sandbox.account_url("acme") + "/api"
    ids = acme_store.order_ids()
    before = sandbox.stats()
    started = time.perf_counter()
    for order_id in ids[:2000]:
        session.get(f"{api}/oms/pvt/orders/{order_id}").raise_for_status()
    elapsed = time.perf_counter() - started
    stats = sandbox.stats()
    busy = stats["cpu_seconds"] - before["cpu_seconds"]
    print(
        f"\norder detail: {2000 / elapsed:.0f} requests/s sequential (one requests.Session); "
        f"sandbox CPU {busy / 2000 * 1e6:.0f} us/request "
        f"(handlers {(stats['handler_seconds'] - before['handler_seconds']) / 2000 * 1e6:.0f})"
    )
    assert stats["served_total"] - before["served_total"] == 2000
    assert 0 < busy < elapsed * 1.5
    assert stats["accounts"]["acme"]["requests"]["get_order"] >= 2000
    assert 2000 / elapsed > 100
