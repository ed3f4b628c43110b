"""Operations: failed runs recorded in `cdp.sync_errors` (and alerted), and `cdp status`."""
