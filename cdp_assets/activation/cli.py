"""`cdp destinations`: where each tenant's audiences go, and what each sync did."""

from __future__ import annotations

import json

import click
import psycopg

from cdp_assets.activation.destinations import (
    CONSENT,
    PLATFORMS,
    Destination,
    DestinationError,
    add_audience,
    add_destination,
)
from cdp_assets.lib.warehouse import migrated_url
from cdp_assets.tenants.registry import SLUG


def _connect() -> psycopg.Connection:
    return psycopg.connect(migrated_url())


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not key=value", param_hint=option)
        pairs[key] = rest
    return pairs


@click.group()
def destinations() -> None:
    """Add destinations (Meta, Google, VTEX collections), send audiences, read sync history."""


@destinations.command("list")
def destinations_list() -> None:
    """Every destination with its audiences."""
    with _connect() as conn:
        rows = conn.execute(
            """
            SELECT d.destination_id, d.tenant_id, d.platform, d.account_id, d.active, d.dry_run,
                   string_agg(a.audience || CASE WHEN a.active THEN '' ELSE ' (off)' END, ', '
                              ORDER BY a.audience)
            FROM cdp.destinations d LEFT JOIN cdp.destination_audiences a USING (destination_id)
            GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 2, 1
            """
        ).fetchall()
    click.echo(f"{'destination':<30}{'tenant':<14}{'platform':<22}{'account':<14}  audiences")
    for destination_id, tenant_id, platform, account, active, dry_run, audiences in rows:
        flags = "" if active else " [inactive]"
        flags += " [dry run]" if dry_run else ""
        click.echo(
            f"{destination_id:<30}{tenant_id:<14}{platform:<22}{account:<14}"
            f"  {audiences or '-'}{flags}"
        )


@destinations.command("add")
@click.argument("destination_id")
@click.option("--tenant", "tenant_id", required=True)
@click.option("--platform", required=True, type=click.Choice(PLATFORMS))
@click.option(
    "--account",
    default="",
    help="Meta ad account digits, or the Google Ads customer id (10 digits).",
)
@click.option("--login-account", default=None, help="Google manager account id, if any.")
@click.option(
    "--credential",
    multiple=True,
    help="role=ENV_VAR_NAME, e.g. access_token=META_ACME_TOKEN (never the secret itself).",
)
@click.option(
    "--consent",
    type=click.Choice([c.lower() for c in CONSENT]),
    default="unspecified",
    show_default=True,
    help="Google ad_user_data and ad_personalization consent for everyone sent.",
)
@click.option("--min-size", default=100, show_default=True, help="Skip smaller audiences.")
@click.option(
    "--max-removal-share",
    default=0.5,
    show_default=True,
    help="Refuse runs removing more than this share of members unless forced.",
)
@click.option("--dry-run", is_flag=True, help="Compute and record every run, send nothing.")
@click.option("--inactive", is_flag=True)
def destinations_add(
    destination_id: str,
    tenant_id: str,
    platform: str,
    account: str,
    login_account: str | None,
    credential: tuple[str, ...],
    consent: str,
    min_size: int,
    max_removal_share: float,
    dry_run: bool,
    inactive: bool,
) -> None:
    """Add (or update) a destination of a tenant."""
    destination = Destination(
        destination_id,
        tenant_id,
        platform,
        account,
        login_account,
        _pairs(credential, "--credential"),
        consent.upper(),
        consent.upper(),
        min_size,
        max_removal_share,
        dry_run,
        not inactive,
    )
    try:
        with _connect() as conn:
            add_destination(conn, destination)
    except (DestinationError, psycopg.errors.ForeignKeyViolation) as error:
        raise click.ClickException(str(error).splitlines()[0]) from None
    click.echo(f"destination {destination_id!r} saved")


@destinations.command("audience")
@click.argument("destination_id")
@click.argument("audience")
@click.option(
    "--param",
    multiple=True,
    help="Collection rule parameter key=value (JSON values), e.g. top_n=50.",
)
@click.option("--off", is_flag=True, help="Stop sending it (its members stay on the platform).")
def destinations_audience(
    destination_id: str, audience: str, param: tuple[str, ...], off: bool
) -> None:
    """Send an audience materialized view (or a collection rule) to a destination."""
    params = {}
    for key, value in _pairs(param, "--param").items():
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    try:
        with _connect() as conn:
            add_audience(conn, destination_id, audience, params, active=not off)
    except (DestinationError, psycopg.errors.ForeignKeyViolation) as error:
        raise click.ClickException(str(error).splitlines()[0]) from None
    click.echo(f"{audience!r} {'off' if off else 'on'} for {destination_id!r}")


@destinations.command("history")
@click.argument("destination_id", required=False)
@click.option("--limit", default=20, show_default=True)
def destinations_history(destination_id: str | None, limit: int) -> None:
    """The latest syncs (cdp.activation_runs), newest first."""
    if destination_id is not None and not SLUG.fullmatch(destination_id):
        raise click.BadParameter(f"{destination_id[:80]!r} is not a destination id (a slug)")
    with _connect() as conn:
        rows = conn.execute(
            """
            SELECT started_at, destination_id, audience, status, added, removed,
                   unchanged, rejected, coalesce(reason, '')
            FROM cdp.activation_runs
            WHERE %(destination)s::text IS NULL OR destination_id = %(destination)s
            ORDER BY activation_run_id DESC LIMIT %(limit)s
            """,
            {"destination": destination_id, "limit": limit},
        ).fetchall()
    click.echo(
        f"{'started':<17}{'destination':<28}{'audience':<30}{'status':<9}"
        f"{'added':>7}{'removed':>8}{'unchanged':>10}{'rejected':>9}  reason"
    )
    for started, dest, audience, status, *counts, reason in rows:
        click.echo(
            f"{started:%Y-%m-%d %H:%M}  {dest:<28}{audience:<30}{status:<9}"
            + "".join(f"{c:>{w}}" for c, w in zip(counts, (7, 8, 10, 9), strict=True))
            + f"  {reason[:80]}"
        )
