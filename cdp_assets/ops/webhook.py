"""Failed-run alerts to a Slack-compatible incoming webhook (`CDP_ALERT_WEBHOOK_URL`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import requests

from cdp_assets.lib.outbound import BoundedSession, Deadlines, OutboundError
from cdp_assets.ops.sync_errors import SyncError

WEBHOOK_ENV = "CDP_ALERT_WEBHOOK_URL"
# Where operators open the Dagster UI (e.g. https://dagster.example.com): alerts link to the
# failed run there. `cdp dev` sets it to its own webserver.
UI_URL_ENV = "CDP_UI_URL"
# The sensor tick waits for it: a slow (or dripping) webhook must not stall the daemon.
DEADLINES = Deadlines(connect_seconds=5, read_seconds=5, total_seconds=10)
# Tenants or assets named in an alert; the rest are counted.
MAX_LISTED = 5


def run_link(run_id: str, ui_url: str | None) -> str:
    """The run's page in the UI, or its id alone when the UI's address is not known."""
    return f"{ui_url.rstrip('/')}/runs/{run_id}" if ui_url else f"run {run_id}"


def alert_payload(errors: Sequence[SyncError], ui_url: str | None = None) -> dict[str, str]:
    """`{"text": ...}`, which Slack, Mattermost, Rocket.Chat and Google Chat all accept: one
    alert for a failed run's rows (a row per tenant it failed for). Built from the stored rows
    only, so the message is already redacted and truncated; it links to the run when the UI's
    address (`ui_url`) is known."""
    error = errors[0]
    tenants = [e.tenant_id for e in errors if e.tenant_id]
    if len(tenants) == 1:
        scope = [f"tenant {tenants[0]}"]
    elif tenants:
        scope = [f"tenants {_listed(tenants)}"]
    else:
        scope = ["no single tenant"]
    asset_keys = sorted({key for e in errors for key in e.asset_keys})
    if asset_keys:
        scope.append(_listed(asset_keys))
    if error.partition_key:
        scope.append(f"partition {error.partition_key}")
    where = f"job {error.job_name}" + (f", step {error.step_key}" if error.step_key else "")
    text = (
        f"cdp run failed: {'; '.join(scope)}\n"
        f"{error.error_type}: {error.message}\n"
        f"{where}, {run_link(error.run_id, ui_url)}"
    )
    return {"text": text}


def _listed(names: Sequence[str]) -> str:
    more = len(names) - MAX_LISTED
    return ", ".join(names[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def post_alert(
    url: str, payload: Mapping[str, str], log: logging.Logger | logging.LoggerAdapter
) -> bool:
    """POST the payload; False (and a warning) when the webhook cannot be reached or refuses."""
    try:
        with BoundedSession(DEADLINES) as session:
            response = session.post(url, json=payload)
            response.raise_for_status()
    except (requests.RequestException, OutboundError) as error:
        # Not str(error): it quotes the URL, and a webhook URL is itself a credential.
        answer = getattr(error, "response", None)  # requests' errors carry the answer
        status = answer.status_code if answer is not None else None
        detail = f", HTTP {status}" if status else ""
        log.warning(f"alert webhook not reached ({type(error).__name__}{detail})")
        return False
    return True
