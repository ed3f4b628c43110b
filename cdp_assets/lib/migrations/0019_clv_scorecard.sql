-- Written by the `clv_scorecard` asset (cdp_assets/analytics/assets.py): the CLV
-- fit as of the churn holdout's calibration date scored on the purchases since, against a naive
-- baseline. Computed in Python (the expected purchases need a hypergeometric function), and a
-- series over calibration dates that no dbt rebuild may drop. The quality gate of activation
-- reads each tenant's latest row (cdp_assets/activation/quality_gate.py).
CREATE TABLE analytics_python.clv_scorecard (
    tenant_id text NOT NULL,
    calibration_date date NOT NULL,
    holdout_days integer NOT NULL,
    customers integer NOT NULL,
    model text NOT NULL,
    fallback_reason text,
    beats_baseline boolean NOT NULL,
    actual_purchases double precision NOT NULL,
    predicted_purchases double precision,
    baseline_purchases double precision NOT NULL,
    purchases_mae double precision,
    baseline_purchases_mae double precision NOT NULL,
    purchases_bias double precision,
    baseline_purchases_bias double precision,
    purchases_rank_correlation double precision,
    baseline_purchases_rank_correlation double precision,
    purchases_top_decile_share double precision,
    baseline_purchases_top_decile_share double precision,
    actual_spend double precision NOT NULL,
    predicted_spend double precision,
    baseline_spend double precision NOT NULL,
    spend_mae double precision,
    baseline_spend_mae double precision NOT NULL,
    spend_bias double precision,
    baseline_spend_bias double precision,
    spend_rank_correlation double precision,
    baseline_spend_rank_correlation double precision,
    spend_top_decile_share double precision,
    baseline_spend_top_decile_share double precision,
    computed_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, calibration_date)
);
CREATE TABLE analytics_python.clv_scorecard_deciles (
    tenant_id text NOT NULL,
    calibration_date date NOT NULL,
    decile smallint NOT NULL,
    customers integer NOT NULL,
    predicted_purchases double precision NOT NULL,
    actual_purchases double precision NOT NULL,
    baseline_purchases double precision NOT NULL,
    predicted_spend double precision NOT NULL,
    actual_spend double precision NOT NULL,
    baseline_spend double precision NOT NULL,
    PRIMARY KEY (tenant_id, calibration_date, decile)
);
CREATE TABLE analytics_python.clv_scorecard_customers (
    tenant_id text NOT NULL,
    customer_key text NOT NULL,
    calibration_date date NOT NULL,
    actual_purchases integer NOT NULL,
    predicted_purchases double precision,
    baseline_purchases double precision NOT NULL,
    actual_spend numeric(18, 2) NOT NULL,
    predicted_spend double precision,
    baseline_spend double precision NOT NULL,
    PRIMARY KEY (tenant_id, customer_key)
);
