-- The last judged state of each operations metric (cdp_assets/ops/metrics.py), per subject,
-- so the `operations_metrics` asset alerts once when a metric crosses its alert threshold
-- (and once when it recovers) instead of at every evaluation.
CREATE TABLE cdp.ops_metric_states (
    metric       text NOT NULL,
    -- The tenant or VTEX account the figure is about; '' for platform-wide metrics.
    subject      text NOT NULL DEFAULT '',
    severity     text NOT NULL CHECK (severity IN ('ok', 'warn', 'error')),
    value        double precision,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    evaluated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (metric, subject)
);
