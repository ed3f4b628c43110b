"""dagster-dbt's dbt resource, patched: what it does before each step's first dbt command is
skipped where this project does not need it, and the command runs in a child forked from the
step process (dbt_fork.py). Targets dagster-dbt 0.29.27 (see README.md of this folder)."""

import os
import sys
from collections.abc import Mapping, Sequence
from functools import cached_property
from importlib.metadata import version
from pathlib import Path

import dagster as dg
from dagster_dbt import DagsterDbtTranslator, DbtCliInvocation, DbtCliResource
from dagster_dbt.asset_utils import (
    DBT_INDIRECT_SELECTION_ENV,
    extract_runtime_selection_from_args,
    get_updated_cli_invocation_params_for_context,
)
from packaging.version import Version

from cdp_assets.framework.dbt_fork import ForkedDbt
from cdp_assets.framework.dbt_parse import seed_parse
from cdp_assets.lib.environ import temporary_environment


class CdpDbtCliResource(DbtCliResource):
    """dagster-dbt's resource, without two things it does before each step's first dbt command
    (together as long as a small tenant's models): it runs `dbt --version`, and it
    loads a dbt adapter in-process, used only to fetch row counts and column metadata, which
    this project does not ask for. The dbt it runs is the dbt-core installed beside this
    interpreter, so that package's version is the CLI's."""

    kept_parses: str = ""
    """The folder of the project's own parses (kept_parse_name), one copied into each
    invocation's target folder so dbt re-reads only the files changed since; empty: none."""

    @cached_property
    def _cli_version(self) -> Version:
        return Version(version("dbt-core"))

    # Declared as returning an adapter, but its caller takes None, as when creating one fails.
    def _initialize_dbt_core_adapter(self, args: Sequence[str]) -> None:  # type: ignore[override]
        return None

    def forked_cli(
        self,
        args: Sequence[str],
        *,
        context: dg.AssetExecutionContext,
        env: Mapping[str, str] | None = None,
    ) -> DbtCliInvocation:
        """`cli(args, context=context)`, its dbt command run in a child forked from this
        process (dbt_fork.py) with the arguments and environment `cli` gives its subprocess,
        and `env` on top: this invocation's own variables, which no other dbt command of the
        process sees. For a step's process: one running server threads (the webserver's,
        gRPC's) is not one to fork. On Linux only: macOS' system frameworks do not survive a
        fork, and Windows has none."""
        if sys.platform != "linux":
            with temporary_environment(env or {}):
                return self.cli(args, context=context)
        args, selects, excludes = extract_runtime_selection_from_args(args)
        params = get_updated_cli_invocation_params_for_context(
            context=context,
            manifest={},
            dagster_dbt_translator=DagsterDbtTranslator(),
            runtime_selects=selects,
            runtime_excludes=excludes,
        )
        # A large selection runs in a copy of the project holding a generated selector.
        project_dir = Path(
            params.dbt_project.project_dir if params.dbt_project else self.project_dir
        )
        target_path = project_dir / self._get_unique_target_path(context=context)
        env = {
            **os.environ,
            "DAGSTER_DBT_CLI": "true",
            "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
            "DBT_LOG_FORMAT": "json",
            "DBT_TARGET_PATH": str(target_path),
            "DBT_LOG_PATH": str(target_path),
            "DBT_PROJECT_DIR": str(project_dir),
            **({"DBT_PROFILES_DIR": self.profiles_dir} if self.profiles_dir else {}),
            **(env or {}),
        }
        if params.indirect_selection:
            env[DBT_INDIRECT_SELECTION_ENV] = params.indirect_selection
        if self.kept_parses:
            seed_parse(Path(self.kept_parses), target_path, env)
        command = [
            self.dbt_executable,
            *self.global_config_flags,
            *args,
            *(["--target", self.target] if self.target else []),
            *params.selection_args,
        ]
        return DbtCliInvocation(
            # Declared a Popen; the invocation uses only the part of one that ForkedDbt has.
            process=ForkedDbt(command, env, project_dir),  # type: ignore[arg-type]
            manifest=params.manifest,
            dagster_dbt_translator=params.dagster_dbt_translator,
            project_dir=project_dir,
            target_path=target_path,
            raise_on_error=True,
            cli_version=self._cli_version,
            project=params.dbt_project,
            context=context,
        )
