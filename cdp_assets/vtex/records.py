"""Turning VTEX documents into raw rows, or into rejects with a reason.

Only what landing needs is checked here (the natural key, the change stamp, the types
downstream models rely on); everything else stays in the JSONB payload for dbt to parse.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from cdp_assets.lib.rejects import Reject
from cdp_assets.lib.upsert import Row

# VTEX's instant shape. `datetime.fromisoformat` alone also takes week dates (2025-W01-1),
# comma fractions and non-ASCII digits, which Postgres refuses when staging casts the
# payload's text (`(payload ->> 'updatedIn')::timestamptz`): one such value would fail the
# tenant's whole dbt build.
INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,7})?)?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?"
)
# Real UTC offsets lie within -12:00..+14:00; Postgres refuses anything beyond 15:59.
MAX_OFFSET = timedelta(hours=14)
# A change stamp further ahead of the clock than this is corrupt, and is quarantined rather
# than clamped: stored, it would outrank every later version of the document, since the
# upsert keeps the newest stamp (a full refresh replaces a row whatever its stamp).
FUTURE_TOLERANCE = timedelta(hours=1)
# Amounts in cents: VTEX's are far below this. Larger ones are corrupt data, and staging
# turns cents into numeric(18, 2) units (and sums them per customer), which would overflow.
MAX_CENTS = 10**12
MAX_QUANTITY = 2**31 - 1  # staging casts quantity to integer
# VTEX ids are tens of characters. A key of a few kilobytes would not fit the primary key's
# index and fail the upsert of its whole batch.
MAX_KEY = 256
# The escape `\u0000` (after an even run of backslashes), which jsonb refuses; the text
# "\\u0000" (an escaped backslash, then "u0000") is ordinary and must land.
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# The parts of an order document staging reads (see order_summary).
SUMMARY_OBJECTS = {
    "storePreferencesData": ("currencyCode",),
    "clientProfileData": (
        "userProfileId",
        "email",
        "document",
        "documentType",
        "phone",
        "firstName",
        "lastName",
    ),
}
SUMMARY_ITEM_FIELDS = ("id", "productId", "quantity", "price", "sellingPrice")


class InvalidRecord(ValueError):
    def __init__(self, reason: str, key: str | None = None) -> None:
        super().__init__(reason)
        self.key = key


def parse_timestamp(value: Any, field: str) -> datetime:
    """A VTEX instant (up to 7 fractional digits, `Z` or an offset) as an aware UTC datetime.

    VTEX documents its instants as UTC, so a value without an offset is read as UTC.
    """
    if not isinstance(value, str) or not value:
        raise InvalidRecord(f"{field} is missing or not a string")
    try:
        if not INSTANT.fullmatch(value):
            raise ValueError(value)
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        if abs(moment.utcoffset() or timedelta()) > MAX_OFFSET:
            raise ValueError(value)
        # OverflowError: a valid local time whose UTC instant is outside years 1-9999.
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise InvalidRecord(f"{field} {value[:40]!r} is not an ISO-8601 timestamp") from None


def change_stamp(value: Any, field: str) -> datetime:
    """A document's change stamp: a VTEX instant no further ahead of the clock than
    FUTURE_TOLERANCE."""
    stamp = parse_timestamp(value, field)
    if stamp > datetime.now(UTC) + FUTURE_TOLERANCE:
        raise InvalidRecord(
            f"{field} {value[:40]!r} is in the future (more than {FUTURE_TOLERANCE} ahead)"
        )
    return stamp


def payload_text(raw: bytes) -> str:
    """The JSON text to store; refuses what Postgres jsonb cannot hold."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecord("document is not valid UTF-8") from None
    # The substring test first: the regex alone tries its lookbehind at every character of
    # every document, a large share of an order sync's Python time.
    if "\\u0000" in text and NUL_ESCAPE.search(text):
        raise InvalidRecord("document contains a NUL character (\\u0000), which jsonb rejects")
    return text


