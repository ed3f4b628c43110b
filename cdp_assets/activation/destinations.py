"""Destinations in `cdp.destinations` and the audiences each one receives.

Credentials are stored as environment variable names per role and resolved only when a run
needs them, so a secret never sits in a table, a log line or Dagster metadata.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from cdp_assets.lib.credentials import CredentialError, read_credential
from cdp_assets.tenants.registry import ENV_REF, SLUG

PLATFORMS = ("meta", "google_data_manager", "google_ads", "vtex_collections", "vtex_masterdata")
CONSENT = ("GRANTED", "DENIED", "UNSPECIFIED")
# Whose data a destination may receive, from the customer's Master Data newsletter choice:
# everyone in the audience, only those who opted in, or everyone but those who opted out.
CONSENT_POLICIES = ("none", "newsletter_opt_in", "not_opted_out")
# Roles each platform needs; values are environment variable names. Meta also takes
# `app_secret`: given, every call carries `appsecret_proof`, which an app with "Require App
# Secret" on demands.
CREDENTIAL_ROLES: dict[str, tuple[str, ...]] = {
    "meta": ("access_token",),
    "google_data_manager": (),  # service credentials: GOOGLE_APPLICATION_CREDENTIALS / ADC
    "google_ads": ("developer_token",),
    "vtex_collections": (),  # the tenant's own VTEX credentials
    "vtex_masterdata": (),
}


class DestinationError(ValueError):
    """A destination that cannot be registered or used, with a message for the operator."""


@dataclass(frozen=True)
class Destination:
    destination_id: str
    tenant_id: str
    platform: str
    account_id: str = ""
    login_account_id: str | None = None
    credential_refs: dict[str, str] = field(default_factory=dict)
    ad_user_data_consent: str = "UNSPECIFIED"
    ad_personalization_consent: str = "UNSPECIFIED"
    min_audience_size: int = 100
    max_removal_share: float = 0.5
    dry_run: bool = False
    active: bool = True
    # An audience deleted on the platform is created again with every member; off, its sync
    # fails naming the cause until `cdp destinations reset`.
    recreate_deleted_audiences: bool = True
    consent_policy: str = "none"

    def validate(self) -> None:
        problems = []
        if not SLUG.fullmatch(self.destination_id):
            problems.append(f"destination id {self.destination_id[:80]!r} is not a slug")
        if not SLUG.fullmatch(self.tenant_id):
            problems.append(f"tenant id {self.tenant_id[:80]!r} is not a slug")
        if self.platform not in PLATFORMS:
            problems.append(f"platform must be one of {', '.join(PLATFORMS)}")
        elif self.platform.startswith("google") and not re.fullmatch(r"[0-9]{10}", self.account_id):
            problems.append("a Google Ads customer id is 10 digits, no dashes")
        elif self.platform == "meta" and not re.fullmatch(r"[0-9]{1,20}", self.account_id):
            problems.append("a Meta ad account id is its digits, without 'act_'")
        if self.login_account_id is not None and not re.fullmatch(
            r"[0-9]{10}", self.login_account_id
        ):
            problems.append("the login (manager) account id is 10 digits, no dashes")
        for role in CREDENTIAL_ROLES.get(self.platform, ()):
            if role not in self.credential_refs:
                problems.append(f"credential reference {role!r} is missing")
        for role, ref in self.credential_refs.items():
            if not isinstance(ref, str) or not ENV_REF.fullmatch(ref):
                problems.append(f"credential reference {role!r} is not an environment variable")
        for consent in (self.ad_user_data_consent, self.ad_personalization_consent):
            if consent not in CONSENT:
                problems.append(f"consent must be one of {', '.join(CONSENT)}")
        unset = "UNSPECIFIED" in (self.ad_user_data_consent, self.ad_personalization_consent)
        if self.platform.startswith("google") and unset:
            problems.append(
                "Google needs the consent the members gave (--consent granted or denied):"
                " unspecified consent is treated as refused for EEA users"
            )
        if self.consent_policy not in CONSENT_POLICIES:
            problems.append(f"consent policy must be one of {', '.join(CONSENT_POLICIES)}")
        if self.min_audience_size < 0 or not 0 <= self.max_removal_share <= 1:
            problems.append("min_audience_size must be >= 0 and max_removal_share in [0, 1]")
        if problems:
            raise DestinationError(
                f"destination {self.destination_id[:80]!r} is invalid: " + "; ".join(problems)
            )

    def credential(self, role: str) -> str:
        """The secret for a role, read from the environment at the moment it is needed; refused
        naming its variable (never the value) when unset or unusable."""
        ref = self.credential_refs.get(role)
        if ref is None:
            raise DestinationError(f"destination {self.destination_id!r} has no {role!r} reference")
        try:
            return read_credential(ref)
        except CredentialError as error:
            raise DestinationError(f"destination {self.destination_id!r}: {error}") from None


@dataclass(frozen=True)
class DestinationAudience:
    destination: Destination
    audience: str
    params: dict[str, Any]
    platform_audience_id: str | None
    # The membership signature stored by its last completed sync (None: never completed).
    synced_signature: str | None = None
    # Failed syncs since the last completed one (or the last reset), the latest ended then.
    failures_in_a_row: int = 0
    last_failed_at: datetime | None = None

    def resting_until(self, now: datetime) -> datetime | None:
        """While its syncs keep failing, when its changes may be pushed again; None: now."""
        return resting_until(self.failures_in_a_row, self.last_failed_at, now)


# After a failed sync, pushes of changes leave the destination audience alone this long, twice
# as long after each further failure in a row, up to LONGEST_REST: a destination that keeps
# failing is tried (and alerts) a few times a day, not after every refresh that changed its
# members. The 48-hour push and a push started by hand try it whatever.
FIRST_REST = timedelta(minutes=15)
LONGEST_REST = timedelta(hours=12)


def resting_until(
    failures_in_a_row: int, last_failed_at: datetime | None, now: datetime
) -> datetime | None:
    """When changes may be pushed again to a destination audience whose syncs failed
    `failures_in_a_row` times in a row, the last ending at `last_failed_at`; None: at `now`."""
    if failures_in_a_row <= 0 or last_failed_at is None:
        return None
    doublings = min(failures_in_a_row - 1, 16)  # past the cap long before; no overflow
    until = last_failed_at + min(FIRST_REST * 2**doublings, LONGEST_REST)
    return until if until > now else None


_COLUMNS = (
    "destination_id, tenant_id, platform, account_id, login_account_id, credential_refs,"
    " ad_user_data_consent, ad_personalization_consent, min_audience_size, max_removal_share,"
    " dry_run, active, recreate_deleted_audiences, consent_policy"
)
_COLUMN_COUNT = len(_COLUMNS.split(","))


def _destination(row: tuple[Any, ...]) -> Destination:
    values = list(row)
    values[9] = float(values[9]) if isinstance(values[9], Decimal) else values[9]
    return Destination(*values)


def add_destination(conn: psycopg.Connection, destination: Destination) -> None:
    """Insert or update a destination (by id) after validating it. An update keeps the
    destination's consent policy: only `set_consent_policy` changes it, so saving a destination
    again never widens whom it receives."""
    destination.validate()
    values = [getattr(destination, name.strip()) for name in _COLUMNS.split(",")]
    values[5] = Jsonb(destination.credential_refs)
    updates = ", ".join(
        f"{name.strip()} = excluded.{name.strip()}"
        for name in _COLUMNS.split(",")[1:]
        if name.strip() != "consent_policy"
    )
    conn.execute(
        f"INSERT INTO cdp.destinations ({_COLUMNS})"
        f" VALUES ({', '.join(['%s'] * len(values))})"
        f" ON CONFLICT (destination_id) DO UPDATE SET {updates}, updated_at = now()",
        values,
    )


def add_audience(
    conn: psycopg.Connection,
    destination_id: str,
    audience: str,
    params: dict[str, Any] | None = None,
    *,
    active: bool = True,
) -> None:
    """Send an audience (or a collection rule) to a destination; keeps its platform id."""
    if not SLUG.fullmatch(destination_id):
        raise DestinationError(f"destination id {destination_id[:80]!r} is not a slug")
    if not SLUG.fullmatch(audience):
        raise DestinationError(f"audience {audience[:80]!r} is not a model name")
    conn.execute(
        """
        INSERT INTO cdp.destination_audiences (destination_id, audience, params, active)
        VALUES (%s, %s, %s, %s)
        ON CONFLICT (destination_id, audience) DO UPDATE
           SET params = excluded.params, active = excluded.active
        """,
        (destination_id, audience, Jsonb(params or {}), active),
    )


def destination_audiences(
    conn: psycopg.Connection, tenant_id: str, platforms: tuple[str, ...]
) -> list[DestinationAudience]:
    """Active audiences of a tenant's active destinations on these platforms."""
    prefixed = ", ".join(f"d.{name.strip()}" for name in _COLUMNS.split(","))
    rows = conn.execute(
        f"""
        SELECT {prefixed}, a.audience, a.params, a.platform_audience_id, a.synced_signature,
               a.failures_in_a_row, a.last_failed_at
        FROM cdp.destinations d
        JOIN cdp.destination_audiences a USING (destination_id)
        WHERE d.tenant_id = %s AND d.platform = ANY(%s) AND d.active AND a.active
        ORDER BY d.destination_id, a.audience
        """,
        (tenant_id, list(platforms)),
    ).fetchall()
    return [
        DestinationAudience(_destination(row[:_COLUMN_COUNT]), *row[_COLUMN_COUNT:]) for row in rows
    ]


