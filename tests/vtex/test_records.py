from datetime import UTC, datetime, timedelta

import orjson
import pytest

from cdp_assets.vtex.records import (
    InvalidRecord,
    customer_row,
    order_row,
    order_summary,
    parse_timestamp,
)


def test_vtex_timestamps_with_seven_fractional_digits_and_offsets():
    assert parse_timestamp("2024-02-06T20:46:11.7010747+00:00", "x") == datetime(
        2024, 2, 6, 20, 46, 11, 701074, tzinfo=UTC
    )
    assert parse_timestamp("2019-08-12T20:54:23.7153839Z", "x") == datetime(
        2019, 8, 12, 20, 54, 23, 715383, tzinfo=UTC
    )
    assert parse_timestamp("2024-02-06T17:46:11-03:00", "x") == datetime(
        2024, 2, 6, 20, 46, 11, tzinfo=UTC
    )
    # VTEX instants are UTC: a value without an offset is read as UTC.
    assert parse_timestamp("2024-02-06T20:46:11", "x").tzinfo == UTC


@pytest.mark.parametrize("value", [None, "", "yesterday", 1707252371, "2024-13-01T00:00:00Z"])
def test_bad_timestamps_are_refused_with_the_field_name(value):
    with pytest.raises(InvalidRecord, match="lastChange"):
        parse_timestamp(value, "lastChange")


GOOD = {
    "orderId": "1-01",
    "lastChange": "2024-02-06T20:46:11.7010747+00:00",
    "creationDate": "2024-02-06T20:00:00.0000000+00:00",
    "value": 1990,
    "items": [],
}


def test_a_good_order_becomes_a_row():
    raw = orjson.dumps(GOOD)
    key, stamp, created, summary, payload = order_row(GOOD, raw)
    assert key == "1-01" and stamp.microsecond == 701074 and created.hour == 20
    assert orjson.loads(summary) == {"value": 1990, "items": []}
    assert orjson.loads(payload) == GOOD


def test_an_order_summary_keeps_what_staging_reads_in_the_documents_shape():
    profile = {
        "email": "7d1c@ct.vtex.com.br",
        "userProfileId": "u-1",
        "document": "123.456.789-09",
        "documentType": "cpf",
        "phone": None,
        "firstName": "Ana",
        "lastName": "Lima",
        "corporateName": None,
        "isCorporate": False,
    }
    item = {"id": "7", "productId": "3", "quantity": 2, "price": 1000, "sellingPrice": 995}
    doc = {
        **GOOD,
        "status": "invoiced",
        "storePreferencesData": {"currencyCode": "BRL", "timeZone": "E. South America"},
        "clientProfileData": profile,
        "items": [
            {**item, "name": "Shirt", "imageUrl": "https://x/1.jpg"},
            {**item, "id": "8", "quantity": 1, "price": None},
        ],
        "shippingData": {"address": {"street": "Rua A"}},
    }
    _, _, _, summary, _ = order_row(doc, orjson.dumps(doc))
    # Nulls and absent keys are left out; staging reads both as NULL.
    assert orjson.loads(summary) == {
        "status": "invoiced",
        "value": 1990,
        "storePreferencesData": {"currencyCode": "BRL"},
        "clientProfileData": {
            "email": "7d1c@ct.vtex.com.br",
            "userProfileId": "u-1",
            "document": "123.456.789-09",
            "documentType": "cpf",
            "firstName": "Ana",
            "lastName": "Lima",
        },
        "items": [item, {"id": "8", "productId": "3", "quantity": 1, "sellingPrice": 995}],
    }
    # A part that is not an object (VTEX sends none such, but the landing keeps the order).
    odd = {**GOOD, "clientProfileData": "n/a", "storePreferencesData": None}
    assert orjson.loads(order_row(odd, orjson.dumps(odd))[3]) == {"value": 1990, "items": []}
    # Called on a document the landing would refuse, it still answers (items left out).
    assert order_summary({"items": "n/a", "status": "x"}) == {"status": "x"}


@pytest.mark.parametrize(
    ("change", "reason", "key"),
    [
        ({"orderId": None}, "orderId", None),
        ({"lastChange": None}, "lastChange", "1-01"),
        ({"value": "19.90"}, "value", "1-01"),
        ({"value": True}, "value", "1-01"),
        ({"items": None}, "items", "1-01"),
    ],
)
def test_malformed_orders_are_refused_with_reason_and_key(change, reason, key):
    doc = {**GOOD, **change}
    with pytest.raises(InvalidRecord, match=reason) as caught:
        order_row(doc, orjson.dumps(doc))
    assert caught.value.key == key


def test_a_nul_character_is_refused_before_it_reaches_jsonb():
    doc = {**GOOD, "note": "a\x00b"}
    with pytest.raises(InvalidRecord, match="NUL"):
        order_row(doc, orjson.dumps(doc))


def test_customers_need_an_id_and_updated_in():
    with pytest.raises(InvalidRecord, match="updatedIn"):
        customer_row({"id": "c1", "email": "a@b.com"})
    key, stamp, payload = customer_row({"id": "c1", "updatedIn": "2024-01-01T00:00:00Z"})
    assert key == "c1" and stamp.year == 2024


def test_a_change_stamp_far_in_the_future_is_refused():
    """Stored, it would outrank every later version of the document."""
    ahead = datetime.now(UTC) + timedelta(minutes=10)  # clocks differ a little
    assert order_row({**GOOD, "lastChange": ahead.isoformat()}, b"{}")[1] == ahead
    for doc, row in (
        ({**GOOD, "lastChange": "9999-12-31T23:59:59.9999999+00:00"}, order_row),
        ({"id": "c-1", "updatedIn": "2999-01-01T00:00:00Z"}, lambda d, _: customer_row(d)),
    ):
        with pytest.raises(InvalidRecord, match="in the future"):
            row(doc, orjson.dumps(doc))
