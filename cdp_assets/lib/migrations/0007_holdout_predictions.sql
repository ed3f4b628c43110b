-- Written by the `holdout_predictions` asset: the same fit as customer_predictions, as of
-- the churn holdout's calibration date; read by dbt as the source
-- `analytics_python.holdout_predictions` (marts.churn_holdout).
CREATE TABLE analytics_python.holdout_predictions
    (LIKE analytics_python.customer_predictions INCLUDING ALL);
