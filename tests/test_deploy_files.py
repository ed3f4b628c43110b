"""deploy/: the Dockerfile, docker-compose.yml and the Helm chart's values, checked as far as a
machine without a Docker daemon, a cluster or helm allows: they parse, every command they name
exists with the options they give it, the services get every variable the platform reads, no
secret is written in them, ports and names agree with the workspace, the instance config loads
on Postgres, and Helm's run queue and pools are deploy/dagster.yaml's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
import pytest
import yaml
from support.dagster_services import BIN, DEFINITIONS_MODULE, ROOT, dagster_storage_database

from cdp_assets.framework.executor import EXECUTOR_ENV, executor_from_env

DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
HELM_VALUES = DEPLOY / "helm" / "values.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
INSTANCE_CONFIG = DEPLOY / "dagster.yaml"
WORKER_CONFIG = DEPLOY / "celery.yaml"
WORKSPACE = DEPLOY / "workspace.yaml"
CONSOLE_SCRIPTS = {"dagster", "dagster-webserver", "dagster-daemon", "dagster-celery", "cdp"}
LOCAL_DEV_PASSWORD = "cdp-local-dev"  # compose's default, for a trial on one's own machine
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|(^|_)KEY$", re.IGNORECASE)
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
URL_PASSWORD = re.compile(r"://[^/\s:@]+:([^@\s]+)@")
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
# Keys of the chart's values this file sets, as helm/dagster/schema in dagster-io/dagster
# declares them (the newest source readable here, not necessarily the 1.13.27 tag).
HELM_KEYS = {
    (): {
        "global",
        "generatePostgresqlPasswordSecret",
        "postgresql",
        "dagster-user-deployments",
        "runLauncher",
        "dagsterDaemon",
        "concurrency",
        "additionalInstanceConfig",
        "telemetry",
    },
    ("global",): {"postgresqlSecretName", "dagsterHome", "serviceAccountName"},
    ("postgresql",): {
        "enabled",
        "postgresqlHost",
        "postgresqlUsername",
        "postgresqlDatabase",
        "postgresqlParams",
        "service",
    },
    ("dagster-user-deployments",): {"enabled", "enableSubchart", "deployments"},
    ("dagsterDaemon",): {"runCoordinator", "runMonitoring", "runRetries"},
    ("dagsterDaemon", "runRetries"): {"enabled", "maxRetries", "retryOnAssetOrOpFailure"},
    ("concurrency",): {"enabled", "pools", "runs"},
    ("concurrency", "pools"): {"defaultLimit", "granularity"},
    ("concurrency", "runs"): {"maxConcurrentRuns", "tagConcurrencyLimits"},
}
USER_DEPLOYMENT_KEYS = {
    "name",
    "image",
    "port",
    "dagsterApiGrpcArgs",
    "envSecrets",
    "env",
    "includeConfigInLaunchedRuns",
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def interpolate(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Compose's `${NAME}` / `${NAME:-default}`, from `environ` (None: the defaults)."""
    environ = environ or {}
    return INTERPOLATION.sub(lambda m: environ.get(m.group(1)) or m.group(2) or "", text)


def env_references(config: Any) -> set[str]:
    """The variables a Dagster config names as `{env: NAME}`."""
    if isinstance(config, dict):
        if set(config) == {"env"}:
            return {config["env"]}
        return set().union(*(env_references(v) for v in config.values()))
    if isinstance(config, list):
        return set().union(*(env_references(v) for v in config))
    return set()


