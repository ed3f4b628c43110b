"""`cdp privacy`: erase or suppress a person in a tenant, see what a request did, and set whose
data a destination may receive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
import psycopg

from cdp_assets.activation.destinations import (
    CONSENT_POLICIES,
    DestinationError,
    set_consent_policy,
)
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.privacy.audit import get_request
from cdp_assets.privacy.erase import (
    AwaitingPlatforms,
    RequestBusy,
    default_platform,
    find_person,
    open_erasures,
    run_erase,
    start_erase,
)
from cdp_assets.privacy.identifiers import IdentifierError
from cdp_assets.privacy.suppression import suppress, unsuppress
from cdp_assets.tenants.registry import TenantError


def _connect() -> psycopg.Connection:
    return psycopg.connect(migrated_url())


def _identifier(
    email: str | None, phone: str | None, document: str | None, customer_key: str | None = None
) -> tuple[str, str]:
    given = {
        name: value
        for name, value in (
            ("email", email),
            ("phone", phone),
            ("document", document),
            ("customer_key", customer_key),
        )
        if value
    }
    if len(given) != 1:
        raise click.UsageError("give exactly one identifier of the person")
    return next(iter(given.items()))


_PERSON = [
    click.option("--tenant", "tenant_id", required=True),
    click.option("--email"),
    click.option("--phone", help="As the store has it; read in the tenant's country."),
    click.option("--document", help="CPF, CNPJ, DNI...: its digits count."),
]


# The options go on the command's function, before `privacy.command` makes it a command.
_Function = TypeVar("_Function", bound=Callable[..., Any])


def _person_options(function: _Function) -> _Function:
    for option in reversed(_PERSON):
        function = option(function)
    return function


@click.group()
def privacy() -> None:
    """Privacy requests: erase, suppress, and their record."""


def _carry_out(conn: psycopg.Connection, request_id: int) -> None:
    try:
        run_erase(conn, request_id, default_platform)
    except RequestBusy as error:
        raise click.ClickException(str(error)) from None
    except AwaitingPlatforms as error:
        click.echo(f"request {request_id} open: {error} (cdp privacy status {request_id})")
        return
    except Exception as error:
        raise click.ClickException(
            f"request {request_id} stopped ({type(error).__name__}: {str(error)[:300]});"
            f" `cdp privacy resume {request_id}` carries it on"
        ) from None
    click.echo(f"request {request_id} completed (cdp privacy status {request_id})")


@privacy.command("erase")
@_person_options
@click.option("--customer-key", help="The customer's key in the marts.")
@click.option("--dry-run", is_flag=True, help="Say what would be touched; change nothing.")
def privacy_erase(
    tenant_id: str,
    email: str | None,
    phone: str | None,
    document: str | None,
    customer_key: str | None,
    dry_run: bool,
) -> None:
    """Erase a person from the tenant's warehouse and destinations, and suppress them."""
    kind, value = _identifier(email, phone, document, customer_key)
    try:
        with _connect() as conn:
            if dry_run:
                counts = find_person(conn, tenant_id, kind, value).counts()
                click.echo("would touch: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
                return
            request_id = start_erase(conn, tenant_id, kind, value)
            click.echo(f"erase request {request_id} recorded")
            _carry_out(conn, request_id)
    except (IdentifierError, TenantError) as error:
        raise click.ClickException(str(error)) from None


@privacy.command("resume")
@click.argument("request_id", type=int, required=False)
def privacy_resume(request_id: int | None) -> None:
    """Carry on an interrupted erase (every open one without REQUEST_ID)."""
    with _connect() as conn:
        for open_id in [request_id] if request_id is not None else open_erasures(conn):
            _carry_out(conn, open_id)


@privacy.command("suppress")
@_person_options
def privacy_suppress(
    tenant_id: str, email: str | None, phone: str | None, document: str | None
) -> None:
    """Keep a person out of every audience and destination of the tenant from now on."""
    kind, value = _identifier(email, phone, document)
    try:
        with _connect() as conn:
            request_id = suppress(conn, tenant_id, kind, value)
    except (IdentifierError, TenantError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"suppressed (request {request_id})")


@privacy.command("unsuppress")
@_person_options
def privacy_unsuppress(
    tenant_id: str, email: str | None, phone: str | None, document: str | None
) -> None:
    """Lift a suppression; the person is back at the tenant's next analytics refresh."""
    kind, value = _identifier(email, phone, document)
    try:
        with _connect() as conn:
            request_id = unsuppress(conn, tenant_id, kind, value)
    except (IdentifierError, TenantError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"suppression lifted (request {request_id})")


@privacy.command("status")
@click.argument("request_id", type=int)
def privacy_status(request_id: int) -> None:
    """A request and each of its steps, with their completion times."""
    with _connect() as conn:
        request = get_request(conn, request_id)
    if request is None:
        raise click.ClickException(f"no privacy request {request_id}")
    finished = request.completed_at.isoformat() if request.completed_at else "-"
    click.echo(
        f"request {request.request_id}: {request.kind} in {request.tenant_id} by"
        f" {request.given}, {request.status}; requested {request.requested_at.isoformat()},"
        f" completed {finished}"
    )
    if request.last_error:
        click.echo(f"  last error: {request.last_error}")
    for step in request.steps:
        done = step.completed_at.isoformat() if step.completed_at else "not completed"
        detail = ", ".join(f"{k}={v}" for k, v in step.detail.items())
        click.echo(f"  {step.step:<14}{done:<34}{detail}")


@privacy.command("consent")
@click.argument("destination_id", required=False)
@click.argument("policy", type=click.Choice(CONSENT_POLICIES), required=False)
def privacy_consent(destination_id: str | None, policy: str | None) -> None:
    """Whose data DESTINATION_ID may receive: everyone in its audiences (none), only those
    who opted in to the newsletter, or all but those who opted out. Without arguments, every
    destination's policy."""
    if destination_id is None:
        with _connect() as conn:
            rows = conn.execute(
                "SELECT destination_id, tenant_id, platform, consent_policy"
                " FROM cdp.destinations ORDER BY tenant_id, destination_id"
            ).fetchall()
        click.echo(f"{'destination':<30}{'tenant':<14}{'platform':<22}consent policy")
        for row_id, tenant_id, platform, row_policy in rows:
            click.echo(f"{row_id:<30}{tenant_id:<14}{platform:<22}{row_policy}")
        return
    if policy is None:
        raise click.UsageError("give the policy: " + ", ".join(CONSENT_POLICIES))
    try:
        with _connect() as conn:
            set_consent_policy(conn, destination_id, policy)
    except DestinationError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"destination {destination_id!r}: consent policy {policy}")
