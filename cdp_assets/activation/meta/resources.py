"""How to reach the Graph API; the access token comes from each destination's reference."""

import dagster as dg

from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.meta.audiences import GRAPH_DEADLINES, PACE_SECONDS, MetaAudiences
from cdp_assets.lib import settings
from cdp_assets.lib.outbound import Deadlines


class MetaResource(dg.ConfigurableResource):
    """`graph_url` unset means `META_GRAPH_URL` when set (the demo's sandbox), else Meta. Each
    call waits at most `timeout_seconds` between two reads and `deadline_seconds` in all (a
    10,000-row batch included). Near the ad account's rate limit, a call waits up to
    `pace_seconds` (at 100 % usage) before it is sent."""

    graph_url: str | None = None
    attempts: int = 6
    retry_base_seconds: float = 2.0
    timeout_seconds: float = GRAPH_DEADLINES.read_seconds
    deadline_seconds: float = GRAPH_DEADLINES.total_seconds
    pace_seconds: float = PACE_SECONDS

    def audiences_for(self, destination: Destination) -> MetaAudiences:
        signs = "app_secret" in destination.credential_refs
        return MetaAudiences(
            destination.account_id,
            destination.credential("access_token"),
            app_secret=destination.credential("app_secret") if signs else None,
            graph_url=self.graph_url or settings.value("META_GRAPH_URL"),
            attempts=self.attempts,
            retry_base_seconds=self.retry_base_seconds,
            deadlines=Deadlines(
                read_seconds=self.timeout_seconds, total_seconds=self.deadline_seconds
            ),
            pace_seconds=self.pace_seconds,
        )
