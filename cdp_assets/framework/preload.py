"""What the processes of a run import before their first step, imported once by the server
they are forked from (framework/executor.py, and the benchmark's run workers).

The code location is most of it. The rest is what Dagster imports lazily the first time a
process creates its instance: the Postgres storage classes, SQLAlchemy's psycopg2 dialect, the
path type of the instance's directories and the secrets loader. Forked from a server that had
imported the code location alone, every step process imported them before its step started;
with them, creating the instance is mostly connecting.
"""

# ruff: noqa: F401
import dagster._core.instance.factory
import dagster._core.secrets.env_file
import dagster._core.storage.root
import psycopg2.extras
import upath.implementations.local

import cdp_assets.definitions
import cdp_assets.framework.dagster_storage
