"""The development kit's commands, added to `cdp` by entry point (pyproject.toml): the demo,
the benchmark, the VTEX sandbox in the foreground, the reliability suite, and the sandboxes
`cdp dev` serves."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import click
import psycopg

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def dev_sandboxes(url: str, echo: Callable[[str], None]) -> Iterator[None]:
    """The demo stores and the Meta and Google sandboxes on loopback for `cdp dev`, the demo
    tenants and destinations pointed at them, until the context ends."""
    from cdp_devkit.demo import (
        DEMO_TENANTS,
        demo_sandboxes,
        register_demo_destinations,
        register_demo_tenants,
    )
    from cdp_devkit.sandbox import SandboxProcess

    with ExitStack() as stack:
        server = stack.enter_context(SandboxProcess([d.store for d in DEMO_TENANTS]))
        # In this process: runs reach them through the environment they inherit.
        stack.enter_context(demo_sandboxes())
        with psycopg.connect(url) as conn:
            register_demo_tenants(conn, server)
            register_demo_destinations(conn)
        echo(f"VTEX sandbox on {server.base_url}; Meta and Google sandboxes too")
        yield


@click.command()
def demo() -> None:
    """End-to-end demo: embedded Postgres, the VTEX sandbox, three tenants, all VTEX assets."""
    from cdp_devkit.demo import run_demo

    run_demo(echo=click.echo)


@click.command()
@click.option(
    "--scale",
    type=click.Choice(["small", "seed", "large", "fleet"]),
    default="small",
    show_default=True,
    help="small: 2 tenants, 12k orders (CI smoke test); seed: the old system's load, 41"
    " tenants, 1M orders; large: 1M customers, 5M orders; fleet: the control plane (cdp"
    " status, the daemon's schedule and automation ticks and memory, the UI's partition"
    " health, a backfill) at 41 and 400 tenants with a year of history.",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=PROJECT_ROOT / "bench" / "results",
    show_default=True,
    help="Folder for <scale>.json, <scale>.svg and summary.md.",
)
@click.option(
    "--fraction",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    show_default=True,
    help="Generate this share of the scale's history (same tenants and daily increment), for"
    " a machine on which the whole scale takes too long; the report says so.",
)
@click.option("--keep-database", is_flag=True, help="Keep the benchmark's database afterwards.")
@click.option(
    "--tenants",
    "fleet_tenants",
    type=click.IntRange(min=1),
    multiple=True,
    help="fleet only: the tenant counts to measure (repeatable), instead of 41 and 400; a"
    " smaller fleet for development, the targets judged at the largest.",
)
def bench(
    scale: str, output: Path, fraction: float, keep_database: bool, fleet_tenants: tuple[int, ...]
) -> None:
    """Benchmark every stage (write path, ingestion, analytics, activation, daily increment)
    through the platform's Dagster jobs against the sandboxes, and report against targets."""
    from cdp_devkit.bench import run_bench

    if scale == "fleet":
        from cdp_devkit.bench.fleet import FLEET_SIZES, run_fleet

        report = run_fleet(output, echo=click.echo, sizes=fleet_tenants or FLEET_SIZES)
        for row in report["targets"]:
            verdict = "met" if row["met"] else "MISSED"
            click.echo(
                f"{verdict:>7}  {row['target']} at {row['tenants']} tenants: {row['value']}"
                f" (< {row['limit']:g})"
            )
        return

    report = run_bench(
        scale, output, echo=click.echo, keep_database=keep_database, fraction=fraction
    )
    for row in report["targets"]:
        if row["applies"] and row["met"] is not None:
            verdict = "met" if row["met"] else "MISSED"
            click.echo(
                f"{verdict:>7}  {row['target']}: {row['value']:,.2f} {row['unit']}"
                f" ({row['comparison']} {row['limit']:g} {row['unit']})"
            )
    failed = [c for c in report["consistency"] if not c["ok"]]
    for check in failed:
        click.echo(f"INCONSISTENT  {check['stage']}: {check['check']}: {check}")
    if failed:
        raise SystemExit(1)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True)
@click.option(
    "--store",
    "stores",
    multiple=True,
    metavar="SPEC",
    help='A synthetic store, e.g. "acme:orders=20000,customers=5000,seed=1" (repeatable).'
    " Default: the demo's stores.",
)
def sandbox(host: str, port: int, stores: tuple[str, ...]) -> None:
    """Serve the loopback VTEX sandbox in the foreground: VTEX's OMS, catalog, Master Data and
    orders feed for synthetic stores, each at http://HOST:PORT/<account>."""
    from cdp_devkit.demo import demo_store_args

    store_args = [arg for spec in stores for arg in ("--store", spec)] or demo_store_args()
    command = ["-m", "cdp_devkit.sandbox", "--host", host, "--port", str(port), *store_args]
    os.execv(sys.executable, [sys.executable, *command])


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--full",
    is_flag=True,
    help="Also run the long randomized scenarios (marked `long`), which CI leaves out.",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def reliability(full: bool, pytest_args: tuple[str, ...]) -> None:
    """Run the reliability and security suite (tests/reliability) and print its table:
    scenario, faults injected, records checked, lost, duplicates, result. Extra arguments go
    to pytest (e.g. `-k isolation`). Exits 1 when a test fails or anything was lost or
    duplicated."""
    from cdp_devkit.reliability import run_suite

    raise SystemExit(run_suite(full, pytest_args))
