"""Turning VTEX documents into raw rows, or into rejects with a reason.

Only what landing needs is checked here (the natural key, the change stamp, the types
downstream models rely on); everything else stays in the JSONB payload for dbt to parse.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from cdp_assets.lib.rejects import Reject
from cdp_assets.lib.upsert import Row


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
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRecord(f"{field} {value[:40]!r} is not an ISO-8601 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def payload_text(raw: bytes) -> str:
    """The JSON text to store; refuses what Postgres jsonb cannot hold."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecord("document is not valid UTF-8") from None
    if "\\u0000" in text:
        raise InvalidRecord("document contains a NUL character (\\u0000), which jsonb rejects")
    return text


def _key(doc: Any, field: str) -> str:
    if not isinstance(doc, dict):
        raise InvalidRecord("document is not a JSON object")
    value = doc.get(field)
    if isinstance(value, bool) or not isinstance(value, str | int) or value in ("", None):
        raise InvalidRecord(f"{field} is missing or not a string/integer")
    return str(value)


def _integer(doc: dict, field: str, key: str) -> None:
    value = doc.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRecord(f"{field} must be an integer amount in cents, got {value!r:.40}", key)


def order_row(doc: Any, raw: bytes) -> Row:
    key = _key(doc, "orderId")
    try:
        change_stamp = parse_timestamp(doc.get("lastChange"), "lastChange")
        creation = parse_timestamp(doc.get("creationDate"), "creationDate")
        _integer(doc, "value", key)
        if not isinstance(doc.get("items"), list):
            raise InvalidRecord("items must be a list")
        return (key, change_stamp, creation, payload_text(raw))
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
        return (
            key,
            parse_timestamp(doc.get("updatedIn"), "updatedIn"),
            payload_text(orjson.dumps(doc)),
        )
    except InvalidRecord as error:
        raise InvalidRecord(str(error), key) from None


def reject(error: InvalidRecord, raw: bytes | str) -> Reject:
    text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
    return Reject(natural_key=error.key, reason=str(error), raw_text=text)
