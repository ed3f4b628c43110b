"""Partitions shared by every tenant-scoped asset."""

import dagster as dg

tenants = dg.DynamicPartitionsDefinition(name="tenants")

# VTEX order dates are UTC, so month windows are UTC too; the current month is a
# partition (end_offset=1) so the twice-daily sync has somewhere to land.
order_months = dg.MonthlyPartitionsDefinition(start_date="2020-01-01", end_offset=1)

tenant_months = dg.MultiPartitionsDefinition({"tenant": tenants, "month": order_months})
