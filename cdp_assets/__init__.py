"""Customer data platform for multi-tenant VTEX stores on Dagster, dbt and Postgres."""

import warnings

# Dagster marks some APIs the code location relies on (partitioned asset checks, mapping
# resolved asset specs, backfill policies) as preview or beta, and warns once per definition
# in every process that loads it: the CLI, the webserver, the daemon, each run. The APIs are
# pinned with Dagster's version; the warnings tell an operator nothing to act on.
warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview)")
