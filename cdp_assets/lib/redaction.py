"""Credentials masked out of any text the platform writes (error rows, history, alerts)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Values of variables named like credentials (the tenants' and destinations' *_KEY and
# *_TOKEN references among them) are masked wherever an error message quotes them.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_SECRET_PATTERNS = (
    # user:password@ in URLs (the warehouse's, a broker's)
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@", re.IGNORECASE), r"\1***@"),
    (re.compile(r"\b(bearer|basic)\s+[\w.~+/=-]+", re.IGNORECASE), r"\1 ***"),
    # token=..., "X-VTEX-API-AppToken": "...", password: ...
    (
        re.compile(
            r"((?:token|secret|password|passwd|app_?key|api_?key)[\"']?\s*[:=]\s*[\"']?)"
            r"[^\s\"'&,;)}]+",
            re.IGNORECASE,
        ),
        r"\1***",
    ),
)


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with credentials masked: values of secret-named variables, URL passwords,
    bearer tokens and `token=`-style assignments."""
    environ = os.environ if environ is None else environ
    for name, value in environ.items():
        # Short values would mask ordinary words; credentials are longer.
        if len(value) >= 8 and _SECRET_NAME.search(name):
            text = text.replace(value, "***")
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text
