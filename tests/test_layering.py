"""The package's layers, in the direction data flows: a module imports only from its own layer
and the layers before it. The development kit (sandboxes, benchmark, reliability runner) sits
apart: nothing of the product imports it but the commands that run it."""

from __future__ import annotations

import ast
from pathlib import Path

import cdp_assets

PACKAGE = Path(cdp_assets.__file__).resolve().parent
# source -> warehouse -> analytics -> audiences -> destinations -> operations, on shared parts.
LAYERS = (
    ("lib",),
    ("tenants", "partitions"),
    ("framework",),
    ("vtex",),
    ("analytics",),
    ("activation",),
    ("privacy",),
    ("ops",),
    ("definitions", "cli", "demo"),
)
DEVELOPMENT_KIT = ("sandbox", "bench", "reliability")
# Imports against the direction, each with why it is there.
ALLOWED = {
    # The forkserver's preload is what a run process imports before its first step: the code
    # location first of all.
    ("framework.preload", "definitions"),
    # Generating the surface file loads the definitions it describes (status reads the file).
    ("ops.surface", "definitions"),
}
# The commands that start the development kit's servers and runs.
KIT_USERS = {"cli", "demo"}


def _layer(top: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _imports(path: Path) -> set[str]:
    """Every cdp_assets module the file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "cdp_assets":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("cdp_assets."):
                found.add(node.module.removeprefix("cdp_assets."))
        elif isinstance(node, ast.Import):
            found |= {
                alias.name.removeprefix("cdp_assets.")
                for alias in node.names
                if alias.name.startswith("cdp_assets.")
            }
    return found


def _modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE).with_suffix("").parts): path
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent != PACKAGE
    }


def test_every_module_imports_only_its_own_layer_and_those_before_it() -> None:
    against = []
    for module, path in sorted(_modules().items()):
        top = module.split(".")[0]
        if top in DEVELOPMENT_KIT or top == "__init__":
            continue
        for imported in _imports(path):
            target = imported.split(".")[0]
            if target in DEVELOPMENT_KIT:
                if top not in KIT_USERS:
                    against.append(f"{module} -> {imported} (development kit)")
            elif _layer(target) > _layer(top) and (module, target) not in ALLOWED:
                against.append(f"{module} -> {imported}")
    assert against == []


def test_every_top_level_module_has_a_layer() -> None:
    tops = {module.split(".")[0] for module in _modules()}
    placed = {name for names in LAYERS for name in names} | set(DEVELOPMENT_KIT)
    assert tops - placed == set()


def test_the_framework_readme_lists_every_seam() -> None:
    readme = (PACKAGE / "framework" / "README.md").read_text()
    seams = sorted(p.name for p in (PACKAGE / "framework").glob("*.py") if p.name != "__init__.py")
    assert [name for name in seams if f"`{name}`" not in readme] == []
