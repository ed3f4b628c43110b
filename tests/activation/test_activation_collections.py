"""VTEX product collections as an activation platform, against the sandbox's Catalog API:
bodies as the spec requires them, deadlocks, duplicate adds, a lagging listing, 404s, and
collections found by name before they are created."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import requests
from support.activation import activation_warehouse, add_tenant_with_customers, register_destination

from cdp_assets.activation.destinations import Destination, DestinationAudience
from cdp_assets.activation.sync import AudienceGone, MemberSource, SyncOptions, sync_audience
from cdp_assets.activation.vtex_collections.client import VtexCollections
from cdp_assets.vtex.client import Credentials, VtexClient
from cdp_devkit.sandbox import SandboxProcess, StoreSpec, credentials_for

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


def configure(sandbox: SandboxProcess, **behaviour: object) -> None:
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


def target(name: str, tenant_id: str = "shop") -> DestinationAudience:
    destination = Destination(f"{name}_vtex", tenant_id, "vtex_collections", min_audience_size=1)
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


def create_collection(sandbox: SandboxProcess, name: str) -> None:
    body = {"Name": name, "Description": "", "Searchable": False, "Highlight": False}
    body |= {"DateFrom": "2030-01-01T00:00:00", "DateTo": "2031-01-01T00:00:00"}
    body |= {"TotalProducts": 0, "Type": "Manual"}
    vtex(sandbox, "POST", "/api/catalog/pvt/collection", json=body).raise_for_status()


def named(sandbox: SandboxProcess, name: str) -> list[dict]:
    """Every collection named exactly `name`, from the search of all collections."""
    path = "/api/catalog_system/pvt/collection/search"
    params = {"page": 1, "pageSize": 3000, "orderByAsc": "true"}
    body = vtex(sandbox, "GET", path, params=params).json()
    return [item for item in body["items"] if item["name"] == name]


def test_the_collection_search_answers_in_the_specs_shape(sandbox) -> None:
    """The shape of "Get all collections" and "Get collections by search terms" in the Catalog
    API spec before their removal (vtex/openapi-schemas, parent of commit e4c7a222)."""
    for i in range(3):
        create_collection(sandbox, f"Summer {i}")
    path = "/api/catalog_system/pvt/collection/search/summer"
    first = vtex(sandbox, "GET", path, params={"pageSize": 2}).json()
    assert first["paging"] == {"page": 1, "perPage": 2, "total": 3, "pages": 2, "limit": 3000}
    assert set(first["items"][0]) == {
        "id",
        "name",
        "searchable",
        "highlight",
        "dateFrom",
        "dateTo",
        "totalSku",
        "totalProducts",
        "type",
        "lastModifiedBy",
    }
    second = vtex(sandbox, "GET", path, params={"page": 2, "pageSize": 2}).json()
    names = [item["name"] for item in first["items"] + second["items"]]
    assert names == ["Summer 0", "Summer 1", "Summer 2"]
    assert vtex(sandbox, "GET", "/api/catalog_system/pvt/collection/search").status_code == 400


def test_a_lost_collection_id_finds_the_collection_by_name_instead_of_a_second_one(
    sandbox,
) -> None:
    """On a later page of the search, among collections whose names share its words; and a
    collection whose subcollection was never created (a create reply lost in between) gets
    one, in it."""
    platform = collections(sandbox)
    for i in range(120):  # more than a page of the client's search
        create_collection(sandbox, f"other {i} (crowded)")
    lost = target("lost", "crowded")
    platform_id = platform.ensure_audience(lost)
    assert platform.ensure_audience(lost) == platform_id
    assert len(named(sandbox, "lost (crowded)")) == 1
    collection = platform_id.split("/")[0]
    path = f"/api/catalog/pvt/collection/{collection}/subcollection"
    assert len(vtex(sandbox, "GET", path).json()) == 1

    half = collections(sandbox).ensure_audience(target("half"))
    half_collection, half_subcollection = half.split("/")
    vtex(sandbox, "DELETE", f"/api/catalog/pvt/subcollection/{half_subcollection}")
    again = platform.ensure_audience(target("half"))
    assert again.split("/")[0] == half_collection and again != half
    assert len(named(sandbox, "half (shop)")) == 1


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with activation_warehouse() as warehouse:
        yield warehouse


def test_a_sku_a_replace_could_not_remove_is_not_confirmed_and_removed_next_time(
    misbehaving, url
) -> None:
    """A 404 on one SKU's removal: recorded as a rejected removal, the SKU kept in the state
    (VTEX still holds it) and no signature stored (the last one forgotten); the next sync
    removes it."""
    platform = collections(misbehaving)
    audience = target("removals", "removals")
    first, second, third = sku_ids(misbehaving, 3)
    with psycopg.connect(url) as conn:
        add_tenant_with_customers(conn, "removals", 1)
        register_destination(conn, audience.destination, "removals")

    def push(skus: list[str], signature: str, **options: bool) -> tuple[dict, set[str]]:
        nonlocal audience
        members = MemberSource(lambda: iter([(sku, sku, [sku]) for sku in skus]))
        with psycopg.connect(url) as conn:
            synced = sync_audience(
                conn, audience, members, platform, SyncOptions(force=True, **options), signature
            )
            held = {
                key
                for (key,) in conn.execute(
                    "SELECT member_key FROM cdp.destination_members"
                    " WHERE destination_id = 'removals_vtex'"
                )
            }
            (platform_id, signature) = conn.execute(
                "SELECT platform_audience_id, synced_signature FROM cdp.destination_audiences"
                " WHERE destination_id = 'removals_vtex'"
            ).fetchone()
            rejects = conn.execute(
                "SELECT j.member_key, j.operation, j.reason FROM cdp.activation_rejects j"
                " JOIN cdp.activation_runs r USING (activation_run_id)"
                " WHERE r.destination_id = 'removals_vtex' ORDER BY activation_run_id"
            ).fetchall()
        audience = DestinationAudience(audience.destination, "removals", {}, platform_id)
        return {"outcome": synced, "signature": signature, "rejects": rejects}, held

    done, held = push([first, second, third], "three")
    assert done["outcome"].status == "synced" and held == {first, second, third}
    configure(misbehaving, refused_skus=[int(third)])
    replaced, held = push([first], "one", full_replace=True)
    assert (replaced["outcome"].status, replaced["outcome"].rejected) == ("synced", 1)
    assert [(key, operation) for key, operation, _ in replaced["rejects"]] == [(third, "remove")]
    assert "HTTP 404" in replaced["rejects"][0][2]
    # Neither signature stands: VTEX holds neither "three" nor "one".
    assert held == {first, third} and replaced["signature"] is None
    assert listed(misbehaving, audience.platform_audience_id) == {first, third}

    configure(misbehaving)
    after, held = push([first], "one")
    assert (after["outcome"].removed, after["outcome"].rejected) == (1, 0)
    assert held == {first} and after["signature"] == "one"
    assert listed(misbehaving, audience.platform_audience_id) == {first}


def test_a_404_on_a_sku_write_rejects_that_sku_alone(misbehaving) -> None:
    platform = collections(misbehaving)
    platform_id = platform.ensure_audience(target("missing"))
    first, second = sku_ids(misbehaving, 2)
    configure(misbehaving, refused_skus=[int(first)])
    result = platform.add(platform_id, [[first], [second]])
    assert list(result.rejected) == [0] and "HTTP 404" in result.rejected[0]
    assert listed(misbehaving, platform_id) == {second}
