"""Credentials masked out of any text the platform writes (error rows, history, alerts, logs).

Two sources of secrets are known: the credential values the process read (`remember`, called
where the tenants' and destinations' references are resolved), and the environment's variables
named like credentials. A value is masked as written and in the forms an echo gives it:
stripped, JSON-escaped, URL-encoded, and as Python's `repr` escapes it (a token ending in a
newline appears as `...\\n` in the text of requests' `InvalidHeader`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Mapping
from urllib.parse import quote, quote_plus

MASK = "***"
# Short values would mask ordinary words; credentials are longer.
MIN_SECRET_LENGTH = 8
# Values of variables named like credentials (the tenants' and destinations' *_KEY and
# *_TOKEN references among them) are masked wherever an error message quotes them.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_SECRET_PATTERNS = (
    # user:password@ in URLs (the warehouse's, a broker's)
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@", re.IGNORECASE), r"\1***@"),
    (re.compile(r"\b(bearer|basic)\s+[\w.~+/=-]+", re.IGNORECASE), r"\1 ***"),
    # token=..., "X-VTEX-API-AppToken": "...", password: ..., appsecret_proof=...
    (
        re.compile(
            r"((?:token|secret|password|passwd|app_?key|api_?key|appsecret_proof)[\"']?\s*[:=]"
            r"\s*[\"']?)[^\s\"'&,;)}]+",
            re.IGNORECASE,
        ),
        r"\1***",
    ),
)

_remembered: set[str] = set()
_remembered_lock = threading.Lock()


def remember(value: str) -> None:
    """Mask `value` in everything this process redacts from now on: a credential it read."""
    if len(value.strip()) >= MIN_SECRET_LENGTH:
        with _remembered_lock:
            _remembered.add(value)


@functools.lru_cache(maxsize=1024)
def _forms(value: str) -> frozenset[str]:
    """How a value can appear in text: as is, stripped, and escaped by JSON, URLs and repr."""
    forms = set()
    for text in {value, value.strip()}:
        forms |= {
            text,
            json.dumps(text)[1:-1],
            json.dumps(text, ensure_ascii=False)[1:-1],
            quote(text, safe=""),
            quote_plus(text, safe=""),
            repr(text)[1:-1],
        }
    return frozenset(form for form in forms if len(form) >= MIN_SECRET_LENGTH)


def _secrets(environ: Mapping[str, str]) -> list[str]:
    with _remembered_lock:
        values = set(_remembered)
    values |= {value for name, value in environ.items() if _SECRET_NAME.search(name)}
    # Longest first: a value that contains another is masked whole.
    return sorted({form for value in values for form in _forms(value)}, key=len, reverse=True)


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with credentials masked: the values this process read and those of
    secret-named variables (in any of their escaped forms), URL passwords, bearer tokens and
    `token=`-style assignments."""
    for secret in _secrets(os.environ if environ is None else environ):
        if secret in text:
            text = text.replace(secret, MASK)
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text
