"""Tenant isolation: three tenants whose stores share customers' e-mails, CPFs, phones and VTEX
user ids, SKU and product ids, and even order ids (see shared_tenants.py), run through the
whole platform. Nothing of one tenant may derive from another tenant's data: no staging
row, identity record or link, customer, segment, prediction, audience member, pushed hash
or collection SKU.

Each check is a query counting the rows that break it (joined on everything but the
tenant, which is exactly the mistake that would let data cross).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from shared_tenants import (
    GOOGLE_CUSTOMERS,
    SOURCE,
    STORES,
    Pipeline,
    shared_customer_keys,
    shared_pipeline,
)

from cdp_assets.activation.identifiers import Contact, google_row, meta_row
from cdp_assets.analytics.jobs import ANALYTICS_JOB
from cdp_assets.definitions import defs

TENANTS = list(STORES)

# name -> SQL counting violations among the test's tenants (%(t)s).
VIOLATIONS = {
    "staging order not from its tenant's raw order": """
        SELECT count(*) FROM staging.stg_vtex__orders s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM raw_vtex.orders r
                WHERE r.tenant_id = s.tenant_id AND r.order_id = s.order_id
                  AND (r.payload ->> 'value')::numeric / 100 = s.order_total
                  AND r.payload -> 'clientProfileData' ->> 'document'
                      IS NOT DISTINCT FROM s.document
                  AND r.payload -> 'clientProfileData' ->> 'userProfileId'
                      IS NOT DISTINCT FROM s.user_profile_id)""",
    "staging order item not from its tenant's order": """
        SELECT count(*) FROM staging.stg_vtex__order_items s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM raw_vtex.orders r
                WHERE r.tenant_id = s.tenant_id AND r.order_id = s.order_id
                  AND r.payload -> 'items' -> s.item_index ->> 'id' = s.sku_id
                  AND (r.payload -> 'items' -> s.item_index ->> 'quantity')::int = s.quantity)""",
    "staging SKU not from its tenant's SKU": """
        SELECT count(*) FROM staging.stg_vtex__skus s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM raw_vtex.skus r
                WHERE r.tenant_id = s.tenant_id AND r.sku_id = s.sku_id
                  AND r.payload ->> 'ProductId' = s.product_id
                  AND r.payload ->> 'SkuName' = s.sku_name)""",
    "staging product not from its tenant's product": """
        SELECT count(*) FROM staging.stg_vtex__products s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM raw_vtex.products r
                WHERE r.tenant_id = s.tenant_id AND r.product_id = s.product_id
                  AND r.payload ->> 'Name' = s.product_name)""",
    "staging customer not from its tenant's CL document": """
        SELECT count(*) FROM staging.stg_vtex__customers s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM raw_vtex.customers r
                WHERE r.tenant_id = s.tenant_id AND r.customer_id = s.customer_id
                  AND r.payload ->> 'email' = s.email_raw
                  AND r.payload ->> 'document' = s.document)""",
    "identity record without a source in its tenant": """
        SELECT count(*) FROM intermediate.int_identity__records i
         WHERE i.tenant_id = ANY(%(t)s) AND NOT CASE i.record_source
               WHEN 'master_data' THEN EXISTS (
                   SELECT 1 FROM raw_vtex.customers r
                    WHERE r.tenant_id = i.tenant_id AND r.customer_id = i.source_id
                      AND r.payload ->> 'email' IS NOT DISTINCT FROM i.email_raw)
               ELSE EXISTS (
                   SELECT 1 FROM raw_vtex.orders r
                    WHERE r.tenant_id = i.tenant_id
                      AND i.source_id IN (r.order_id,
                                          r.payload -> 'clientProfileData' ->> 'userProfileId'))
               END""",
    "identity link across tenants (a customer key in two tenants)": """
        SELECT count(*) FROM (
            SELECT customer_key FROM intermediate.int_identity__customer_keys
             GROUP BY customer_key HAVING count(DISTINCT tenant_id) > 1) shared""",
    "identity link to a record of another tenant": """
        SELECT count(*) FROM intermediate.int_identity__customer_keys k
         WHERE k.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM intermediate.int_identity__records i
                WHERE i.tenant_id = k.tenant_id AND i.record_id = k.record_id)""",
    "purchase of an order or customer of another tenant": """
        SELECT count(*) FROM intermediate.int_orders__purchases p
         WHERE p.tenant_id = ANY(%(t)s) AND (
               NOT EXISTS (SELECT 1 FROM raw_vtex.orders r
                            WHERE r.tenant_id = p.tenant_id AND r.order_id = p.order_id)
            OR NOT EXISTS (SELECT 1 FROM intermediate.int_identity__customer_keys k
                            WHERE k.tenant_id = p.tenant_id
                              AND k.customer_key = p.customer_key))""",
    "customer whose contact data comes from another tenant": """
        SELECT count(*) FROM marts.customers c
         WHERE c.tenant_id = ANY(%(t)s) AND (
               (c.email IS NOT NULL AND NOT EXISTS (
                    SELECT 1 FROM intermediate.int_identity__customer_keys k
                      JOIN intermediate.int_identity__records i USING (tenant_id, record_id)
                     WHERE k.tenant_id = c.tenant_id AND k.customer_key = c.customer_key
                       AND i.email_normalized = c.email))
            OR (c.phone_e164 IS NOT NULL AND NOT EXISTS (
                    SELECT 1 FROM intermediate.int_identity__customer_keys k
                      JOIN intermediate.int_identity__records i USING (tenant_id, record_id)
                     WHERE k.tenant_id = c.tenant_id AND k.customer_key = c.customer_key
                       AND i.phone_e164 = c.phone_e164))
            OR (c.document IS NOT NULL AND NOT EXISTS (
                    SELECT 1 FROM intermediate.int_identity__customer_keys k
                      JOIN intermediate.int_identity__records i USING (tenant_id, record_id)
                     WHERE k.tenant_id = c.tenant_id AND k.customer_key = c.customer_key
                       AND i.document_normalized = c.document)))""",
    "customer revenue not from its tenant's purchases": """
        SELECT count(*) FROM marts.customers c
         WHERE c.tenant_id = ANY(%(t)s) AND c.revenue IS DISTINCT FROM (
               SELECT sum(p.order_total) FROM intermediate.int_orders__purchases p
                WHERE p.tenant_id = c.tenant_id AND p.customer_key = c.customer_key
                  AND p.is_purchase AND p.order_date <= current_date)""",
    "segment of a customer of another tenant": """
        SELECT count(*) FROM marts.rfm_segments s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM marts.customers c
                WHERE c.tenant_id = s.tenant_id AND c.customer_key = s.customer_key)""",
    "churn risk of a customer of another tenant": """
        SELECT count(*) FROM marts.churn_risk s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM marts.customers c
                WHERE c.tenant_id = s.tenant_id AND c.customer_key = s.customer_key)""",
    "prediction for a customer of another tenant": """
        SELECT count(*) FROM analytics_python.customer_predictions s
         WHERE s.tenant_id = ANY(%(t)s) AND NOT EXISTS (
               SELECT 1 FROM intermediate.int_customers__purchase_summary c
                WHERE c.tenant_id = s.tenant_id AND c.customer_key = s.customer_key
                  AND c.frequency_x = s.frequency_x)""",
}
# name -> SQL counting rows present twice (one per tenant and key expected).
DUPLICATES = {
    "staging orders": "SELECT tenant_id, order_id FROM staging.stg_vtex__orders",
    "staging SKUs": "SELECT tenant_id, sku_id FROM staging.stg_vtex__skus",
    "staging customers": "SELECT tenant_id, customer_id FROM staging.stg_vtex__customers",
    "customers": "SELECT tenant_id, customer_key FROM marts.customers",
    "predictions": "SELECT tenant_id, customer_key FROM analytics_python.customer_predictions",
}


def count(conn: psycopg.Connection, query: str, *params) -> int:
    return int(conn.execute(query, params or {"t": TENANTS}).fetchone()[0])


@pytest.fixture(scope="module")
def pipeline(warehouse_url, instance) -> Pipeline:
    return shared_pipeline(warehouse_url, instance)


@pytest.fixture(scope="module")
def totals(pipeline, warehouse_url, reliability_report, request) -> Iterator[dict[str, int]]:
    """The counts every test adds to, recorded as one row when the module is done; the
    scenario fails when any of its tests did."""
    failed_before = request.session.testsfailed
    totals = {"checked": 0, "lost": 0, "duplicates": 0}
    yield totals
    with psycopg.connect(warehouse_url) as conn:
        shared = {
            table: count(
                conn,
                f"SELECT count(*) FROM (SELECT {key} FROM raw_vtex.{table}"
                f" WHERE tenant_id = ANY(%s) GROUP BY 1 HAVING count(*) > 1) s",
                TENANTS,
            )
            for table, key in (("skus", "sku_id"), ("orders", "order_id"))
        }
    people = sum(len(p) for t, p in pipeline.crafted.items() if t != SOURCE)
    reliability_report.record(
        "tenant isolation: 3 tenants sharing people, SKU and order ids",
        faults=f"{people} shared identities, {shared['skus']} SKU ids and"
        f" {shared['orders']} order ids in several tenants",
        checked=totals["checked"],
        lost=totals["lost"],
        duplicates=totals["duplicates"],
        passed=request.session.testsfailed == failed_before,
    )


def test_the_tenants_really_share_people_and_ids(pipeline, conn, totals):
    """Without overlap the other tests would prove nothing."""
    shared_skus = count(
        conn,
        "SELECT count(*) FROM raw_vtex.skus a JOIN raw_vtex.skus b USING (sku_id)"
        " WHERE a.tenant_id = %s AND b.tenant_id = %s",
        "iso_a",
        "iso_b",
    )
    reused_order_ids = count(
        conn,
        "SELECT count(*) FROM raw_vtex.orders a JOIN raw_vtex.orders b USING (order_id)"
        " WHERE a.tenant_id = %s AND b.tenant_id = %s",
        "iso_a",
        "iso_b",
    )
    assert shared_skus >= 10 and reused_order_ids >= 10
    for tenant_id in ("iso_b", "iso_c"):
        keys = shared_customer_keys(conn, tenant_id, pipeline.crafted[tenant_id])
        # Each crafted person bought, so is a customer of this tenant too.
        customers = count(
            conn,
            "SELECT count(*) FROM marts.customers WHERE tenant_id = %s AND customer_key = ANY(%s)",
            tenant_id,
            keys,
        )
        assert customers >= len(pipeline.crafted[tenant_id]) // 2, (tenant_id, customers)
        # ... and the very identities are customers of A as well, under A's own keys.
        in_source = shared_customer_keys(conn, SOURCE, pipeline.crafted[tenant_id])
        assert in_source and not set(in_source) & set(keys)
    totals["checked"] += shared_skus + reused_order_ids


@pytest.mark.parametrize("violation", list(VIOLATIONS))
def test_nothing_derives_from_another_tenants_data(pipeline, conn, totals, violation):
    found = count(conn, VIOLATIONS[violation])
    assert found == 0, f"{found} rows: {violation}"


def test_every_relation_was_checked_on_real_rows(pipeline, conn, totals):
    """The violation queries above count over these rows: none of them may be empty."""
    relations = [
        "staging.stg_vtex__orders",
        "staging.stg_vtex__order_items",
        "staging.stg_vtex__skus",
        "staging.stg_vtex__products",
        "staging.stg_vtex__customers",
        "intermediate.int_identity__records",
        "intermediate.int_identity__customer_keys",
        "intermediate.int_orders__purchases",
        "marts.customers",
        "marts.rfm_segments",
        "marts.churn_risk",
        "analytics_python.customer_predictions",
    ]
    for relation in relations:
        for tenant_id in TENANTS:
            rows = count(conn, f"SELECT count(*) FROM {relation} WHERE tenant_id = %s", tenant_id)
            assert rows > 0, (relation, tenant_id)
            totals["checked"] += rows


def test_no_row_is_duplicated(pipeline, conn, totals):
    for name, query in DUPLICATES.items():
        extra = count(
            conn,
            f"SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM ({query})"
            " AS q (tenant_id, key) WHERE tenant_id = ANY(%(t)s) GROUP BY tenant_id, key) k",
        )
        totals["duplicates"] += extra
        assert extra == 0, name


def test_audience_members_are_their_tenants_customers(pipeline, conn, totals):
    audiences = [
        name
        for (name,) in conn.execute(
            "SELECT DISTINCT audience FROM audiences.audience_catalog WHERE tenant_id = ANY(%s)",
            (TENANTS,),
        )
    ]
    assert len(audiences) >= 10
    for audience in audiences:
        members, foreign = conn.execute(
            f"""
            SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (
                   SELECT 1 FROM marts.customers c
                    WHERE c.tenant_id = a.tenant_id AND c.customer_key = a.customer_key
                      AND encode(sha256(convert_to(c.email, 'UTF8')), 'hex')
                          IS NOT DISTINCT FROM a.email_sha256
                      AND encode(sha256(convert_to(c.phone_e164, 'UTF8')), 'hex')
                          IS NOT DISTINCT FROM a.phone_sha256))
              FROM audiences.{audience} a WHERE a.tenant_id = ANY(%s)
            """,
            (TENANTS,),
        ).fetchone()
        totals["checked"] += members
        assert foreign == 0, audience


def test_each_meta_destination_received_only_its_tenants_customers(pipeline, conn, totals):
    """Every row a tenant's ad account holds is one of that tenant's audience members,
    hashed from that tenant's own customer record; and every matchable member got there."""
    for tenant_id in TENANTS:
        audience = pipeline.audiences[tenant_id]
        expected = {}
        for key, email, phone, first, last, country in conn.execute(
            f"SELECT c.customer_key, c.email, c.phone_e164, c.first_name, c.last_name, c.country"
            f" FROM audiences.{audience} a JOIN marts.customers c USING (tenant_id, customer_key)"
            " WHERE a.tenant_id = %s",
            (tenant_id,),
        ):
            row = meta_row(Contact(key, email, phone, first, last, country), "BR")
            if any(row[1:3]):  # matchable on e-mail or phone
                expected[key] = row
        pushed = pipeline.meta_members[tenant_id]
        received = {member["EXTERN_ID"]: member for member in pushed}
        totals["checked"] += len(pushed)
        totals["duplicates"] += len(pushed) - len(received)
        totals["lost"] += len(set(expected) - set(received))
        assert len(received) == len(pushed) and set(received) == set(expected), tenant_id
        shared = set(shared_customer_keys(conn, tenant_id, pipeline.crafted[tenant_id]))
        assert shared & set(received), f"{tenant_id}: no shared-identity customer was pushed"
        for key, member in received.items():
            assert member.get("EMAIL", "") == expected[key][1], (tenant_id, key)
            assert member.get("PHONE", "") == expected[key][2], (tenant_id, key)


