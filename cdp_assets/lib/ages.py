"""Durations as people read them in a terminal: `cdp status`, the sync history, the health
verdict."""

from datetime import timedelta


def format_age(age: timedelta) -> str:
    """`age` in its two largest units: 45s, 12m30s, 3h12m, 2d5h."""
    seconds = max(int(age.total_seconds()), 0)
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3_600)
    minutes, seconds = divmod(seconds, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    first = next((i for i, (value, _) in enumerate(parts) if value), len(parts) - 1)
    return "".join(f"{value}{unit}" for value, unit in parts[first : first + 2] if value) or "0s"
