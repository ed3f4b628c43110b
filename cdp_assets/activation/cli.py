"""`cdp destinations`: where each tenant's audiences go, and what each sync did."""

from __future__ import annotations

import difflib
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
    destination_exists,
    end_rest,
    forget_platform_state,
    get_destination,
)
from cdp_assets.activation.sync import abandon_requests
from cdp_assets.activation.vtex_masterdata.writeback import AUDIENCE as MASTERDATA_AUDIENCE
from cdp_assets.activation.vtex_masterdata.writeback import (
    WritebackFields,
    destination_fields,
    how_to_create,
    missing_fields,
)
from cdp_assets.lib.ages import format_age
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.tenants.registry import SLUG, TenantError
from cdp_assets.vtex.client import VtexError


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


def _require_slug(value: str, what: str) -> None:
    if not SLUG.fullmatch(value):
        raise click.BadParameter(f"{value[:80]!r} is not {what} (a slug)")


def _require_destination(conn: psycopg.Connection, destination_id: str) -> None:
    _require_slug(destination_id, "a destination id")
    if not destination_exists(conn, destination_id):
        raise click.ClickException(
            f"no destination {destination_id!r} (cdp destinations list shows them)"
        )


@destinations.command("list")
def destinations_list() -> None:
    """Every destination with its audiences; an audience whose last syncs failed says how many
    in a row (its changes rest between attempts: `cdp destinations history` says why)."""
    with _connect() as conn:
        rows = conn.execute(
            """
            SELECT d.destination_id, d.tenant_id, d.platform, d.account_id, d.active, d.dry_run,
                   d.recreate_deleted_audiences, d.consent_policy,
                   string_agg(
                       a.audience || CASE WHEN a.active THEN '' ELSE ' (off)' END
                       || CASE WHEN a.failures_in_a_row > 0
                               THEN ' (failed ' || a.failures_in_a_row || ' in a row)'
                               ELSE '' END,
                       ', ' ORDER BY a.audience)
            FROM cdp.destinations d LEFT JOIN cdp.destination_audiences a USING (destination_id)
            GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 2, 1
            """
        ).fetchall()
    click.echo(f"{'destination':<30}{'tenant':<14}{'platform':<22}{'account':<14}  audiences")
    for row in rows:
        destination_id, tenant_id, platform, account, active, dry_run, recreate, consent = row[:8]
        audiences = row[8]
        flags = "" if active else " [inactive]"
        flags += " [dry run]" if dry_run else ""
        flags += "" if recreate else " [deleted audiences not recreated]"
        flags += "" if consent == "none" else f" [consent: {consent}]"
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
@click.option(
    "--recreate-deleted-audiences/--no-recreate-deleted-audiences",
    default=True,
    show_default=True,
    help="An audience deleted on the platform is created again with every member; off, its"
    " sync fails naming the cause until `cdp destinations reset`.",
)
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
    recreate_deleted_audiences: bool,
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
        recreate_deleted_audiences,
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
    """Send an audience (a model of the dbt project's models/audiences/) to a destination, or
    to a VTEX collections destination a collection rule naming its audience (--param
    audience=...)."""
    params = {}
    for key, value in _pairs(param, "--param").items():
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    try:
        with _connect() as conn:
            _require_destination(conn, destination_id)
            if not off:
                row = conn.execute(
                    "SELECT platform FROM cdp.destinations WHERE destination_id = %s",
                    (destination_id,),
                ).fetchone()
                assert row is not None  # _require_destination found it
                (platform,) = row
                if platform == "vtex_masterdata":
                    _require_customer_fields(audience, params)
                else:
                    _require_audience(
                        params.get("audience") if platform == "vtex_collections" else audience
                    )
            add_audience(conn, destination_id, audience, params, active=not off)
    except (DestinationError, psycopg.errors.ForeignKeyViolation) as error:
        raise click.ClickException(str(error).splitlines()[0]) from None
    click.echo(f"{audience!r} {'off' if off else 'on'} for {destination_id!r}")


def _require_customer_fields(audience: str, params: dict) -> None:
    """A Master Data destination writes the fields of its `customers`, as its params say."""
    if audience != MASTERDATA_AUDIENCE:
        raise click.ClickException(
            f"a vtex_masterdata destination writes the fields of {MASTERDATA_AUDIENCE!r}, e.g."
            f" cdp destinations audience DESTINATION {MASTERDATA_AUDIENCE}"
            """ --param 'fields={"cdpSegment": "segment"}'"""
        )
    WritebackFields.from_params(params)


def _require_audience(name: object) -> None:
    """Refuse a name that is not an audience of the dbt project, naming the closest ones: a
    misspelt audience would otherwise fail only when the run pushes it."""
    from cdp_assets.analytics.dbt_files import manifest_audiences
    from cdp_assets.analytics.dbt_project import ensure_manifest

    if not isinstance(name, str):
        raise click.ClickException("a collection rule names its audience: --param audience=NAME")
    audiences = manifest_audiences(ensure_manifest())
    if name in audiences:
        return
    close = difflib.get_close_matches(name, audiences, n=3)
    raise click.ClickException(
        f"{name!r} is not an audience (a model of dbt_project/models/audiences/): "
        + (f"did you mean {' or '.join(close)}?" if close else f"audiences: {', '.join(audiences)}")
    )


