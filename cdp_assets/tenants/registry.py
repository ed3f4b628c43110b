"""The tenants table: validation, registration and lookup.

A tenant is refused before any API call when its slug, account or credential references
are malformed, or when a referenced credential is not set in the environment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

import psycopg

from cdp_assets.lib.credentials import CredentialError, read_credential

# Always used with fullmatch: with match, Python's $ also matches before a final newline,
# so "acme\n" would pass as a slug.
SLUG = re.compile(r"^[a-z][a-z0-9_]{1,62}$")
ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_REF = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
ENVIRONMENTS = ("vtexcommercestable", "vtexcommercebeta")
# VTEX's List orders and Get order: "You can only access information from orders created in
# the last two years". Older orders are imported from files (`cdp tenants import-orders`).
VTEX_ORDER_YEARS = 2


def vtex_orders_available_from(now: datetime) -> datetime:
    """The oldest creation instant whose orders VTEX's API is trusted to serve at `now`: two
    years back, then on to the second UTC midnight after. VTEX does not document the
    boundary's exact instant, so the orders of that margin come from files too, rather than
    from a list that may silently leave them out."""
    try:
        two_years = now.replace(year=now.year - VTEX_ORDER_YEARS)
    except ValueError:  # 29 February
        two_years = now.replace(year=now.year - VTEX_ORDER_YEARS, day=28)
    return datetime.combine(two_years.date() + timedelta(days=2), time(), UTC)


def default_history_start() -> date:
    """Where a new tenant's order history starts: as far back as VTEX serves orders."""
    return vtex_orders_available_from(datetime.now(UTC)).date()


class TenantError(ValueError):
    """A tenant that cannot be registered or synced, with a message for the operator."""


@dataclass(frozen=True)
class Credentials:
    app_key: str
    app_token: str = field(repr=False)

    def __repr__(self) -> str:  # never print either value
        return "Credentials(<redacted>)"


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    account_name: str
    app_key_ref: str
    app_token_ref: str
    environment: str = "vtexcommercestable"
    active: bool = True
    priority: int = 100
    history_start: date = field(default_factory=default_history_start)
    default_country: str = "BR"

    def validate(self) -> None:
        problems = []
        if not SLUG.fullmatch(self.tenant_id):
            problems.append(
                f"tenant id {self.tenant_id[:80]!r} is not a slug (lower-case letters, digits and"
                " '_', starting with a letter, 2-63 characters)"
            )
        if not ACCOUNT.fullmatch(self.account_name):
            problems.append(f"account name {self.account_name[:80]!r} is not a VTEX account name")
        if self.environment not in ENVIRONMENTS:
            problems.append(f"environment must be one of {', '.join(ENVIRONMENTS)}")
        for label, ref in (("app key", self.app_key_ref), ("app token", self.app_token_ref)):
            if not ref:
                problems.append(f"the {label} reference is missing")
            elif not ENV_REF.fullmatch(ref):
                problems.append(
                    f"the {label} reference {ref[:80]!r} is not an environment variable name"
                )
        if not re.fullmatch(r"[A-Z]{2}", self.default_country):
            problems.append("default country must be an ISO-3166 alpha-2 code such as 'BR'")
        if problems:
            raise TenantError(f"tenant {self.tenant_id[:80]!r} is invalid: " + "; ".join(problems))

    def credentials(self) -> Credentials:
        """Resolve the credential references; refuses with the names of what is missing or
        unusable (whitespace around a value, control characters in it), never the values."""
        self.validate()
        missing = [ref for ref in (self.app_key_ref, self.app_token_ref) if not os.environ.get(ref)]
        if missing:
            raise TenantError(
                f"tenant {self.tenant_id!r}: credential reference(s) {', '.join(missing)} not set"
                " in the environment"
            )
        try:
            return Credentials(
                read_credential(self.app_key_ref), read_credential(self.app_token_ref)
            )
        except CredentialError as error:
            raise TenantError(f"tenant {self.tenant_id!r}: {error}") from None


# In the order of Tenant's fields, so a row builds a Tenant positionally.
_COLUMNS = (
    "tenant_id, account_name, app_key_ref, app_token_ref, environment, active, priority,"
    " history_start, default_country"
)


def add_tenant(conn: psycopg.Connection, tenant: Tenant) -> None:
    """Insert or update a tenant (by id) after validating it."""
    tenant.validate()
    conn.execute(
        f"""
        INSERT INTO cdp.tenants ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id) DO UPDATE SET
            account_name = excluded.account_name, app_key_ref = excluded.app_key_ref,
            app_token_ref = excluded.app_token_ref, environment = excluded.environment,
            active = excluded.active, priority = excluded.priority,
            history_start = excluded.history_start, default_country = excluded.default_country,
            updated_at = now()
        """,
        (
            tenant.tenant_id,
            tenant.account_name,
            tenant.app_key_ref,
            tenant.app_token_ref,
            tenant.environment,
            tenant.active,
            tenant.priority,
            tenant.history_start,
            tenant.default_country,
        ),
    )


def _require_slug(tenant_id: str) -> None:
    # Not a slug, so not in the table: refused before the query, which could not even carry
    # some such values (NUL, or the lone surrogates undecodable argv bytes become).
    if not isinstance(tenant_id, str) or not SLUG.fullmatch(tenant_id):
        raise TenantError(f"no tenant {str(tenant_id)[:80]!r}: tenant ids are slugs")


def set_active(conn: psycopg.Connection, tenant_id: str, active: bool) -> None:
    _require_slug(tenant_id)
    updated = conn.execute(
        "UPDATE cdp.tenants SET active = %s, updated_at = now() WHERE tenant_id = %s",
        (active, tenant_id),
    ).rowcount
    if not updated:
        raise TenantError(f"no tenant {tenant_id!r}")


def list_tenants(conn: psycopg.Connection, *, active_only: bool = False) -> list[Tenant]:
    where = "WHERE active" if active_only else ""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM cdp.tenants {where} ORDER BY priority, tenant_id"
    ).fetchall()
    return [Tenant(*row) for row in rows]


def get_tenant(conn: psycopg.Connection, tenant_id: str) -> Tenant:
    """The tenant to sync; refuses unknown and inactive tenants."""
    _require_slug(tenant_id)
    row = conn.execute(f"SELECT {_COLUMNS} FROM cdp.tenants WHERE tenant_id = %s", (tenant_id,))
    found = row.fetchone()
    if found is None:
        raise TenantError(f"no tenant {tenant_id!r} in cdp.tenants")
    tenant = Tenant(*found)
    if not tenant.active:
        raise TenantError(f"tenant {tenant_id!r} is deactivated; activate it to sync")
    return tenant
