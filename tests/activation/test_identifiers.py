"""Normalization and hashing vectors, per rule and per platform form."""

import hashlib

import pytest

from cdp_assets.activation.identifiers import (
    META_SCHEMA,
    Contact,
    google_email,
    google_row,
    meta_row,
    normalize_country,
    normalize_email,
    normalize_name,
    normalize_phone,
    sha256_hex,
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_meta_documented_vectors() -> None:
    # Meta's own examples for EMAIL and PHONE (country code, digits only).
    assert (
        sha256_hex(normalize_email("  Mary@Example.COM\t"))
        == "f1904cf1a9d73a55fa5de0ac823c4403ded71afd4c3248d00bdcd0866552bb79"
    )
    assert sha256_hex("15559876543") == (
        "1ef970831d7963307784fa8688e8fce101a15685d62aa765fed23f3a2c576a4e"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Ana.Souza@Loja.COM.br ", "ana.souza@loja.com.br"),
        ("ANA+promo@example.com", "ana+promo@example.com"),  # '+' kept outside gmail
        ("a n a@example.com", "ana@example.com"),  # stray inner whitespace
        ("4f1a2b3c4d5e6f708192a3b4c5d6e7f8@ct.vtex.com.br", None),  # masked alias
        ("ana@example.com-12ab34b.ct.vtex.com.br", None),  # soft mask is resolved upstream
        ("not-an-email", None),
        ("", None),
        (None, None),
    ],
)
def test_email(raw: str | None, expected: str | None) -> None:
    assert normalize_email(raw) == expected


def test_google_canonicalizes_gmail_only() -> None:
    assert google_email(" Cloudy.SanFrancisco+shopping@GMAIL.com") == "cloudysanfrancisco@gmail.com"
    assert google_email("j.doe+x@googlemail.com") == "jdoe@googlemail.com"
    assert google_email("user.name+nyc@example.com") == "user.name+nyc@example.com"


@pytest.mark.parametrize(
    ("raw", "country", "expected"),
    [
        ("(21) 95127-2727", "BR", "+5521951272727"),
        ("021 95127-2727", "BR", "+5521951272727"),  # trunk zero
        ("+55 21 95127-2727", "AR", "+5521951272727"),  # '+' wins over the default country
        ("0055 21 95127-2727", "AR", "+5521951272727"),  # dialled abroad with "00"
        ("11 3456-7890", "BR", "+551134567890"),  # landline
        ("011 15-2345-6789", "AR", "+5491123456789"),  # Argentine mobile national format
        ("(650) 253-0000", "US", "+16502530000"),
        ("12345", "BR", None),  # too short to be a number
        ("+1 555 987 6543", "US", None),  # 555 numbers are fictional: never valid
        ("call me", "BR", None),
        (None, "BR", None),
    ],
)
def test_phone_e164(raw: str | None, country: str, expected: str | None) -> None:
    assert normalize_phone(raw, country) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  JOÃO  ", "joão"),
        ("Émilie-Anne", "émilieanne"),
        ("O'Brien.", "obrien"),
        ("María  José", "maría josé"),
        ("Ãngela", "ãngela"),
        ("\u0041\u0301na", "\u00e1na"),  # decomposed accent composes (NFC) before hashing
        ("...", None),
    ],
)
def test_name_keeps_accents(raw: str, expected: str | None) -> None:
    assert normalize_name(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("br", "BR"), (" BRA ", "BR"), ("Brazil", "BR"), ("United States", "US"), ("Atlantis", None)],
)
def test_country_alpha2(raw: str, expected: str | None) -> None:
    assert normalize_country(raw) == expected


def test_meta_row_is_hashed_except_external_id() -> None:
    contact = Contact("cust-1", " Ana@Example.com", "(21) 95127-2727", "Ána", "Souza", "Brasil")
    row = meta_row(contact, "BR")
    assert len(row) == len(META_SCHEMA)
    assert row == [
        "cust-1",
        sha("ana@example.com"),
        sha("5521951272727"),  # Meta: digits with country code, no '+'
        sha("ána"),
        sha("souza"),
        sha("br"),  # "Brasil" is no English name: the tenant's default country is used
    ]


def test_google_row_hashes_e164_with_plus() -> None:
    contact = Contact("cust-2", "A.Na@gmail.com", "21 95127-2727", "Ana", "Souza", "BR")
    assert google_row(contact, "BR") == [sha("ana@gmail.com"), sha("+5521951272727")]


def test_missing_values_are_empty_not_hashes_of_nothing() -> None:
    row = meta_row(Contact("cust-3"), "BR")
    assert row[1:5] == ["", "", "", ""]
    assert row[5] == sha("br")
    assert google_row(Contact("cust-3"), "BR") == ["", ""]