@destinations.command("check")
@click.argument("destination_id")
def destinations_check(destination_id: str) -> None:
    """Check that the store has what a destination writes to: for VTEX Master Data, every
    field on the CL entity (and how to create those missing)."""
    from cdp_assets.tenants.registry import get_tenant
    from cdp_assets.vtex.resources import VtexResource

    try:
        with _connect() as conn:
            _require_destination(conn, destination_id)
            destination = get_destination(conn, destination_id)
            if destination.platform != "vtex_masterdata":
                click.echo(f"{destination_id}: {destination.platform} has nothing to check")
                return
            tenant = get_tenant(conn, destination.tenant_id)
            names = destination_fields(conn, destination_id).names()
        missing = missing_fields(VtexResource().client_for(tenant), names)
    except (DestinationError, TenantError, VtexError) as error:
        raise click.ClickException(str(error).splitlines()[0]) from None
    if missing:
        raise click.ClickException(
            f"{destination_id}: the CL entity of {tenant.account_name!r} has no field"
            f" {', '.join(missing)}: {how_to_create(missing)}"
        )
    click.echo(f"{destination_id}: the CL entity has every field written ({', '.join(names)})")


@destinations.command("reset")
@click.argument("destination_id")
@click.option("--audience", default=None, help="Only this audience (default: every one).")
def destinations_reset(destination_id: str, audience: str | None) -> None:
    """Forget the platform's audience and what it confirmed: the next run creates the
    audience anew and sends every member (after one was deleted on the platform). Its
    failures in a row are forgotten too (`cdp destinations retry`)."""
    if audience is not None:
        _require_slug(audience, "an audience")
    with _connect() as conn:
        _require_destination(conn, destination_id)
        forgotten = forget_platform_state(conn, destination_id, audience)
        abandon_requests(conn, destination_id, audience, "forgotten by cdp destinations reset")
        end_rest(conn, destination_id, audience)
        if audience is not None and not forgotten:
            raise click.ClickException(
                f"destination {destination_id!r} has no audience {audience!r}"
            )
    for entry in forgotten:
        click.echo(
            f"{destination_id}/{entry.audience}: forgot platform audience"
            f" {entry.platform_audience_id or '(none yet)'} and {entry.confirmed_members}"
            " confirmed members"
        )
    if forgotten:
        click.echo("the next run creates the audience again and sends every member")
    else:
        click.echo(f"destination {destination_id!r} has no audiences: nothing to forget")


@destinations.command("retry")
@click.argument("destination_id")
@click.option("--audience", default=None, help="Only this audience (default: every one).")
def destinations_retry(destination_id: str, audience: str | None) -> None:
    """Once the cause of a destination's failed syncs is fixed (a token renewed, an account
    reopened): forget its failures in a row, so that the sensors push its changes at once
    instead of after the rest (`cdp destinations list` shows the failures). Nothing on the
    platform is forgotten."""
    if audience is not None:
        _require_slug(audience, "an audience")
    with _connect() as conn:
        _require_destination(conn, destination_id)
        ended = end_rest(conn, destination_id, audience)
    click.echo(
        f"{destination_id}: {ended} audiences that had failed; the audience-change sensor"
        " pushes their changes at its next tick"
        if ended
        else f"{destination_id}: no audience of it had failed; nothing to do"
    )


@destinations.command("history")
@click.argument("destination_id", required=False)
@click.option("--limit", default=20, show_default=True)
def destinations_history(destination_id: str | None, limit: int) -> None:
    """The latest syncs (cdp.activation_runs), newest first, with their age; a sync still
    running says for how long. `pending`: members sent that await the platform's verdict
    (added and removed are what it acknowledged). Then the platform's requests still awaiting
    a verdict."""
    with _connect() as conn:
        if destination_id is not None:
            _require_destination(conn, destination_id)
        rows = conn.execute(
            """
            SELECT started_at, now() - started_at, destination_id, audience, status, added,
                   removed, unchanged, rejected, pending, coalesce(reason, '')
            FROM cdp.activation_runs
            WHERE %(destination)s::text IS NULL OR destination_id = %(destination)s
            ORDER BY activation_run_id DESC LIMIT %(limit)s
            """,
            {"destination": destination_id, "limit": limit},
        ).fetchall()
        awaiting = conn.execute(
            """
            SELECT r.destination_id, r.audience, r.platform_request_id, r.operation,
                   min(r.sent_at), now() - min(r.sent_at),
                   (SELECT count(*) FROM cdp.destination_members m
                    WHERE m.pending_request = ANY(array_agg(r.request_id)))
                   + sum(jsonb_array_length(r.members))
            FROM cdp.destination_requests r
            WHERE r.status = 'pending'
              AND (%(destination)s::text IS NULL OR r.destination_id = %(destination)s)
            GROUP BY 1, 2, 3, 4 ORDER BY 5
            """,
            {"destination": destination_id},
        ).fetchall()
    click.echo(
        f"{'started':<17}{'age':>7}  {'destination':<28}{'audience':<30}{'status':<10}"
        f"{'added':>7}{'removed':>8}{'unchanged':>10}{'rejected':>9}{'pending':>8}  reason"
    )
    for started, age, dest, audience, status, *counts, reason in rows:
        if status == "running":
            reason = f"running for {format_age(age)}"
        click.echo(
            f"{started:%Y-%m-%d %H:%M}{format_age(age):>8}  {dest:<28}{audience:<30}{status:<10}"
            + "".join(f"{c:>{w}}" for c, w in zip(counts, (7, 8, 10, 9, 8), strict=True))
            + f"  {reason[:80]}"
        )
    if awaiting:
        click.echo(f"\n{len(awaiting)} requests awaiting the platform's verdict:")
        for dest, audience, request, operation, sent, age, members in awaiting:
            click.echo(
                f"{sent:%Y-%m-%d %H:%M}{format_age(age):>8}  {dest:<28}{audience:<30}"
                f"{operation:<7}{members:>8} members  {request}"
            )
