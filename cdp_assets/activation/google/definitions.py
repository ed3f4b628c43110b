import dagster as dg

from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.google.resources import GoogleResource


def defs() -> dg.Definitions:
    return dg.Definitions(assets=[google_customer_match], resources={"google": GoogleResource()})
