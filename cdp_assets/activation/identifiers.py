"""Normalization and hashing of customer identifiers, the one place every destination uses.

Each platform matches on SHA-256 of values normalized its own way, so the rules live here
and the destinations only pick the form they need:

- e-mail: trimmed and lower-cased; Google additionally drops dots and a ``+tag`` from the
  local part of gmail.com / googlemail.com addresses (Data Manager "Format user data").
  VTEX's masked ``@ct.vtex.com.br`` aliases are not identifiers and give nothing;
- phone: parsed with ``phonenumbers`` in the tenant's default country and kept only when
  valid, as E.164. Google hashes it with its ``+``; Meta hashes the digits without it;
- first and last name: lower-cased, punctuation and symbols removed, accents kept as UTF-8
  (transliterating would change the hash the platform computes from its own users);
- country: ISO 3166-1 alpha-2 (codes, alpha-3 codes and English names accepted), hashed
  lower-cased for Meta.

The SDKs' own normalizers are not used: Meta's drops accented letters and turns
"United States" into "un" (see the activation reference notes).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import phonenumbers
import pycountry

EMAIL_SHAPE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
MASKED_EMAIL = re.compile(r"@ct\.vtex\.com\.br$|\.ct\.vtex\.com\.br$")
GMAIL_DOMAINS = frozenset({"gmail.com", "googlemail.com"})
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Contact:
    """One customer's identifiers as the warehouse holds them (any may be missing)."""

    customer_key: str
    email: str | None = None
    phone: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    country: str | None = None


def sha256_hex(value: str) -> str:
    """Lower-case hex SHA-256 of the UTF-8 bytes."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def _hash(value: str | None) -> str:
    return sha256_hex(value) if value else ""


def normalize_email(value: str | None) -> str | None:
    if not value:
        return None
    email = "".join(value.split()).lower()
    if MASKED_EMAIL.search(email) or not EMAIL_SHAPE.match(email):
        return None
    return email


def google_email(value: str | None) -> str | None:
    """The e-mail as Google matches it: gmail local parts lose dots and any ``+tag``."""
    email = normalize_email(value)
    if email is None:
        return None
    local, domain = email.rsplit("@", 1)
    if domain in GMAIL_DOMAINS:
        local = local.split("+", 1)[0].replace(".", "")
        if not local:
            return None
        email = f"{local}@{domain}"
    return email


def normalize_phone(value: str | None, default_country: str) -> str | None:
    """E.164 (``+5521951272727``) of a valid number, national numbers read in the country."""
    if not value:
        return None
    try:
        number = phonenumbers.parse(value, default_country.upper())
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_valid_number(number):
        return None
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


@lru_cache(maxsize=65_536)  # names repeat across customers
def normalize_name(value: str | None) -> str | None:
    if not value:
        return None
    text = unicodedata.normalize("NFC", value).lower()
    kept = "".join(ch for ch in text if unicodedata.category(ch)[0] not in "PS")
    # NFC again: dropping a symbol can leave a letter next to the accent it was separated
    # from ("e!\u0301"), and the platforms hash the composed form ("é").
    return unicodedata.normalize("NFC", " ".join(kept.split())) or None


@lru_cache(maxsize=512)
def normalize_country(value: str | None) -> str | None:
    """ISO 3166-1 alpha-2, upper-case; None for anything that is not a country."""
    if not value or not value.strip():
        return None
    try:
        return pycountry.countries.lookup(value.strip()).alpha_2
    except LookupError:
        return None


def meta_row(contact: Contact, default_country: str) -> list[str]:
    """A row in ``META_SCHEMA`` order: external id in clear, every other key hashed or ""."""
    phone = normalize_phone(contact.phone, default_country)
    country = normalize_country(contact.country) or normalize_country(default_country)
    return [
        contact.customer_key,
        _hash(normalize_email(contact.email)),
        _hash(phone[1:] if phone else None),
        _hash(normalize_name(contact.first_name)),
        _hash(normalize_name(contact.last_name)),
        _hash(country.lower() if country else None),
    ]


META_SCHEMA = ["EXTERN_ID", "EMAIL", "PHONE", "FN", "LN", "COUNTRY"]


def google_row(contact: Contact, default_country: str) -> list[str]:
    """A row in ``GOOGLE_FIELDS`` order: hashed e-mail and E.164 phone (with its ``+``).

    Names are not sent: Google matches an address only with first name, last name, country
    and postal code together, and the warehouse holds no postal code per customer.
    """
    return [
        _hash(google_email(contact.email)),
        _hash(normalize_phone(contact.phone, default_country)),
    ]


GOOGLE_FIELDS = ["email_sha256", "phone_sha256"]


def matchable(row: list[str], hashed_positions: range) -> bool:
    """Whether a row carries at least one hashed identifier a platform can match on."""
    return any(row[i] for i in hashed_positions)
