"""The Meta and Google sandboxes in a process of their own, as the benchmark runs them.

They stand in for remote platforms: what they hold (every member and every recorded upload)
is the platforms' memory, not the memory of the process that drives the pushes.

``python -m cdp_devkit.sandbox.platforms '<config json>'`` prints one JSON line with the
servers' addresses, then answers each ``members`` line on stdin with the members each
platform holds, and exits when stdin closes. :class:`PlatformSandboxes` runs it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import IO, Any

from cdp_devkit.sandbox.meta.graph import MetaSandbox


def _meta_members(meta: MetaSandbox, accounts: Sequence[str]) -> int:
    return sum(
        len(meta.members(audience["id"]))
        for account in accounts
        for audience in meta.audiences(account)
    )


def serve(config: Mapping[str, Any], commands: IO[str], replies: IO[str]) -> None:
    """Start the sandboxes, announce them on ``replies`` and answer ``commands`` until EOF."""
    tokens: dict[str, list[str]] = config["meta_tokens"]
    accounts = sorted({account for granted in tokens.values() for account in granted})
    with contextlib.ExitStack() as stack:
        meta = stack.enter_context(MetaSandbox(tokens))
        google = None
        if config["google"]:
            from cdp_devkit.sandbox.google.sandbox import GoogleSandbox

            google = stack.enter_context(
                GoogleSandbox(processing_seconds=config["google_processing_seconds"])
            )
        addresses = {
            "meta_graph_url": meta.graph_url,
            "google_address": google.address if google else None,
        }
        replies.write(json.dumps(addresses) + "\n")
        replies.flush()
        for line in commands:
            if line.strip() != "members":
                raise ValueError(f"unknown command {line.strip()!r}")
            members = {"meta": _meta_members(meta, accounts)}
            if google is not None:
                members["google"] = sum(lst.member_count for lst in google.user_lists())
            replies.write(json.dumps(members) + "\n")
            replies.flush()


class PlatformSandboxes:
    """Runs the Meta sandbox (accepting ``meta_tokens``: token -> ad account ids) and, with
    ``google``, the Google sandbox in a subprocess, its Data Manager processing a request
    ``google_processing_seconds`` after acknowledging it; a context manager."""

    def __init__(
        self,
        meta_tokens: Mapping[str, Sequence[str]],
        google: bool,
        google_processing_seconds: float,
    ) -> None:
        self.config = {
            "meta_tokens": {token: list(accounts) for token, accounts in meta_tokens.items()},
            "google": google,
            "google_processing_seconds": google_processing_seconds,
        }
        self.meta_graph_url = ""
        self.google_address: str | None = None
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> PlatformSandboxes:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "cdp_devkit.sandbox.platforms", json.dumps(self.config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        addresses = self._reply()
        self.meta_graph_url = addresses["meta_graph_url"]
        self.google_address = addresses["google_address"]
        return self

    def members(self) -> dict[str, int]:
        """Members held per platform (``meta``, and ``google`` when it runs), over all lists."""
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write("members\n")
        self._process.stdin.flush()
        return self._reply()

    def _reply(self) -> Any:
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the platform sandboxes exited with {self._process.wait()}")
        return json.loads(line)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]), sys.stdin, sys.stdout)
