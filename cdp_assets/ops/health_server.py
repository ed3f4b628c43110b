"""The HTTP health endpoint for uptime probes (`cdp health`, started by `cdp dev`).

`GET /health` answers 200 when the platform is healthy and 503 otherwise, with the verdict of
`cdp status --check` as JSON: `{"healthy": ..., "checked_at": ..., "problems": [...]}`, each
problem naming what failed and, where it is one tenant's, the tenant. The warehouse is asked
first with a short timeout, so an unreachable database is a prompt 503 that says so.

A verdict is reused for CACHE_SECONDS: probes from several places, or a probe every few
seconds, cost the database one evaluation.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import psycopg

from cdp_assets.ops.health import DATABASE_TIMEOUT_SECONDS, Problem, database_problem, one_line
from cdp_assets.ops.status import collect_status, platform_instance

CACHE_SECONDS = 10.0
PATH = "/health"


class HealthVerdicts:
    """The verdict on the warehouse at `url` and the Dagster instance of DAGSTER_HOME."""

    def __init__(self, url: str, cache_seconds: float = CACHE_SECONDS) -> None:
        self.url = url
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._instance: dg.DagsterInstance | None = None
        self._instance_context: Any = None

    def current(self) -> dict[str, Any]:
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            verdict = self._evaluate()
            self._cached = (time.monotonic(), verdict)
            return verdict

    def _evaluate(self) -> dict[str, Any]:
        checked_at = datetime.now(UTC)
        problems: list[Problem]
        unreachable = database_problem(self.url)
        if unreachable is not None:
            problems = [unreachable]
        else:
            try:
                with psycopg.connect(self.url, connect_timeout=DATABASE_TIMEOUT_SECONDS) as conn:
                    problems = collect_status(self._dagster(), conn, now=checked_at).problems
            except Exception as error:
                # Whatever kept the verdict from being reached is the verdict.
                problems = [
                    Problem("status", "evaluation", one_line(f"{type(error).__name__}: {error}"))
                ]
        return {
            "healthy": not problems,
            "checked_at": checked_at.isoformat(),
            "problems": [problem.as_json() for problem in problems],
        }

    def _dagster(self) -> dg.DagsterInstance:
        if self._instance is None:
            context = platform_instance(self.url)
            self._instance = context.__enter__()
            self._instance_context = context
        return self._instance

    def close(self) -> None:
        if self._instance_context is not None:
            self._instance_context.__exit__(None, None, None)
            self._instance = self._instance_context = None


def make_server(verdicts: HealthVerdicts, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0].rstrip("/") != PATH:
                self._answer(404, {"error": f"not found; the health endpoint is {PATH}"})
                return
            verdict = verdicts.current()
            self._answer(200 if verdict["healthy"] else 503, verdict)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body, indent=2).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass  # a probe every few seconds would fill the log

    return ThreadingHTTPServer((host, port), Handler)


def serve(url: str, host: str, port: int) -> None:
    """Serve until interrupted; the first verdict is reached at once, so the first probe does
    not wait for the code location to load."""
    verdicts = HealthVerdicts(url)
    server = make_server(verdicts, host, port)
    threading.Thread(target=verdicts.current, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        verdicts.close()