def leaves(document: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every scalar of a YAML document with the keys leading to it."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from leaves(value, (*path, str(key)))
    elif isinstance(document, list):
        for value in document:
            yield from leaves(value, path)
    elif document is not None:
        yield path, str(document)


def written_secrets(document: Any) -> list[str]:
    """Secrets written as literals: a secret-named variable with a literal value, a password
    in a URL, a secret-named variable's default; only compose's local dev password is allowed."""
    found = []
    for path, value in leaves(document):
        for name, default in INTERPOLATION.findall(value):
            if SECRET_NAME.search(name) and default not in ("", LOCAL_DEV_PASSWORD):
                found.append(f"{'.'.join(path)}: default of ${name}")
        for password in URL_PASSWORD.findall(value):
            if not INTERPOLATION.fullmatch(password):
                found.append(f"{'.'.join(path)}: password in {value}")
        variable = path[-1] if path and ENV_NAME.fullmatch(path[-1]) else ""
        if SECRET_NAME.search(variable) and not INTERPOLATION.search(value):
            found.append(f"{'.'.join(path)}: {value}")
    return found


@functools.cache
def help_text(*command: str) -> str:
    """`--help` of a console script's (sub)command, from the script in the virtualenv."""
    assert command[0] in CONSOLE_SCRIPTS, command
    script = BIN / command[0]
    assert script.exists() and os.access(script, os.X_OK), f"{script} is not installed"
    done = subprocess.run(
        [str(script), *command[1:], "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{' '.join(command)} --help: {done.stderr[-2000:]}"
    return done.stdout


def check_command(command: list[str]) -> None:
    """The console script exists, its subcommand too, and it takes every option given."""
    subcommand = []
    for word in command:
        if word.startswith("-"):
            break
        subcommand.append(word)
    text = help_text(*subcommand)
    for option in (word for word in command if word.startswith("-") and word != "--"):
        name = option.split("=")[0]
        assert re.search(rf"(?<![\w-]){re.escape(name)}\b", text), f"{command}: no {name}"


def option(command: list[str], *names: str) -> str:
    (index,) = [i for i, word in enumerate(command) if word in names]
    return command[index + 1]


def compose_commands(service: Mapping[str, Any]) -> list[list[str]]:
    command = service["command"]
    if command[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in command[2].split("&&")]
    return [command]


@dataclass
class Image:
    """What deploy/Dockerfile builds, as far as the checks need it."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    copies: dict[str, Path] = field(default_factory=dict)  # path in the image -> in the repo
    runs: list[str] = field(default_factory=list)
    exposed: set[int] = field(default_factory=set)
    cmd: list[str] = field(default_factory=list)

    def repo_path(self, path_in_image: str) -> Path:
        """The repository file a path of the image was copied from."""
        path = PurePosixPath(path_in_image)
        for target, source in self.copies.items():
            if path == PurePosixPath(target):
                return source
            if PurePosixPath(target) in path.parents and source.is_dir():
                return source / path.relative_to(target)
        pytest.fail(f"{path_in_image} is not copied into the image")


def parse_dockerfile(path: Path, context: Path) -> Image:
    image = Image()
    text = re.sub(r"\\\n", " ", path.read_text())  # continuation lines
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        rest = re.sub(r"\$\{(\w+)\}", lambda m: image.env[m.group(1)], rest.strip())
        match instruction.upper():
            case "ENV":
                image.env.update(word.split("=", 1) for word in shlex.split(rest))
            case "WORKDIR":
                image.workdir = rest
            case "COPY":
                *sources, target = [w for w in shlex.split(rest) if not w.startswith("--")]
                target = str(PurePosixPath(image.workdir) / target)  # absolute stays absolute
                into_folder = rest.endswith("/") or len(sources) > 1
                for source in sources:
                    name = PurePosixPath(target) / PurePosixPath(source).name
                    image.copies[str(name) if into_folder else target] = context / source
            case "RUN":
                image.runs.append(rest)
            case "EXPOSE":
                image.exposed |= {int(port) for port in rest.split()}
            case "CMD":
                image.cmd = json.loads(rest)
    return image


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE_FILE)


@pytest.fixture(scope="module")
def helm() -> dict[str, Any]:
    return load_yaml(HELM_VALUES)


@pytest.fixture(scope="module")
def instance_config() -> dict[str, Any]:
    return load_yaml(INSTANCE_CONFIG)


def platform_services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services of the platform's own image (the others are Postgres and Redis)."""
    return {name: s for name, s in compose["services"].items() if "build" in s}


@pytest.fixture(scope="module")
def image(compose: dict[str, Any]) -> Image:
    (build,) = {json.dumps(s["build"]) for s in platform_services(compose).values()}
    context = (COMPOSE_FILE.parent / json.loads(build)["context"]).resolve()
    assert context == ROOT, f"compose builds from {context}"
    assert context / json.loads(build)["dockerfile"] == DOCKERFILE
    return parse_dockerfile(DOCKERFILE, context)


def test_the_image_copies_what_exists_and_installs_the_package(image: Image) -> None:
    assert image.copies, "no COPY found"
    missing = [str(source) for source in image.copies.values() if not source.exists()]
    assert not missing, f"COPY sources missing from the repository: {missing}"
    assert any(re.search(r"pip install (-e|--editable) \.", run) for run in image.runs)
    home = image.env["DAGSTER_HOME"]
    assert image.repo_path(f"{home}/dagster.yaml") == INSTANCE_CONFIG
    # What the package reads beside itself once installed editable in the image.
    assert image.repo_path(f"{image.workdir}/dbt_project/dbt_project.yml").exists()
    assert image.repo_path(f"{image.workdir}/cdp_assets/definitions.py").exists()
    # The product alone: neither the development kit nor its extra.
    assert not any("cdp_devkit" in str(source) for source in image.copies.values())
    assert not any(re.search(r"pip install .*\[", run) for run in image.runs)
    check_command(image.cmd)


def test_every_compose_command_exists_with_its_options(
    compose: dict[str, Any], image: Image
) -> None:
    services = platform_services(compose)
    assert {"setup", "code", "webserver", "daemon", "celery-worker"} <= services.keys()
    for name in compose["services"].keys() - services.keys():
        assert compose["services"][name]["image"].split(":")[0] in ("postgres", "redis"), name
    for name, service in services.items():
        for command in compose_commands(service):
            check_command(command)
            for flag in ("-w", "-y"):  # workspace, Celery worker config: files of the image
                if flag in command:
                    assert image.repo_path(option(command, flag)).is_file(), (name, command)
            for flag in ("-m", "-i", "-A"):  # modules: definitions, worker imports, Celery app
                if flag in command:
                    importlib.import_module(option(command, flag))
    assert image.cmd == services["code"]["command"]


def test_the_services_get_every_variable_the_platform_reads(
    compose: dict[str, Any], image: Image
) -> None:
    # What the instance and the workers' config reference, the warehouse (unset, each
    # container would start an embedded Postgres of its own) and the executor's choice.
    required = env_references(load_yaml(INSTANCE_CONFIG)) | env_references(load_yaml(WORKER_CONFIG))
    assert {"DAGSTER_PG_URL", "CDP_CELERY_BROKER", "CDP_CELERY_BACKEND"} <= required
    required |= {"DATABASE_URL", EXECUTOR_ENV, "DAGSTER_HOME"}
    for name, service in platform_services(compose).items():
        missing = required - service["environment"].keys() - image.env.keys()
        assert not missing, f"{name} lacks {sorted(missing)}"

    environment = {k: interpolate(v) for k, v in compose["x-cdp-environment"].items()}
    assert executor_from_env(environment) is not None  # steps on the Celery workers
    services = compose["services"]
    postgres = services["postgres"]["environment"]
    for variable in ("DATABASE_URL", "DAGSTER_PG_URL"):
        url = urlsplit(environment[variable])
        assert url.hostname in services and url.hostname == "postgres", variable
        assert (url.port, url.username, url.path) == (5432, postgres["POSTGRES_USER"], "/cdp")
        assert url.password == interpolate(postgres["POSTGRES_PASSWORD"]), variable
    for variable in ("CDP_CELERY_BROKER", "CDP_CELERY_BACKEND"):
        url = urlsplit(environment[variable])
        assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379), variable


def test_no_secret_is_written_in_the_deploy_files(
    compose: dict[str, Any], helm: dict[str, Any], image: Image
) -> None:
    assert not written_secrets(compose)
    assert not written_secrets(helm)
    assert not written_secrets({"dockerfile": DOCKERFILE.read_text()})
    assert not [name for name in image.env if SECRET_NAME.search(name)], image.env
    assert "postgresqlPassword" not in helm["postgresql"]
    # The check finds what it looks for.
    assert written_secrets({"environment": {"VTEX_APP_TOKEN": "abc123"}})
    assert written_secrets({"url": "postgresql://cdp:hunter2@db:5432/cdp"})
    assert written_secrets({"password": "${CDP_POSTGRES_PASSWORD:-hunter2}"})
    assert not written_secrets({"url": "postgresql://cdp:${CDP_POSTGRES_PASSWORD}@db/cdp"})


def test_ports_and_names_agree_with_the_workspace(compose: dict[str, Any], image: Image) -> None:
    services = compose["services"]
    webserver, daemon = services["webserver"]["command"], services["daemon"]["command"]
    assert option(webserver, "-w") == option(daemon, "-w")
    workspace = load_yaml(image.repo_path(option(webserver, "-w")))
    assert image.repo_path(option(webserver, "-w")) == WORKSPACE
    (entry,) = workspace["load_from"]
    ((kind, server),) = entry.items()
    assert kind == "grpc_server", workspace
    code = services["code"]
    assert server["host"] in services and services[server["host"]] is code
    assert server["port"] == int(option(code["command"], "-p"))
    assert server["port"] == int(option(code["healthcheck"]["test"], "-p"))
    assert server["location_name"] == option(code["command"], "--location-name")
    (published,) = services["webserver"]["ports"]
    assert int(published.split(":")[-1]) == int(option(webserver, "-p"))
    assert {server["port"], int(option(webserver, "-p"))} <= image.exposed


def test_the_instance_config_loads_on_postgres(
    warehouse_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instance_config
) -> None:
    shutil.copy(INSTANCE_CONFIG, tmp_path / "dagster.yaml")
    with contextlib.ExitStack() as stack:
        monkeypatch.setenv("DAGSTER_PG_URL", dagster_storage_database(warehouse_url, stack))
        with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
            assert type(instance.run_storage).__name__ == "PooledPostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PooledPostgresEventLogStorage"
            assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
            assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
            loaded = instance.get_concurrency_config()
            runs = instance_config["concurrency"]["runs"]
            queue = loaded.run_queue_config
            assert queue.max_concurrent_runs == runs["max_concurrent_runs"]
            assert list(queue.tag_concurrency_limits) == runs["tag_concurrency_limits"]
            pools = instance_config["concurrency"]["pools"]
            assert loaded.pool_config.default_pool_limit == pools["default_limit"]
            assert loaded.pool_config.pool_granularity.value == pools["granularity"]


def test_the_helm_values_run_our_image_with_the_instance_limits(
    helm: dict[str, Any], image: Image, instance_config: dict[str, Any]
) -> None:
    for path, allowed in HELM_KEYS.items():
        section = functools.reduce(lambda d, key: d[key], path, helm)
        assert section.keys() <= allowed, f"{'.'.join(path) or 'top level'}: unknown keys"
    deployments = helm["dagster-user-deployments"]["deployments"]
    (deployment,) = deployments
    assert deployment.keys() <= USER_DEPLOYMENT_KEYS, deployment.keys()
    # The chart names the location after the deployment and runs `dagster api grpc <args>`.
    workspace_server = load_yaml(WORKSPACE)["load_from"][0]["grpc_server"]
    assert deployment["name"] == workspace_server["location_name"]
    args = deployment["dagsterApiGrpcArgs"]
    assert option(args, "-m") == option(image.cmd, "-m") == DEFINITIONS_MODULE
    check_command(["dagster", "api", "grpc", *args, "-p", str(deployment["port"])])
    assert deployment["image"]["repository"] and deployment["image"]["tag"]

    # Runs are Kubernetes Jobs with the default executor: nothing asks for Celery.
    assert helm["runLauncher"]["type"] == "K8sRunLauncher"
    assert not [path for path, value in leaves(helm) if EXECUTOR_ENV in (*path, value)]

    # Dagster's storage on the external Postgres, its password from a Secret.
    postgresql = helm["postgresql"]
    assert postgresql["enabled"] is False and postgresql["postgresqlHost"]
    assert helm["generatePostgresqlPasswordSecret"] is False
    assert helm["global"]["postgresqlSecretName"]

    # The run queue, pools, retries and monitoring of deploy/dagster.yaml.
    concurrency = helm["concurrency"]
    assert concurrency["enabled"] is True
    runs = instance_config["concurrency"]["runs"]
    assert concurrency["runs"]["maxConcurrentRuns"] == runs["max_concurrent_runs"]
    assert concurrency["runs"]["tagConcurrencyLimits"] == runs["tag_concurrency_limits"]
    pools = instance_config["concurrency"]["pools"]
    assert concurrency["pools"] == {
        "defaultLimit": pools["default_limit"],
        "granularity": pools["granularity"],
    }
    daemon, retries = helm["dagsterDaemon"], instance_config["run_retries"]
    assert daemon["runRetries"] == {
        "enabled": retries["enabled"],
        "maxRetries": retries["max_retries"],
        "retryOnAssetOrOpFailure": retries["retry_on_asset_or_op_failure"],
    }
    monitoring = instance_config["run_monitoring"]
    assert daemon["runMonitoring"]["startTimeoutSeconds"] == monitoring["start_timeout_seconds"]
    assert daemon["runMonitoring"]["cancelTimeoutSeconds"] == monitoring["cancel_timeout_seconds"]
    assert (
        daemon["runMonitoring"]["freeSlotsAfterRunEndSeconds"]
        == monitoring["free_slots_after_run_end_seconds"]
    )
    assert helm["additionalInstanceConfig"]["freshness"] == instance_config["freshness"]


def test_the_code_location_loads_with_the_compose_environment(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """What the `code` service runs, in its environment (Celery executor included)."""
    environment = {k: interpolate(v) for k, v in compose["x-cdp-environment"].items()}
    module = option(compose["services"]["code"]["command"], "-m")
    done = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-m", module],
        env={**os.environ, **environment, "DAGSTER_HOME": ""},
        cwd=tmp_path,  # its temporary instance folder goes here
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "All code locations passed validation" in output
