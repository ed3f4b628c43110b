import dagster as dg

from cdp_assets.activation.triggers import (
    activation_every_48_hours,
    activation_push,
    audience_changes_sensor,
    pending_verdicts_sensor,
)


def defs() -> dg.Definitions:
    return dg.Definitions(
        jobs=[activation_push],
        schedules=[activation_every_48_hours],
        sensors=[audience_changes_sensor, pending_verdicts_sensor],
    )
