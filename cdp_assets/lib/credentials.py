"""Credential values, read from the environment variables the tenants and destinations name.

A value read is remembered for redaction (`lib/redaction.py`) before anything else, so no text
the process writes afterwards quotes it, even when it is refused: whitespace around it or a
control character in it (a token pasted with its newline) would otherwise reach a header, where
`requests` refuses it with an error quoting the value.
"""

from __future__ import annotations

import os

from cdp_assets.lib.redaction import remember


class CredentialError(ValueError):
    """A credential variable that is unset or holds an unusable value; names the variable,
    never the value."""


def read_credential(name: str) -> str:
    """The value of the environment variable `name`, checked."""
    value = os.environ.get(name, "")
    if not value:
        raise CredentialError(f"credential reference {name} is not set in the environment")
    remember(value)
    if value != value.strip():
        problem = "has whitespace around it (a newline pasted with it?)"
    elif not value.isprintable():
        problem = "holds control characters"
    else:
        return value
    raise CredentialError(f"the value of {name} {problem}: set it again without")
