"""Analytics runs as soon as a tenant's sources are fresh, through declarative automation
(after the orders feed's drains: `feed_changes_sensor`, sensors.py).

Dagster's `eager()` waits for every upstream partition, and a tenant's models depend on all
its order months, most of which a tenant never loads (history before its start): eager
would never fire. Its known bug (#34094) goes the other way and can request a partition
whose upstream is incomplete. So the condition is spelled out:

- something upstream was updated since this partition was last requested or updated
  (a model whose parent is requested on the same tick counts: the chain runs in one go), by
  a run that did not refresh this partition too: a run of a job tagged
  REFRESHES_WHAT_FOLLOWS (the chain's refresh after the feed, the audiences' refresh) builds
  everything automated downstream of what it updates;
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

# The tag of the jobs whose runs refresh every automated asset downstream of what they update.
# Dagster's own test of "the run that updated the parent also ran this asset"
# (executed_with_root_target, in any_deps_updated) reads only the asset's latest
# materialization: of a run over 41 tenants it recognised one, and automation requested the
# other 40 again whenever a tick fell between a run's updates of a parent and of its children.
REFRESHES_WHAT_FOLLOWS = "cdp/refreshes-what-follows"
_updated_alone = (
    dg.AutomationCondition.newly_updated()
    & ~dg.AutomationCondition.executed_with_root_target()
    & ~dg.AutomationCondition.all_new_updates_have_run_tags(tag_keys={REFRESHES_WHAT_FOLLOWS})
).with_label("updated by a run that left it")
_deps_updated = dg.AutomationCondition.any_deps_match(
    _updated_alone | dg.AutomationCondition.will_be_requested()
).with_label("any_deps_updated")

ANALYTICS_AUTOMATION = (
    _deps_updated.since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
    & ~dg.AutomationCondition.any_deps_match(_absent).ignore(_NOT_PER_TENANT)
    & ~dg.AutomationCondition.any_deps_match(dg.AutomationCondition.execution_failed())
).with_label("sources fresh and complete")
