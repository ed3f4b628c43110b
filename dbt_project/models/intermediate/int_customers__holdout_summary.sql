-- The purchase summary as of the churn holdout's calibration date (var as_of minus var
-- churn_holdout_days): what the bands would have been told then, for marts.churn_holdout.
-- The churn holdout checks the bands: a weekly check, off the daily refresh (`dbt build
-- --exclude tag:weekly` is the daily one).
{{ config(tags=['weekly']) }}
{{ purchase_summary(holdout_calibration_date()) }}