def test_google_lists_hold_only_their_tenants_customers(pipeline, conn, totals):
    for tenant_id, account in GOOGLE_CUSTOMERS.items():
        audience = pipeline.audiences[tenant_id]
        allowed = set()
        for key, email, phone in conn.execute(
            f"SELECT c.customer_key, c.email, c.phone_e164 FROM audiences.{audience} a"
            " JOIN marts.customers c USING (tenant_id, customer_key) WHERE a.tenant_id = %s",
            (tenant_id,),
        ):
            email_hash, phone_hash = google_row(Contact(key, email, phone), "BR")
            allowed |= {f"email:{email_hash}", f"phone:{phone_hash}"}
        members = pipeline.google_members[account]
        totals["checked"] += len(members)
        assert members and members <= allowed, tenant_id


def test_collections_hold_skus_bought_by_their_tenants_audience(pipeline, conn, totals):
    audience = pipeline.audiences[SOURCE]
    skus = {
        key
        for (key,) in conn.execute(
            "SELECT member_key FROM cdp.destination_members WHERE destination_id = 'iso_a_vtex'"
        )
    }
    bought = {
        sku
        for (sku,) in conn.execute(
            f"""
        SELECT DISTINCT i.sku_id FROM staging.stg_vtex__order_items i
          JOIN intermediate.int_orders__purchases p USING (tenant_id, order_id)
          JOIN audiences.{audience} a USING (tenant_id, customer_key)
         WHERE i.tenant_id = %s AND p.is_purchase
        """,
            (SOURCE,),
        )
    }
    totals["checked"] += len(skus)
    assert skus and skus <= bought


