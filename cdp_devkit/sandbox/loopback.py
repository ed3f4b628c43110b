"""What the in-process platform sandboxes (Meta's Graph API, Google's gRPC APIs) share: each
serves on an ephemeral ``127.0.0.1`` port from threads of its own, is started and stopped as a
context manager, and records every request it answers for tests to read."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Self, TypeVar

Recorded = TypeVar("Recorded")


class RequestLog(Generic[Recorded]):
    """Requests in the order they were recorded: server threads add to it while a test reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recorded: list[Recorded] = []

    def add(self, request: Recorded) -> None:
        with self._lock:
            self._recorded.append(request)

    def matching(self, keep: Callable[[Recorded], bool]) -> list[Recorded]:
        with self._lock:
            return [request for request in self._recorded if keep(request)]

    def clear(self) -> None:
        with self._lock:
            self._recorded.clear()


class LoopbackSandbox(ABC, Generic[Recorded]):
    """A platform's sandbox server: a context manager, or :meth:`start` and :meth:`stop`.

    A subclass serves in :meth:`_serve` and stops serving in :meth:`_shut_down`, and records
    the requests it answers in ``request_log``.
    """

    platform: str  # the platform it stands for, as its errors name it

    def __init__(self, request_log: RequestLog[Recorded]) -> None:
        self._request_log = request_log
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The port it answers on while it runs."""
        if self._port is None:
            raise RuntimeError(f"the {self.platform} sandbox has not been started")
        return self._port

    def start(self) -> Self:
        if self._port is not None:
            raise RuntimeError(f"the {self.platform} sandbox is already running")
        self._port = self._serve()
        return self

    def stop(self) -> None:
        if self._port is not None:
            self._shut_down()
            self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def clear_requests(self) -> None:
        self._request_log.clear()

    @abstractmethod
    def _serve(self) -> int:
        """Start answering on a free ``127.0.0.1`` port and return it once requests are
        answered; on failure, leave nothing running and raise."""

    @abstractmethod
    def _shut_down(self) -> None:
        """Stop answering and release the port."""
