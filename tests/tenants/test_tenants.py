import dagster as dg
import pytest

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import (
    Tenant,
    TenantError,
    add_tenant,
    get_tenant,
    list_tenants,
    set_active,
)
from cdp_assets.tenants.sensors import tenant_partitions_sensor


def make(tenant_id: str = "shop_one", **overrides) -> Tenant:
    fields = {"account_name": "shopone", "app_key_ref": "SHOP_KEY", "app_token_ref": "SHOP_TOKEN"}
    return Tenant(tenant_id, **{**fields, **overrides})


@pytest.mark.parametrize(
    ("tenant", "message"),
    [
        (make("Shop-One"), "not a slug"),
        (make("a|b"), "not a slug"),
        (make("x"), "not a slug"),
        (make("shop'; DROP TABLE cdp.tenants; --"), "not a slug"),
        (make("../etc/passwd"), "not a slug"),
        (make("s" * 200), "not a slug"),
        (make(account_name="Bad Account"), "not a VTEX account name"),
        (make(app_key_ref=""), "app key reference is missing"),
        (make(app_token_ref="token value with spaces"), "not an environment variable name"),
        (make(environment="example.com"), "environment must be one of"),
        (make(default_country="Brazil"), "alpha-2"),
    ],
)
def test_invalid_tenants_are_refused_with_a_clear_message(tenant, message):
    with pytest.raises(TenantError, match=message):
        tenant.validate()


def test_invalid_tenant_never_reaches_the_table(conn):
    with pytest.raises(TenantError):
        add_tenant(conn, make("Bad Slug"))
    assert (
        conn.execute("SELECT count(*) FROM cdp.tenants WHERE tenant_id = 'Bad Slug'").fetchone()[0]
        == 0
    )


def test_credentials_resolve_from_the_environment_and_never_print(monkeypatch):
    tenant = make()
    monkeypatch.delenv("SHOP_KEY", raising=False)
    monkeypatch.setenv("SHOP_TOKEN", "s3cr3t-token-value")
    with pytest.raises(TenantError, match="SHOP_KEY") as refused:
        tenant.credentials()
    assert "s3cr3t" not in str(refused.value)
    monkeypatch.setenv("SHOP_KEY", "vtexappkey-shop-XYZ")
    credentials = tenant.credentials()
    assert credentials.app_token == "s3cr3t-token-value"
    assert "s3cr3t" not in repr(credentials) and "s3cr3t" not in repr(tenant)


def test_add_list_deactivate(conn):
    add_tenant(conn, make("reg_one", priority=5))
    add_tenant(conn, make("reg_two", priority=1))
    ids = [t.tenant_id for t in list_tenants(conn) if t.tenant_id.startswith("reg_")]
    assert ids == ["reg_two", "reg_one"]  # priority order
    set_active(conn, "reg_one", False)
    with pytest.raises(TenantError, match="deactivated"):
        get_tenant(conn, "reg_one")
    with pytest.raises(TenantError, match="no tenant"):
        set_active(conn, "reg_missing", True)


def test_sensor_adds_and_removes_tenant_partitions(conn, instance):
    for tenant_id in ("sensed_a", "sensed_b"):
        add_tenant(conn, make(tenant_id))
    conn.commit()
    resources = {"warehouse": WarehouseResource()}

    def tick() -> dg.SensorResult | dg.SkipReason:
        context = dg.build_sensor_context(instance=instance, resources=resources)
        result = tenant_partitions_sensor(context)
        # Applying the requests is the daemon's job; a direct call only returns them.
        if isinstance(result, dg.SensorResult):
            for request in result.dynamic_partitions_requests:
                if isinstance(request, dg.AddDynamicPartitionsRequest):
                    instance.add_dynamic_partitions(tenants.name, list(request.partition_keys))
                else:
                    for key in request.partition_keys:
                        instance.delete_dynamic_partition(tenants.name, key)
        return result

    tick()
    assert {"sensed_a", "sensed_b"} <= set(instance.get_dynamic_partitions(tenants.name))
    assert isinstance(tick(), dg.SkipReason)  # nothing changed

    set_active(conn, "sensed_a", False)
    conn.commit()
    result = tick()
    assert isinstance(result, dg.SensorResult)
    current = set(instance.get_dynamic_partitions(tenants.name))
    assert "sensed_a" not in current and "sensed_b" in current
