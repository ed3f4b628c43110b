"""``python -m cdp_devkit.sandbox --port 8765 --store "acme:orders=20000,customers=5000,seed=1"``.

Runs the sandbox in the foreground until interrupted. ``--fd`` serves an inherited listening
socket instead of binding ``--host``/``--port`` (used by :class:`SandboxProcess`).
"""

from __future__ import annotations

import argparse

from cdp_devkit.sandbox.vtex.generator import StoreSpec
from cdp_devkit.sandbox.vtex.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cdp_devkit.sandbox", description="Loopback VTEX sandbox."
    )
    parser.add_argument(
        "--store",
        action="append",
        required=True,
        type=StoreSpec.parse,
        help='store spec, e.g. "acme:orders=20000,customers=5000,seed=1"; '
        "repeat for several accounts",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--fd",
        type=int,
        default=None,
        help="serve this inherited listening socket instead of --host/--port",
    )
    args = parser.parse_args(argv)
    serve(args.store, host=args.host, port=args.port, fd=args.fd)


if __name__ == "__main__":
    main()
