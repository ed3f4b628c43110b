"""Loopback VTEX sandbox: deterministic synthetic stores served over VTEX's REST paths.

``Store``/``StoreSpec`` generate the data (and are the truth tests compare against),
``build_app`` is the Starlette app, ``SandboxProcess`` runs it in a subprocess with fault
switches, ``credentials_for`` gives the app key/token the sandbox accepts for an account.

``MetaSandbox`` is the separate, in-process Meta Graph API sandbox for Custom Audiences (see
:mod:`cdp_assets.sandbox.meta_graph`).
"""

from cdp_assets.sandbox.faults import FaultConfig
from cdp_assets.sandbox.generator import (
    MALFORMED_KINDS,
    STATUSES,
    StatusChange,
    Store,
    StoreSpec,
    format_ticks,
    parse_ticks,
)
from cdp_assets.sandbox.meta_graph import META_FAULT_KINDS, MetaSandbox, RecordedRequest
from cdp_assets.sandbox.server import (
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
    "MetaSandbox",
    "RecordedRequest",
    "SandboxProcess",
    "StatusChange",
    "Store",
    "StoreSpec",
    "build_app",
    "credentials_for",
    "format_ticks",
    "parse_ticks",
    "run_sandbox",
    "serve",
]
