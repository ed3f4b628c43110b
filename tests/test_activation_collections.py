"""VTEX product collections as an activation platform, against the sandbox's Catalog API:
bodies as the spec requires them, deadlocks, duplicate adds, a lagging listing and 404s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from cdp_assets.activation.destinations import Destination, DestinationAudience
from cdp_assets.activation.sync import AudienceGone
from cdp_assets.sandbox import SandboxProcess, StoreSpec, credentials_for
from cdp_assets.vtex.client import Credentials, VtexClient
from cdp_assets.vtex.collections import VtexCollections

ACCOUNT = "collections"
STORE = StoreSpec(ACCOUNT, seed=41, customers=50, orders=20, products=40)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess([STORE]) as running:
        yield running


@pytest.fixture
def misbehaving(sandbox: SandboxProcess) -> Iterator[SandboxProcess]:
    yield sandbox
    configure(sandbox)


def configure(sandbox: SandboxProcess, **behaviour: float) -> None:
    answer = requests.post(f"{sandbox.base_url}/_sandbox/{ACCOUNT}/collections", json=behaviour)
    answer.raise_for_status()


def collections(sandbox: SandboxProcess) -> VtexCollections:
    client = VtexClient(
        ACCOUNT,
        sandbox.account_url(ACCOUNT),
        Credentials(*credentials_for(ACCOUNT)),
        requests_per_second=5000,
        max_retries=8,
        backoff_base_seconds=0.01,
        backoff_cap_seconds=0.05,
    )
    return VtexCollections(client, writes_per_second=1000)


def target(name: str) -> DestinationAudience:
    destination = Destination(f"{name}_vtex", "shop", "vtex_collections", min_audience_size=1)
    return DestinationAudience(destination, name, {}, None)


def sku_ids(sandbox: SandboxProcess, count: int) -> list[str]:
    return [record["key"] for record in sandbox.export(ACCOUNT, "skus")][:count]


def vtex(sandbox: SandboxProcess, method: str, path: str, **kwargs) -> requests.Response:
    app_key, app_token = credentials_for(ACCOUNT)
    headers = {"X-VTEX-API-AppKey": app_key, "X-VTEX-API-AppToken": app_token}
    return requests.request(
        method, f"{sandbox.account_url(ACCOUNT)}{path}", headers=headers, **kwargs
    )


def listed(sandbox: SandboxProcess, platform_id: str) -> set[str]:
    collection = platform_id.split("/")[0]
    path = f"/api/catalog/pvt/collection/{collection}/products"
    body = vtex(sandbox, "GET", path, params={"pageSize": 1000}).json()
    return {str(row["SkuId"]) for row in body["Data"]}


def test_bodies_missing_a_field_the_spec_requires_are_refused(sandbox) -> None:
    partial = {"Name": "x", "Searchable": False, "Highlight": False}
    answer = vtex(sandbox, "POST", "/api/catalog/pvt/collection", json=partial)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    for field in ("Description", "DateFrom", "DateTo", "TotalProducts", "Type"):
        assert field in message
    platform_id = collections(sandbox).ensure_audience(target("complete"))
    collection, subcollection = platform_id.split("/")
    (sub,) = vtex(sandbox, "GET", f"/api/catalog/pvt/collection/{collection}/subcollection").json()
    assert str(sub["Id"]) == subcollection
    assert (sub["Type"], sub["PreSale"], sub["Release"]) == ("Inclusive", False, False)


def test_a_collection_survives_deadlocks_duplicate_adds_and_a_lagging_listing(
    misbehaving,
) -> None:
    platform = collections(misbehaving)
    platform_id = platform.ensure_audience(target("deadlocks"))
    skus = sku_ids(misbehaving, 30)
    configure(misbehaving, deadlock_rate=0.3, listing_lag_seconds=3600, seed=7)
    first = platform.add(platform_id, [[sku] for sku in skus[:20]])
    assert first.rejected == {}
    assert platform.client.stats.retries > 0  # deadlocks happened, and were retried
    assert listed(misbehaving, platform_id) == set()  # not indexed yet
    # A repair right after: the listing shows nothing, so all 30 are added, 20 twice.
    repaired = platform.replace(platform_id, [[[sku] for sku in skus]])
    assert repaired.rejected == {}
    again = platform.add(platform_id, [[sku] for sku in skus[:5]])  # a batch sent twice
    assert again.rejected == {} and again.requests == 5
    configure(misbehaving)  # the index catches up
    assert listed(misbehaving, platform_id) == set(skus)


def test_a_refused_sku_is_rejected_alone_and_a_deleted_subcollection_is_gone(sandbox) -> None:
    platform = collections(sandbox)
    platform_id = platform.ensure_audience(target("refusals"))
    first, second = sku_ids(sandbox, 2)
    result = platform.add(platform_id, [[first], ["SKU-12"], ["999999999"], [second]])
    assert set(result.rejected) == {1, 2}
    assert "not a number" in result.rejected[1] and "HTTP 400" in result.rejected[2]
    assert listed(sandbox, platform_id) == {first, second}
    replaced = platform.replace(platform_id, [[[first], ["SKU-12"]]])
    assert set(replaced.rejected) == {1}  # its position among the rows sent
    subcollection = platform_id.split("/")[1]
    vtex(sandbox, "DELETE", f"/api/catalog/pvt/subcollection/{subcollection}").raise_for_status()
    with pytest.raises(AudienceGone):
        platform.add(platform_id, [[second]])