FINGERPRINT = """
SELECT md5(concat_ws('|',
    (SELECT string_agg(c::text, ',' ORDER BY customer_key) FROM marts.customers c
      WHERE tenant_id = %(tenant)s),
    (SELECT string_agg(s::text, ',' ORDER BY customer_key) FROM marts.rfm_segments s
      WHERE tenant_id = %(tenant)s),
    (SELECT string_agg(k::text, ',' ORDER BY record_id)
       FROM intermediate.int_identity__customer_keys k WHERE tenant_id = %(tenant)s),
    (SELECT string_agg(concat_ws(':', customer_key, frequency_x, round(p_alive::numeric, 6),
                                 clv_1y), ',' ORDER BY customer_key)
       FROM analytics_python.customer_predictions WHERE tenant_id = %(tenant)s)))
"""


@pytest.mark.long
def test_a_tenants_results_do_not_move_when_another_tenants_data_does(
    pipeline, conn, instance, totals
):
    """The counterfactual: change A's shared customers (new e-mails, CPFs and phones, their
    orders gone), rebuild B; B's customers, segments, identity links and predictions are
    exactly what they were. Last in the module: it changes A."""
    tenant_id = "iso_b"
    before = conn.execute(FINGERPRINT, {"tenant": tenant_id}).fetchone()[0]
    users = [user for *_, user in pipeline.crafted[SOURCE]]
    changed = conn.execute(
        """
        UPDATE raw_vtex.customers SET payload = payload
               || jsonb_build_object('email', 'moved.' || customer_id || '@example.net',
                                     'document', '00000000191', 'phone', '+5511911112222')
         WHERE tenant_id = %s AND payload ->> 'userId' = ANY(%s)
        """,
        (SOURCE, users),
    ).rowcount
    deleted = conn.execute(
        "DELETE FROM raw_vtex.orders WHERE tenant_id = %s"
        " AND payload -> 'clientProfileData' ->> 'userProfileId' = ANY(%s)",
        (SOURCE, users),
    ).rowcount
    conn.commit()
    assert changed == len(users) and deleted > 0
    result = defs.resolve_job_def(ANALYTICS_JOB).execute_in_process(
        instance=instance, partition_key=tenant_id
    )
    assert result.success
    after = conn.execute(FINGERPRINT, {"tenant": tenant_id}).fetchone()[0]
    totals["checked"] += changed + deleted
    assert after == before
