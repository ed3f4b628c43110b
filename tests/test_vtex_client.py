import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from cdp_assets.tenants.registry import Credentials
from cdp_assets.vtex.client import (
    RateLimiter,
    VtexClient,
    format_vtex_instant,
    retry_after_seconds,
)


def test_retry_after_in_seconds_or_as_a_date():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after_seconds(later) <= 30


def test_list_window_instants_are_utc_with_milliseconds():
    moment = datetime(2024, 1, 2, 0, 0, 0, 123456, tzinfo=UTC)
    assert format_vtex_instant(moment) == "2024-01-02T00:00:00.123Z"


def test_rate_limiter_holds_the_rate():
    limiter = RateLimiter(rate=50, burst=1)
    started = time.monotonic()
    for _ in range(26):
        limiter.acquire()
    # 25 tokens beyond the first at 50/s cannot take less than half a second.
    assert time.monotonic() - started >= 0.45


def test_proxy_and_ca_settings_come_from_the_environment_once(monkeypatch):
    """The session reads proxies and the CA bundle when it is made and never looks at the
    environment (or ~/.netrc) again per request."""
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "bypassed.example")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/agency.pem")
    credentials = Credentials("key", "token")
    proxied = VtexClient("acme", "https://acme.vtexcommercestable.com.br", credentials)._session()
    assert proxied.proxies["https"] == "http://proxy.internal:3128"
    assert proxied.verify == "/etc/ssl/certs/agency.pem" and proxied.trust_env is False
    bypassed = VtexClient("acme", "https://bypassed.example", credentials)._session()
    assert "https" not in bypassed.proxies
    for name in ("HTTPS_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    assert proxied.proxies["https"] == "http://proxy.internal:3128"  # read once, kept
    plain = VtexClient("acme", "https://plain.example", credentials)._session()
    assert plain.proxies == {} and plain.verify is True
