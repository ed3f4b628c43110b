"""The operations metrics' thresholds, as the Dagster resource their asset reads."""

import dagster as dg

from cdp_assets.ops.metrics import Threshold, load_thresholds


class OpsMetricsResource(dg.ConfigurableResource):
    """Thresholds of the operations metrics: the defaults (ops/metrics.py), then
    $CDP_OPS_THRESHOLDS, then `thresholds` here, e.g. `{"avg_sync_seconds": {"alert": 600}}`.
    `cdp status` reads only the first two."""

    thresholds: dict[str, dict[str, float]] = {}

    def in_force(self) -> dict[str, Threshold]:
        return load_thresholds(self.thresholds)