def set_platform_audience_id(
    conn: psycopg.Connection, destination_id: str, audience: str, platform_audience_id: str
) -> None:
    conn.execute(
        "UPDATE cdp.destination_audiences SET platform_audience_id = %s"
        " WHERE destination_id = %s AND audience = %s",
        (platform_audience_id, destination_id, audience),
    )


def get_destination(conn: psycopg.Connection, destination_id: str) -> Destination:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM cdp.destinations WHERE destination_id = %s", (destination_id,)
    ).fetchone()
    if row is None:
        raise DestinationError(f"no destination {destination_id[:80]!r}")
    return _destination(row)


def set_consent_policy(conn: psycopg.Connection, destination_id: str, policy: str) -> None:
    """Whose data the destination may receive (CONSENT_POLICIES); the next sync removes the
    members the policy leaves out. Not committed."""
    if policy not in CONSENT_POLICIES:
        raise DestinationError(f"consent policy must be one of {', '.join(CONSENT_POLICIES)}")
    if not conn.execute(
        "UPDATE cdp.destinations SET consent_policy = %s, updated_at = now()"
        " WHERE destination_id = %s",
        (policy, destination_id),
    ).rowcount:
        raise DestinationError(f"no destination {destination_id[:80]!r}")


def destination_exists(conn: psycopg.Connection, destination_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM cdp.destinations WHERE destination_id = %s", (destination_id,)
    ).fetchone()
    return row is not None


