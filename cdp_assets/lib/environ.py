"""Environment variables set for a while."""

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def temporary_environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ meanwhile, what was there before restored after."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
