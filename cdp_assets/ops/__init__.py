"""Operations: failed runs recorded in `cdp.sync_errors` (and alerted), the operations metrics
and their checks, and `cdp status`."""
