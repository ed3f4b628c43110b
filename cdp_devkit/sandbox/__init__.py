"""Loopback VTEX sandbox: deterministic synthetic stores served over VTEX's REST paths.

``Store``/``StoreSpec`` generate the data (and are the truth tests compare against),
``build_app`` is the Starlette app, ``SandboxProcess`` runs it in a subprocess with fault
switches, ``credentials_for`` gives the app key/token the sandbox accepts for an account.

``MetaSandbox`` is the separate, in-process Meta Graph API sandbox for Custom Audiences (see
:mod:`cdp_devkit.sandbox.meta.graph`); ``GoogleSandbox`` the in-process gRPC sandbox for Google's
Data Manager and Google Ads Customer Match APIs (see :mod:`cdp_devkit.sandbox.google.sandbox`).
"""

from typing import Any

from cdp_devkit.sandbox.meta.graph import META_FAULT_KINDS, MetaSandbox, RecordedRequest
from cdp_devkit.sandbox.vtex.faults import FaultConfig
from cdp_devkit.sandbox.vtex.generator import (
    MALFORMED_KINDS,
    STATUSES,
    StatusChange,
    Store,
    StoreSpec,
    format_ticks,
    history_end_today,
    parse_ticks,
)
from cdp_devkit.sandbox.vtex.server import (
    SandboxProcess,
    build_app,
    credentials_for,
    run_sandbox,
    serve,
)

__all__ = [
    "MALFORMED_KINDS",
    "META_FAULT_KINDS",
    "STATUSES",
    "FaultConfig",
    "GoogleSandbox",
    "MetaSandbox",
    "RecordedCall",
    "RecordedRequest",
    "SandboxProcess",
    "SandboxUserList",
    "StatusChange",
    "Store",
    "StoreSpec",
    "build_app",
    "credentials_for",
    "format_ticks",
    "history_end_today",
    "parse_ticks",
    "run_sandbox",
    "serve",
]

_GOOGLE_EXPORTS = frozenset({"GoogleSandbox", "RecordedCall", "SandboxUserList"})


def __getattr__(name: str) -> Any:
    # Imported on first use: grpc and the Google clients take about a second to import, which
    # the VTEX sandbox subprocess (``python -m cdp_devkit.sandbox``) should not pay.
    if name in _GOOGLE_EXPORTS:
        from cdp_devkit.sandbox.google import sandbox

        return getattr(sandbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
