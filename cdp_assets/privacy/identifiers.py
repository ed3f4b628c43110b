"""The identifiers a privacy request names a person by, normalized as identity resolution
and activation normalize them, and the SHA-256 the platform keeps of them instead."""

from __future__ import annotations

import re

from cdp_assets.activation.identifiers import normalize_email, normalize_phone, sha256_hex

KINDS = ("email", "phone", "document")


class IdentifierError(ValueError):
    """An identifier that normalizes to nothing usable, with a message for the operator."""


def normalize_document(value: str | None) -> str | None:
    """Digits only; empty or all zeros (a placeholder) is none (dbt macro normalize_document)."""
    digits = re.sub(r"[^0-9]", "", value or "")
    return digits if digits.strip("0") else None


def normalized(kind: str, value: str, default_country: str) -> str:
    """`value` as the warehouse keys it: e-mail trimmed and lower-cased, phone E.164 read in
    the tenant's country, document digits."""
    if kind == "email":
        result = normalize_email(value)
    elif kind == "phone":
        result = normalize_phone(value, default_country)
    elif kind == "document":
        result = normalize_document(value)
    else:
        raise IdentifierError(f"an identifier is one of {', '.join(KINDS)}, not {kind!r}")
    if result is None:
        raise IdentifierError(f"the {kind} given is not a usable {kind} once normalized")
    return result


def hashed(kind: str, value: str, default_country: str) -> str:
    return sha256_hex(normalized(kind, value, default_country))
