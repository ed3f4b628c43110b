"""Settings: every environment variable the platform reads is declared once, with its default
and meaning, read through the settings module, and documented by the generated
docs/configuration.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cdp_assets.lib import settings
from cdp_assets.ops.maintenance import EVERY_RETENTION

PACKAGE = Path(settings.__file__).resolve().parents[1]
READERS = {"value", "required", "positive_number"}


def _product_modules() -> list[Path]:
    """The product's modules; the development kit (cdp_devkit) has variables of its own."""
    return sorted(PACKAGE.rglob("*.py"))


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _reads(tree: ast.AST) -> tuple[set[str], list[str]]:
    """(names read through the settings module or named by an *_ENV constant, direct reads of
    os.environ with a literal name)."""
    named, direct = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, text = node.targets[0], _literal(node.value)
            if isinstance(target, ast.Name) and target.id.endswith("_ENV") and text:
                named.add(text)
        if isinstance(node, ast.Call) and node.args and _literal(node.args[0]):
            function, name = node.func, _literal(node.args[0])
            if isinstance(function, ast.Attribute) and function.attr in READERS:
                named.add(name)
            elif isinstance(function, ast.Attribute) and (
                function.attr == "getenv" or function.attr == "get" and _is_environ(function.value)
            ):
                direct.append(name)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _is_environ(node.value)
            and _literal(node.slice)
        ):
            direct.append(_literal(node.slice))
    return named, direct


def test_every_variable_the_product_reads_is_declared_and_read_through_the_settings() -> None:
    named: set[str] = set()
    direct: dict[str, list[str]] = {}
    for path in _product_modules():
        found, bypassing = _reads(ast.parse(path.read_text(), str(path)))
        named |= found
        if bypassing:
            direct[str(path.relative_to(PACKAGE))] = bypassing
    named |= {retention.setting for retention in EVERY_RETENTION}
    assert direct == {}
    assert named - set(settings.BY_NAME) == set()
    # Nothing declared that nothing reads (the dbt project reads the ones set for dbt).
    unread = {s.name for s in settings.SETTINGS if not s.internal} - named
    assert unread == set()


def test_the_configuration_page_is_generated_from_the_settings() -> None:
    page = PACKAGE.parent / "docs" / "configuration.md"
    assert page.read_text() == settings.configuration_markdown(), (
        "regenerate: python -m cdp_assets.lib.settings > docs/configuration.md"
    )
    for setting in settings.SETTINGS:
        assert f"| `{setting.name}` |" in page.read_text()


def test_a_blank_setting_takes_its_default_and_a_set_one_wins() -> None:
    assert settings.value("VTEX_REQUESTS_PER_SECOND", {}) == "80"
    assert settings.value("VTEX_REQUESTS_PER_SECOND", {"VTEX_REQUESTS_PER_SECOND": " "}) == "80"
    assert (
        settings.positive_number("VTEX_REQUESTS_PER_SECOND", {"VTEX_REQUESTS_PER_SECOND": "12.5"})
        == 12.5
    )
    assert settings.value("CDP_ALERT_WEBHOOK_URL", {}) is None


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan", "inf"])
def test_a_number_setting_that_is_not_a_positive_number_is_refused(raw: str) -> None:
    with pytest.raises(settings.SettingError, match="CDP_DB_CONNECT_TIMEOUT_SECONDS"):
        settings.positive_number(
            "CDP_DB_CONNECT_TIMEOUT_SECONDS", {"CDP_DB_CONNECT_TIMEOUT_SECONDS": raw}
        )


def test_an_undeclared_setting_is_refused() -> None:
    with pytest.raises(settings.SettingError, match="not a declared setting"):
        settings.value("CDP_NO_SUCH_SETTING")
