"""How to reach the Graph API; the access token comes from each destination's reference."""

import os

import dagster as dg

from cdp_assets.activation.destinations import Destination
from cdp_assets.meta.audiences import MetaAudiences


class MetaResource(dg.ConfigurableResource):
    """`graph_url` unset means `META_GRAPH_URL` when set (the demo's sandbox), else Meta."""

    graph_url: str | None = None
    attempts: int = 6
    retry_base_seconds: float = 2.0

    def audiences_for(self, destination: Destination) -> MetaAudiences:
        return MetaAudiences(
            destination.account_id,
            destination.credential("access_token"),
            graph_url=self.graph_url or os.environ.get("META_GRAPH_URL"),
            attempts=self.attempts,
            retry_base_seconds=self.retry_base_seconds,
        )
