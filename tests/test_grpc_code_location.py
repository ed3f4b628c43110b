"""The code location as its own gRPC server, as deploy/ runs it: `dagster api grpc -m
cdp_assets.definitions`, a workspace.yaml with a `grpc_server` entry, and the webserver and
the daemon (whose run queue launches the run) loading the location from it. A tenant's
`vtex_products` is materialized through the GraphQL the UI's Materialize button sends.

Logs and DAGSTER_HOME are copied to tests/artifacts/grpc/failed/ when the test fails.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg
import psycopg
import yaml
from support import register
from support.dagster_services import (
    LAUNCH_PIPELINE_EXECUTION,
    LOCATION,
    REPOSITORY,
    ROOT,
    free_port,
    running_ui,
    served_keys,
    stored_keys,
)

from cdp_devkit.sandbox import SandboxProcess, StoreSpec

ARTIFACTS = ROOT / "tests" / "artifacts" / "grpc"
TENANT = "grpc_shop"
STORE = StoreSpec(account="grpcshop", seed=41, customers=20, orders=10, products=25)
GRPC_INFO_TAG = ".dagster/grpc_info"  # DefaultRunLauncher: the code server it launched through


def test_a_materialization_launched_like_the_ui_runs_on_the_grpc_code_location(
    warehouse_url: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    started = time.monotonic()
    port = free_port()
    workspace = tmp_path / "workspace.yaml"
    server = {"host": "127.0.0.1", "port": port, "location_name": LOCATION}
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": server}]}))
    with SandboxProcess([STORE]) as sandbox:
        register(conn, TENANT, STORE.account)
        with running_ui(
            warehouse_url,
            tmp_path,
            sandbox,
            [TENANT],
            artifacts=ARTIFACTS,
            workspace=workspace,
            code_server_port=port,
        ) as ui:
            # The asset's Materialize button on a partition: the implicit asset job, the asset,
            # the partition and the UI's own tags. The run config keeps the one step in the run
            # worker (a process per step would import the code location once more).
            params = {
                "selector": {
                    "repositoryLocationName": LOCATION,
                    "repositoryName": REPOSITORY,
                    "pipelineName": "__ASSET_JOB",
                    "assetSelection": [{"path": ["vtex_products"]}],
                    "assetCheckSelection": [],
                },
                "mode": "default",
                "runConfigData": "execution:\n  config:\n    in_process: {}\n",
                "executionMetadata": {
                    "tags": [
                        {"key": "dagster/partition", "value": TENANT},
                        {"key": "dagster/from_ui", "value": "true"},
                    ]
                },
            }
            launched = ui.graphql(LAUNCH_PIPELINE_EXECUTION, {"executionParams": params})
            result = launched["launchPipelineExecution"]
            assert result["__typename"] == "LaunchRunSuccess", result
            assert result["run"]["status"] == "QUEUED"  # the daemon's run queue starts it
            run_id = result["run"]["id"]
            ui.wait_for_run(run_id)
            print(f"\nvtex_products run: {time.monotonic() - started:.1f} s from the test's start")
            with dg.DagsterInstance.get() as instance:  # the one running_ui set up
                run = instance.get_run_by_id(run_id)
                assert run is not None
                # Launched through our code server, not one the webserver or daemon started.
                assert json.loads(run.tags[GRPC_INFO_TAG]) == {"host": "127.0.0.1", "port": port}
                assert run.asset_selection == {dg.AssetKey("vtex_products")}

        served = served_keys(sandbox, STORE.account, "products")
    assert served
    assert stored_keys(conn, TENANT, "products") == served
    for entity in ("skus", "customers"):  # only what was selected ran
        assert not stored_keys(conn, TENANT, entity), entity
