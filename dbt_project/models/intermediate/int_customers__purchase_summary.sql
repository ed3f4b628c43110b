-- The purchase summary as of var as_of (macros/purchase_summary.sql).
{{ purchase_summary(as_of_date()) }}
