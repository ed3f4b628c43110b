-- Written by the `customer_predictions` asset (scipy fits dbt cannot run on Postgres) and
-- read by dbt as the source `analytics_python.customer_predictions`.
CREATE SCHEMA IF NOT EXISTS analytics_python;

CREATE TABLE analytics_python.customer_predictions (
    tenant_id              text NOT NULL,
    customer_key           text NOT NULL,
    as_of                  date NOT NULL,
    frequency_x            integer NOT NULL,
    recency_t_x_days       integer NOT NULL,
    age_t_days             integer NOT NULL,
    mean_repeat_spend      numeric(18, 2) NOT NULL,
    p_alive                double precision NOT NULL,
    p_no_purchase_90d      double precision NOT NULL,
    expected_purchases_1y  double precision NOT NULL,
    expected_purchases_3y  double precision NOT NULL,
    expected_purchases_5y  double precision NOT NULL,
    clv_1y                 numeric(18, 2) NOT NULL,
    clv_3y                 numeric(18, 2) NOT NULL,
    clv_5y                 numeric(18, 2) NOT NULL,
    model                  text NOT NULL CHECK (model IN ('bgnbd_gamma_gamma', 'heuristic')),
    fitted_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, customer_key)
);

-- One row per fit, so parameters can be compared across runs.
CREATE TABLE analytics_python.clv_fits (
    tenant_id        text NOT NULL,
    as_of            date NOT NULL,
    fitted_at        timestamptz NOT NULL DEFAULT now(),
    model            text NOT NULL,
    fallback_reason  text,
    customers        integer NOT NULL,
    repeaters        integer NOT NULL,
    bgnbd_r          double precision,
    bgnbd_alpha      double precision,
    bgnbd_a          double precision,
    bgnbd_b          double precision,
    bgnbd_log_likelihood double precision,
    gg_p             double precision,
    gg_q             double precision,
    gg_gamma         double precision,
    gg_log_likelihood double precision,
    PRIMARY KEY (tenant_id, fitted_at)
);
