"""The product's layers, in the direction data flows: a module imports only from its own layer
and the layers before it. The development kit (cdp_devkit: sandboxes, demo, benchmark,
reliability runner) sits apart: nothing of the product imports it."""

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
    ("definitions", "cli"),
)
# Imports against the direction, each with why it is there.
ALLOWED = {
    # The forkserver's preload is what a run process imports before its first step: the code
    # location first of all.
    ("framework.preload", "definitions"),
    # Generating the surface file loads the definitions it describes (status reads the file).
    ("ops.surface", "definitions"),
}


def _layer(top: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _imports(path: Path, package: str = "cdp_assets") -> set[str]:
    """Every module of `package` the file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == package:
                found |= {alias.name for alias in node.names}
            elif node.module.startswith(f"{package}."):
                found.add(node.module.removeprefix(f"{package}."))
        elif isinstance(node, ast.Import):
            found |= {
                alias.name.removeprefix(f"{package}.")
                for alias in node.names
                if alias.name == package or alias.name.startswith(f"{package}.")
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
        if top == "__init__":
            continue
        for imported in _imports(path):
            target = imported.split(".")[0]
            if _layer(target) > _layer(top) and (module, target) not in ALLOWED:
                against.append(f"{module} -> {imported}")
    assert against == []


def test_the_product_imports_nothing_of_the_development_kit() -> None:
    kit = {module: _imports(path, "cdp_devkit") for module, path in _modules().items()}
    assert {module: found for module, found in kit.items() if found} == {}


def test_every_top_level_module_has_a_layer() -> None:
    tops = {module.split(".")[0] for module in _modules()}
    placed = {name for names in LAYERS for name in names}
    assert tops - placed == set()


def test_the_framework_readme_lists_every_seam() -> None:
    readme = (PACKAGE / "framework" / "README.md").read_text()
    seams = sorted(p.name for p in (PACKAGE / "framework").glob("*.py") if p.name != "__init__.py")
    assert [name for name in seams if f"`{name}`" not in readme] == []
