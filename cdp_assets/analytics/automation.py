"""Analytics runs as soon as a tenant's sources are fresh, through declarative automation
(after the orders feed's drains: `feed_changes_sensor`, sensors.py).

Dagster's `eager()` waits for every upstream partition, and a tenant's models depend on all
its order months, most of which a tenant never loads (history before its start): eager
would never fire. Its known bug (#34094) goes the other way and can request a partition
whose upstream is incomplete. So the condition is spelled out:

- something upstream was updated since this partition was last requested or updated
  (a model whose parent is requested on the same tick counts: the chain runs in one go);
- nothing upstream is in progress, and this partition is not already running;
- every upstream partition exists or is requested on the same tick, so a tenant without
  its catalog or customers never gets models built on half its data. Exempt: order months
  (history a tenant may never load), the tenants table with its view and the privacy
  suppressions (one relation for every tenant, not a per-tenant partition);
- no upstream partition's latest run failed.
"""

import dagster as dg

_NOT_PER_TENANT = dg.AssetSelection.assets(
    dg.AssetKey("vtex_orders"),
    dg.AssetKey(["cdp", "tenants"]),
    dg.AssetKey("stg_cdp__tenants"),
    dg.AssetKey(["cdp", "privacy_suppressions"]),
)
_absent = dg.AutomationCondition.missing() & ~dg.AutomationCondition.will_be_requested()

ANALYTICS_AUTOMATION = (
    dg.AutomationCondition.any_deps_updated().since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
    & ~dg.AutomationCondition.any_deps_match(_absent).ignore(_NOT_PER_TENANT)
    & ~dg.AutomationCondition.any_deps_match(dg.AutomationCondition.execution_failed())
).with_label("sources fresh and complete")
