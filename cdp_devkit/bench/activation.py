"""Activation benchmark: push a large audience to the Meta sandbox through the real asset.

    .venv/bin/python -m cdp_devkit.bench.activation [--members 100000]

Measures the first push (every member normalized, hashed and sent in 10,000-row batches)
and an unchanged re-sync (nothing to send), on a synthetic warehouse in the platform's
Postgres. Exits non-zero when a target is missed: first push < 30 s, re-sync < 5 s.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

import dagster as dg
import psycopg

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_devkit.sandbox.audience_warehouse import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    set_members,
)
from cdp_devkit.sandbox.meta.graph import MetaSandbox

TARGETS = {"first_push": 30.0, "unchanged_resync": 5.0}
TENANT = "bench"
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def main() -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=100_000)
    args = parser.parse_args()
    # Every tenth synthetic customer has no e-mail or phone and cannot be matched.
    customers = math.ceil(args.members / 0.9)
    os.environ["BENCH_META_TOKEN"] = "bench-token"
    results: dict[str, float] = {}
    with (
        activation_warehouse() as url,
        MetaSandbox({"bench-token": ["1"]}) as meta,
        dg.DagsterInstance.ephemeral() as instance,
    ):
        with psycopg.connect(url) as conn:
            add_tenant_with_customers(conn, TENANT, customers)
            set_members(conn, TENANT, range(customers))
            add_destination(
                conn,
                Destination(
                    "bench_meta",
                    TENANT,
                    "meta",
                    "1",
                    credential_refs={"access_token": "BENCH_META_TOKEN"},
                    max_removal_share=1.0,
                ),
            )
            add_audience(conn, "bench_meta", AUDIENCE)
            conn.commit()
        instance.add_dynamic_partitions(tenants.name, [TENANT])
        resources = {
            "warehouse": WarehouseResource(url=url),
            "meta": MetaResource(graph_url=meta.graph_url),
        }
        for label in TARGETS:
            started = time.perf_counter()
            result = dg.materialize(
                [meta_custom_audiences],
                partition_key=TENANT,
                instance=instance,
                resources=resources,
                run_config=QUIET,
            )
            results[label] = time.perf_counter() - started
            (event,) = result.get_asset_materialization_events()
            metadata = event.materialization.metadata
            print(
                f"{label:<18}{results[label]:>8.2f} s   added {metadata['added'].value:>7}"
                f"   unchanged {metadata['unchanged'].value:>7}"
                f"   requests {metadata['requests'].value:>3}"
            )
        (audience,) = meta.audiences("1")
        print(f"members in the Meta sandbox: {len(meta.members(audience['id']))}")
    missed = [
        f"{k} {results[k]:.1f} s > {limit:.0f} s"
        for k, limit in TARGETS.items()
        if results[k] > limit
    ]
    print("targets met" if not missed else "MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
