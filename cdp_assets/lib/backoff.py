"""Retry with exponential backoff for calls to ad platforms, whose clients do not back off."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def with_backoff(
    call: Callable[[], T],
    retryable: Callable[[Exception], bool],
    *,
    attempts: int = 5,
    base_seconds: float = 1.0,
    max_seconds: float = 60.0,
    on_retry: Callable[[Exception], None] | None = None,
) -> T:
    """Run ``call``; on a retryable error wait base * 2**n (capped) and try again."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as error:
            if attempt == attempts - 1 or not retryable(error):
                raise
            if on_retry is not None:
                on_retry(error)
            time.sleep(min(max_seconds, base_seconds * 2**attempt))
    raise AssertionError("unreachable")