def _key(doc: Any, field: str) -> str:
    if not isinstance(doc, dict):
        raise InvalidRecord("document is not a JSON object")
    value = doc.get(field)
    if isinstance(value, bool) or not isinstance(value, str | int) or value in ("", None):
        raise InvalidRecord(f"{field} is missing or not a string/integer")
    key = str(value)
    if len(key) > MAX_KEY:
        raise InvalidRecord(f"{field} is longer than {MAX_KEY} characters", key[:MAX_KEY])
    return key


def _cents(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_CENTS:
        raise InvalidRecord(f"{field} must be an integer amount in cents, got {value!r:.40}")


def _items(items: Any) -> None:
    """The item fields staging casts (quantity to integer, prices to numeric(18, 2))."""
    if not isinstance(items, list):
        raise InvalidRecord("items must be a list")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRecord(f"items[{index}] is not an object")
        quantity = item.get("quantity")
        if quantity is not None and (
            isinstance(quantity, bool)
            or not isinstance(quantity, int)
            or not 0 <= quantity <= MAX_QUANTITY
        ):
            raise InvalidRecord(f"items[{index}].quantity must be a count, got {quantity!r:.40}")
        for field in ("price", "sellingPrice"):
            if item.get(field) is not None:
                _cents(item[field], f"items[{index}].{field}")
        if abs((item.get("sellingPrice") or 0) * (quantity or 0)) > MAX_CENTS:
            raise InvalidRecord(f"items[{index}] line total exceeds {MAX_CENTS} cents")


def _fields(obj: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {}
    return {field: obj[field] for field in fields if obj.get(field) is not None}


def order_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """What staging reads of an order, in the document's own shape (migration 0009): the
    whole document is a large compressed value that each read would decompress."""
    summary = _fields(doc, ("status", "value"))
    for field, fields in SUMMARY_OBJECTS.items():
        if part := _fields(doc.get(field), fields):
            summary[field] = part
    items = doc.get("items")
    if isinstance(items, list):  # the landing refuses other items; positions are kept
        summary["items"] = [_fields(item, SUMMARY_ITEM_FIELDS) for item in items]
    return summary


# (orderId, lastChange, creationDate, summary JSON, payload JSON): the orders table's row.
OrderRow = tuple[str, datetime, datetime, str, str]


def order_row(doc: Any, raw: bytes) -> OrderRow:
    key = _key(doc, "orderId")
    try:
        stamp = change_stamp(doc.get("lastChange"), "lastChange")
        creation = parse_timestamp(doc.get("creationDate"), "creationDate")
        _cents(doc.get("value"), "value")
        _items(doc.get("items"))
        payload = payload_text(raw)
        summary = orjson.dumps(order_summary(doc)).decode()
        return (key, stamp, creation, summary, payload)
    except InvalidRecord as error:
        raise InvalidRecord(str(error), key) from None


def catalog_row(doc: Any, raw: bytes, key_field: str, seen_at: datetime) -> Row:
    """Products and SKUs carry no change stamp: the moment they were read stands in."""
    key = _key(doc, key_field)
    try:
        return (key, seen_at, payload_text(raw))
    except InvalidRecord as error:
        raise InvalidRecord(str(error), key) from None


def customer_row(doc: Any) -> Row:
    key = _key(doc, "id")
    try:
        # Staging casts createdIn too; a malformed one would fail the tenant's dbt build.
        if doc.get("createdIn") is not None:
            parse_timestamp(doc["createdIn"], "createdIn")
        return (
            key,
            change_stamp(doc.get("updatedIn"), "updatedIn"),
            payload_text(orjson.dumps(doc)),
        )
    except InvalidRecord as error:
        raise InvalidRecord(str(error), key) from None


def reject(error: InvalidRecord, raw: bytes | str) -> Reject:
    text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
    return Reject(natural_key=error.key, reason=str(error), raw_text=text)
