"""Loopback Google gRPC sandbox: Data Manager API and Google Ads API v26 Customer Match.

One in-process ``grpc.server`` on ``127.0.0.1`` (plaintext) serves both APIs, so the real
``google-ads-datamanager`` and ``google-ads`` clients can be exercised end to end without
credentials or network. Messages go through the clients' own proto-plus ``serialize`` /
``deserialize`` via generic handlers; no generated ``_pb2_grpc`` is involved. Behaviour of each
API is described in :mod:`~cdp_devkit.sandbox.google.data_manager` and
:mod:`~cdp_devkit.sandbox.google.ads`; the shared list/member model in
:mod:`~cdp_devkit.sandbox.google.common`.

Pointing the clients at the sandbox (a transport given a ``grpc.Channel`` instance ignores
credentials, so neither client looks for ADC or OAuth)::

    import grpc
    from google.ads import datamanager_v1 as dm
    from google.ads.datamanager_v1.services.ingestion_service.transports import (
        IngestionServiceGrpcTransport,
    )
    from google.ads.datamanager_v1.services.user_list_service.transports import (
        UserListServiceGrpcTransport,
    )

    channel = grpc.insecure_channel(sandbox.address)
    ingestion = dm.IngestionServiceClient(
        transport=IngestionServiceGrpcTransport(channel=channel)
    )
    user_lists = dm.UserListServiceClient(transport=UserListServiceGrpcTransport(channel=channel))

    from google.ads.googleads.interceptors import ExceptionInterceptor, MetadataInterceptor
    from google.ads.googleads.v26.services.services.offline_user_data_job_service import (
        OfflineUserDataJobServiceClient,
        transports,
    )

    ads_channel = grpc.intercept_channel(
        grpc.insecure_channel(sandbox.address),
        # (developer_token, login_customer_id, linked_customer_id)
        MetadataInterceptor("dev-token", "1234567890", None),
        ExceptionInterceptor("v26", use_proto_plus=True),
    )
    jobs = OfflineUserDataJobServiceClient(
        transport=transports.OfflineUserDataJobServiceGrpcTransport(channel=ads_channel)
    )
    # likewise UserListServiceClient and GoogleAdsServiceClient from
    # google.ads.googleads.v26.services.services.{user_list_service,google_ads_service}

This is what ``GoogleAdsClient.get_service`` builds internally, minus its LoggingInterceptor.
``GoogleAdsClient`` itself offers no supported way to inject a channel: ``endpoint`` only swaps
the host of a TLS channel with OAuth call credentials (``get_service(interceptors=...)`` is
documented as not for outside use), so the explicit channel above is the clean route; the
interceptor order is ``get_service``'s. Pass ``retry=None`` (and a short ``timeout``) in tests:
the Data Manager client's default retry retries UNAVAILABLE with multi-second backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent import futures

import grpc

from cdp_devkit.sandbox.google.ads import GoogleAdsApi
from cdp_devkit.sandbox.google.common import (
    FAULT_KINDS,
    AudienceStore,
    Dispatcher,
    FaultQueue,
    RecordedCall,
    SandboxUserList,
)
from cdp_devkit.sandbox.google.data_manager import DataManagerApi
from cdp_devkit.sandbox.loopback import LoopbackSandbox, RequestLog

__all__ = ["FAULT_KINDS", "GoogleSandbox", "RecordedCall", "SandboxUserList"]


class GoogleSandbox(LoopbackSandbox[RecordedCall]):
    """The sandbox server; a context manager, or :meth:`start` and :meth:`stop`.

    ``match_rate_percent`` drives every reported match rate (Data Manager
    ``upload_match_rate_range`` / ``match_rate_percentage``, Ads job ``match_rate_range`` and
    list ``match_rate_percentage``); list sizes are the member counts. ``job_seconds`` is how
    long a run Ads job stays RUNNING before it reports SUCCESS (Google: 6 hours or more);
    ``processing_seconds`` how long after its acknowledgement a Data Manager request is
    processed (Google: 30 minutes to 24 hours); tests move time on with ``process_pending``.
    ``clock`` stamps member add times (Data Manager ``remove_as_of_time`` compares against it).
    """

    platform = "Google"

    def __init__(
        self,
        *,
        match_rate_percent: int = 72,
        job_seconds: float = 0.2,
        processing_seconds: float = 0.2,
        clock: Callable[[], float] = time.time,
        max_workers: int = 8,
    ) -> None:
        super().__init__(RequestLog())
        self._store = AudienceStore(clock, match_rate_percent)
        self._faults = FaultQueue()
        self._apis = (
            DataManagerApi(self._store, processing_seconds),
            GoogleAdsApi(self._store, job_seconds),
        )
        self._methods = frozenset(rpc.method for api in self._apis for rpc in api.rpcs())
        self._max_workers = max_workers
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> int:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers),
            # 100,000-identifier Ads requests exceed gRPC's default 4 MiB receive limit.
            options=[("grpc.max_receive_message_length", -1)],
        )
        dispatcher = Dispatcher(self._request_log, self._faults)
        for api in self._apis:
            server.add_generic_rpc_handlers(dispatcher.generic_handlers(api))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return port

    def _shut_down(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def requests(self, method: str | None = None) -> list[RecordedCall]:
        """Calls in completion order, optionally only those of one RPC (e.g. ``"Search"``)."""
        return self._request_log.matching(lambda call: method is None or call.method == method)

    def inject(self, method: str, fault: str, *, times: int = 1) -> None:
        """Fail the next ``times`` calls of an RPC (by name) with ``fault``, before any effect.

        Faults: ``quota`` / ``daily_quota`` (RESOURCE_EXHAUSTED), ``unavailable``, ``internal``,
        ``not_allowlisted`` (PERMISSION_DENIED), ``never_answer`` (no answer until the client's
        deadline passes). Google Ads calls still need a developer token first: a call rejected
        for headers does not consume a fault.
        """
        if method not in self._methods:
            raise ValueError(f"unknown RPC {method!r}; expected one of {sorted(self._methods)}")
        self._faults.inject(method, fault, times)

    def clear_faults(self) -> None:
        self._faults.clear()
        with self._store.lock:
            self._store.refused = frozenset()
            self._store.failing_in_processing = frozenset()

    def fail_in_processing(self, values: Iterable[str]) -> None:
        """Data Manager records carrying any of these hashed values are acknowledged, then fail
        when the request is processed (counted, never named, in its status).
        ``clear_faults`` forgets them."""
        with self._store.lock:
            self._store.failing_in_processing = frozenset(values)

    def process_pending(self) -> None:
        """Let the time pass: every acknowledged Data Manager request is processed and every
        running Google Ads job finishes now."""
        self._store.process_due(everything=True)

    def refuse(self, values: Iterable[str]) -> None:
        """Members carrying any of these hashed values are refused: Google Ads operations
        fail by index under partial failure (INVALID_VALUE); a Data Manager request fails as
        a whole, naming the members (``audience_members[i]`` field violations).
        ``clear_faults`` forgets them."""
        with self._store.lock:
            self._store.refused = frozenset(values)

    def members(self, user_list: int | str) -> set[str]:
        """Member keys of a list given by id or either API's resource name."""
        self._store.process_due()
        with self._store.lock:
            return set(self._store.resolve(user_list).members)

    def user_lists(self) -> list[SandboxUserList]:
        self._store.process_due()
        with self._store.lock:
            return [
                r.snapshot() for r in sorted(self._store.lists.values(), key=lambda r: r.list_id)
            ]
