"""The dbt project beside the package as Dagster sees it: its manifest (parsed again when a
project file changed), its resource, and how its nodes become Dagster assets. Its files and
connection are dbt_files.py's."""

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtProject,
)
from filelock import FileLock

from cdp_assets.analytics.automation import ANALYTICS_AUTOMATION
from cdp_assets.analytics.dbt_files import (
    DBT_EXECUTABLE,
    DBT_PROJECT_DIR,
    MANIFEST_PATH,
    PRODUCTION_STATE,
    PRODUCTION_TARGET,
    dbt_connection_env,
    keep_parse,
    project_files,
    prune_exposures,
)
from cdp_assets.framework.dbt_cli import CdpDbtCliResource
from cdp_assets.lib import settings
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.partitions import tenants

dbt_project = DbtProject(
    project_dir=DBT_PROJECT_DIR, profiles_dir=DBT_PROJECT_DIR, target=PRODUCTION_TARGET
)


def dbt_resource() -> CdpDbtCliResource:
    # The resource's `__init__` takes a DbtProject; the signature mypy reads is its fields'.
    return CdpDbtCliResource(
        project_dir=dbt_project,  # type: ignore[arg-type]
        dbt_executable=DBT_EXECUTABLE,
        kept_parses=str(PRODUCTION_STATE),
    )


def ensure_manifest() -> Path:
    """Parse the project when its manifest is missing or older than any project file, so the
    code location, tests and CLI always load the models as they are on disk. Processes that
    load the definitions together (webserver, daemon, test workers) parse one at a time, each
    parse in a folder of its own, and the manifest is replaced atomically. A parse connects to
    nothing: without DATABASE_URL (an image's build) the profile names a server never reached."""
    prune_exposures()
    newest = max(path.stat().st_mtime for path in project_files())
    MANIFEST_PATH.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(MANIFEST_PATH.with_name(".parse.lock")):
        if not MANIFEST_PATH.exists() or MANIFEST_PATH.stat().st_mtime < newest:
            os.environ.setdefault("DO_NOT_TRACK", "1")
            parse_target = dbt_project.target_path / f"parse-{uuid.uuid4().hex}"
            parsed = DBT_PROJECT_DIR / parse_target
            connection = dbt_connection_env(settings.value("DATABASE_URL") or UNCONNECTED_URL)
            try:
                with temporary_environment(connection):
                    dbt_resource().cli(["parse", "--quiet"], target_path=parse_target).wait()
                os.replace(parsed / "manifest.json", MANIFEST_PATH)
                keep_parse(parsed, connection)
            finally:
                shutil.rmtree(parsed, ignore_errors=True)
    return MANIFEST_PATH


# What profiles.yml is given for a parse without a database: a parse never connects.
UNCONNECTED_URL = "postgresql://unconnected/postgres"

WEEKLY_TAG = "weekly"


def generic_test_description(test: Mapping[str, Any], tested: str) -> str:
    """What a generic dbt test asserts, from its name and arguments: "`not_null` of column
    `order_total` of `stg_vtex__orders`", "`keyed_rows` of `customers` (key customer_key;
    rules `purchases >= 1`)"."""
    metadata = test["test_metadata"]
    arguments = dict(metadata["kwargs"])
    arguments.pop("model", None)  # `{{ get_where_subquery(ref(...)) }}`: the tested model
    column = arguments.pop("column_name", None)
    subject = f"column `{column}` of `{tested}`" if column else f"`{tested}`"
    details = "; ".join(
        f"{name} {', '.join(map(_argument_item, value)) if isinstance(value, list) else value}"
        for name, value in arguments.items()
    )
    return f"`{metadata['name']}` of {subject}" + (f" ({details})" if details else "")


def _argument_item(item: Any) -> str:
    # A column name as it is; an expression (a rule) quoted, its own commas and all.
    text = " ".join(str(item).split())
    return text if text.isidentifier() else f"`{text}`"


class CdpDbtTranslator(DagsterDbtTranslator):
    """Models keyed by name, grouped by layer (staging, intermediate, marts, audiences), run
    by the analytics automation when their sources are fresh; the models tagged `weekly` run
    on their schedule instead. A test's check is described by the test's own description
    (singular tests: tests/_tests.yml) or, for a generic test, by what it asserts.

    With `partitions_def` (the tenants, for models built per tenant) each test's check is
    partitioned like its model: a tenant's run records its tests' results for that tenant,
    so one tenant's failing test is red for that tenant alone, not for every tenant until
    another's run passes it."""

    def __init__(
        self,
        settings: DagsterDbtTranslatorSettings | None = None,
        partitions_def: dg.PartitionsDefinition | None = None,
    ) -> None:
        super().__init__(settings)
        self.partitions_def = partitions_def

    def get_asset_check_spec(
        self,
        asset_spec: dg.AssetSpec,
        manifest: Mapping[str, Any],
        unique_id: str,
        project: DbtProject | None,
    ) -> dg.AssetCheckSpec | None:
        spec = super().get_asset_check_spec(asset_spec, manifest, unique_id, project)
        if spec is None:
            return spec
        description = spec.description
        if not description:
            test = manifest["nodes"][unique_id]
            description = test["description"]
            if not description and test.get("test_metadata"):
                description = generic_test_description(test, asset_spec.key.to_user_string())
        return spec._replace(description=description or None, partitions_def=self.partitions_def)

    def get_asset_spec(
        self, manifest: Mapping[str, Any], unique_id: str, project: DbtProject | None
    ) -> dg.AssetSpec:
        spec = super().get_asset_spec(manifest, unique_id, project)
        props = self.get_resource_props(manifest, unique_id)
        if props["resource_type"] != "model":
            return spec
        layer = props["fqn"][1] if len(props["fqn"]) > 2 else "analytics"
        spec = spec.replace_attributes(
            key=dg.AssetKey(props["name"]),
            group_name=layer,
            automation_condition=None if WEEKLY_TAG in props["tags"] else ANALYTICS_AUTOMATION,
        )
        # Where activation sends it (the project's exposures): one asset per ad account would
        # grow the graph with every destination, so the destinations are the audience's metadata.
        destinations = [
            manifest["exposures"][child]
            for child in manifest["child_map"].get(unique_id, [])
            if child in manifest["exposures"]
        ]
        if not destinations:
            return spec
        return spec.merge_attributes(
            metadata={"destinations": ", ".join(d["label"] for d in destinations)}
        )


_settings = DagsterDbtTranslatorSettings(enable_asset_checks=True, enable_code_references=True)
translator = CdpDbtTranslator(_settings)
# The models built per tenant (their `@dbt_assets` are partitioned by tenant).
tenant_translator = CdpDbtTranslator(_settings, partitions_def=tenants)