@dataclass(frozen=True)
class ForgottenAudience:
    """What was forgotten of one destination audience: the platform's id for it, if it had
    one, and how many members the platform had confirmed."""

    audience: str
    platform_audience_id: str | None
    confirmed_members: int


@dataclass(frozen=True)
class FailingAudience:
    """An active destination audience whose last syncs failed."""

    destination_id: str
    tenant_id: str
    audience: str
    failures_in_a_row: int
    last_failed_at: datetime


def failing_audiences(conn: psycopg.Connection, tenant_ids: list[str]) -> list[FailingAudience]:
    """The active audiences of these tenants' active destinations whose last syncs failed."""
    rows = conn.execute(
        """
        SELECT d.destination_id, d.tenant_id, a.audience, a.failures_in_a_row, a.last_failed_at
        FROM cdp.destinations d
        JOIN cdp.destination_audiences a USING (destination_id)
        WHERE d.tenant_id = ANY(%s) AND d.active AND a.active AND a.failures_in_a_row > 0
          AND a.last_failed_at IS NOT NULL
        ORDER BY d.tenant_id, d.destination_id, a.audience
        """,
        (tenant_ids,),
    ).fetchall()
    return [FailingAudience(*row) for row in rows]


def end_rest(conn: psycopg.Connection, destination_id: str, audience: str | None = None) -> int:
    """Forget the failures in a row of the destination's audiences (every one when `audience`
    is None), so that the sensors push their changes at once; how many were resting or
    failing. Not committed."""
    return conn.execute(
        """
        UPDATE cdp.destination_audiences SET failures_in_a_row = 0, last_failed_at = NULL
        WHERE destination_id = %s AND (%s::text IS NULL OR audience = %s)
          AND failures_in_a_row > 0
        """,
        (destination_id, audience, audience),
    ).rowcount


def forget_platform_state(
    conn: psycopg.Connection, destination_id: str, audience: str | None = None
) -> list[ForgottenAudience]:
    """Forget what the platform held for an audience of the destination (every audience when
    `audience` is None): its id there, the members it confirmed and the membership signature
    last synced. The next sync creates the audience anew and sends every member. Not
    committed: the caller's transaction decides."""
    rows = conn.execute(
        """
        WITH forgotten AS (
            SELECT audience, platform_audience_id FROM cdp.destination_audiences
            WHERE destination_id = %(destination_id)s
              AND (%(audience)s::text IS NULL OR audience = %(audience)s)
            FOR UPDATE
        ), confirmed AS (
            DELETE FROM cdp.destination_members m USING forgotten f
            WHERE m.destination_id = %(destination_id)s AND m.audience = f.audience
            RETURNING m.audience
        ), cleared AS (
            UPDATE cdp.destination_audiences a
               SET platform_audience_id = NULL, synced_signature = NULL
            FROM forgotten f
            WHERE a.destination_id = %(destination_id)s AND a.audience = f.audience
        )
        SELECT f.audience, f.platform_audience_id,
               (SELECT count(*) FROM confirmed c WHERE c.audience = f.audience)
        FROM forgotten f ORDER BY f.audience
        """,
        {"destination_id": destination_id, "audience": audience},
    ).fetchall()
    return [ForgottenAudience(*row) for row in rows]
