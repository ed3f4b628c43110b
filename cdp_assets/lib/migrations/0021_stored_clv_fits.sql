-- The daily CLV fit is reused between refits (cdp_assets/analytics/prediction_refresh.py):
-- a refresh scores the customers whose purchase summary rows changed with the tenant's
-- latest fit on the same summary model.
--
-- summary_model: the summary a fit was made on; today's (int_customers__purchase_summary) and
-- the churn holdout's fits share the table, and only today's score today's customers. Fits
-- recorded before are left without one: the next refresh fits those tenants again.
-- heuristic_gap_days: the tenant's median gap between purchase days, which the heuristic
-- fallback scores customers with, as the models' parameters are for the models.
ALTER TABLE analytics_python.clv_fits
    ADD COLUMN summary_model text,
    ADD COLUMN heuristic_gap_days double precision;

-- summary_built_at: the build of the summary row a prediction scored (its built_at), so a
-- refresh finds the rows changed since by key and build. NULL on rows written before: the
-- next refresh scores every customer again.
ALTER TABLE analytics_python.customer_predictions ADD COLUMN summary_built_at timestamptz;
ALTER TABLE analytics_python.holdout_predictions ADD COLUMN summary_built_at timestamptz;
