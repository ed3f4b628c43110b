import dagster as dg

from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.resources import MetaResource


def defs() -> dg.Definitions:
    return dg.Definitions(assets=[meta_custom_audiences], resources={"meta": MetaResource()})
