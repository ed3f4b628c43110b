"""The code location's committed surface (cdp_assets/ops/surface.json) equals the one generated
from the definitions: `cdp status` and the health verdict read it instead of loading the code
location, and review sees any change of an asset, check, job, schedule or sensor as a change
of the file."""

from importlib.resources import files

from cdp_assets.definitions import defs
from cdp_assets.ops.surface import REGENERATE, SURFACE_FILE, describe, render


def test_the_committed_surface_is_the_definitions() -> None:
    committed = (files("cdp_assets.ops") / SURFACE_FILE).read_text()
    assert render(describe(defs)) == committed, (
        f"the code location changed: review, then regenerate its surface ({REGENERATE})"
    )
