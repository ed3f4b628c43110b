"""Meta Graph sandbox driven through the real ``facebook-business`` SDK over loopback HTTP.

One sandbox serves the module; each test makes its own audience, so membership never leaks
between tests, while faults and recorded requests are reset around every test.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import requests
from facebook_business.adobjects.adaccount import AdAccount
from facebook_business.adobjects.customaudience import CustomAudience
from facebook_business.api import FacebookAdsApi
from facebook_business.exceptions import FacebookRequestError
from facebook_business.session import FacebookSession

from cdp_devkit.sandbox import META_FAULT_KINDS, MetaSandbox
from cdp_devkit.sandbox.meta.graph import GraphLimits, minutes_to_regain

TOKEN = "sandbox-token"
OTHER_TOKEN = "other-token"
ACCOUNT = "act_1001"
OTHER_ACCOUNT = "act_2002"
CAP_ACCOUNT = "3003"  # only the audience-cap test creates audiences here
PAGED_ACCOUNT = "5005"  # only the paging test creates audiences here
SCHEMA = ["EXTERN_ID", "EMAIL", "PHONE", "FN", "COUNTRY"]
CREATE = {"subtype": "CUSTOM", "customer_file_source": "USER_PROVIDED_ONLY"}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def person(n: int) -> list[str]:
    """A SCHEMA row for customer n."""
    return [f"cust-{n}", sha(f"user{n}@example.com"), sha(f"1555{n:07d}"), sha("mary"), sha("us")]


def people(start: int, stop: int) -> list[list[str]]:
    return [person(n) for n in range(start, stop)]


def upload(rows: list[Any], schema: Any = SCHEMA) -> dict[str, Any]:
    return {"schema": schema, "data": rows}


def graph_api(sandbox: MetaSandbox, token: str | None = TOKEN, version: str | None = None):
    session = FacebookSession(access_token=token)
    session.GRAPH = sandbox.graph_url
    return FacebookAdsApi(session, api_version=version)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[MetaSandbox]:
    tokens = {TOKEN: [ACCOUNT, CAP_ACCOUNT, PAGED_ACCOUNT], OTHER_TOKEN: [OTHER_ACCOUNT]}
    with MetaSandbox(tokens) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(sandbox: MetaSandbox) -> Iterator[None]:
    sandbox.clear_faults()
    sandbox.clear_requests()
    yield
    sandbox.clear_faults()


@pytest.fixture(scope="module")
def api(sandbox: MetaSandbox) -> FacebookAdsApi:
    return graph_api(sandbox)


@pytest.fixture
def audience(api: FacebookAdsApi, request: pytest.FixtureRequest) -> CustomAudience:
    params = {"name": request.node.name, **CREATE}
    created = AdAccount(ACCOUNT, api=api).create_custom_audience(params=params)
    return CustomAudience(created["id"], api=api)


def add(audience: CustomAudience, rows: list[Any], schema: Any = SCHEMA, **params: Any) -> Any:
    return audience.create_user(params={"payload": upload(rows, schema), **params})


def extern_ids(sandbox: MetaSandbox, audience: CustomAudience) -> set[str]:
    return {row["EXTERN_ID"] for row in sandbox.members(audience["id"]) if "EXTERN_ID" in row}


def graph_error(call: Any) -> FacebookRequestError:
    with pytest.raises(FacebookRequestError) as caught:
        call()
    return caught.value


# ----- audiences ----------------------------------------------------------------------------------


def test_create_and_read_back(sandbox: MetaSandbox, api: FacebookAdsApi) -> None:
    params = {"name": "VIP buyers", "description": "spent > 1000", **CREATE}
    created = AdAccount(ACCOUNT, api=api).create_custom_audience(params=params)
    assert isinstance(created, CustomAudience) and created["id"].isdigit()

    fields = [
        "name",
        "description",
        "subtype",
        "customer_file_source",
        "approximate_count_lower_bound",
        "approximate_count_upper_bound",
        "operation_status",
        "delivery_status",
    ]
    node = CustomAudience(created["id"], api=api).api_get(fields=fields)
    assert node["name"] == "VIP buyers" and node["description"] == "spent > 1000"
    assert node["subtype"] == "CUSTOM" and node["customer_file_source"] == "USER_PROVIDED_ONLY"
    assert node["approximate_count_lower_bound"] == node["approximate_count_upper_bound"] == 0
    assert node["operation_status"]["code"] == 200
    assert node["operation_status"]["description"] == "Normal"
    assert node["delivery_status"]["code"] == 200

    listed = list(AdAccount(ACCOUNT, api=api).get_custom_audiences(fields=["id", "name"]))
    assert {"id": created["id"], "name": "VIP buyers"} in [dict(a) for a in listed]
    assert created["id"] in [a["id"] for a in sandbox.audiences(ACCOUNT)]
    # The SDK form-encodes create parameters; the sandbox records them as sent.
    (post,) = [r for r in sandbox.requests("/customaudiences") if r.method == "POST"]
    assert post.form == {**params, "subtype": "CUSTOM"}

    with pytest.warns(UserWarning, match="does not allow field nme"):  # the SDK only warns
        error = graph_error(lambda: CustomAudience(created["id"], api=api).api_get(fields=["nme"]))
    assert error.api_error_code() == 100 and "nme" in error.api_error_message()


def test_listing_an_account_without_audiences_is_empty(sandbox: MetaSandbox) -> None:
    other = graph_api(sandbox, OTHER_TOKEN)
    assert list(AdAccount(OTHER_ACCOUNT, api=other).get_custom_audiences(fields=["id"])) == []


@pytest.mark.filterwarnings("ignore:value of customer_file_source might not be compatible")
@pytest.mark.parametrize(
    ("account", "params", "code"),
    [
        (ACCOUNT, {"name": "x", "subtype": "CUSTOM"}, 100),  # no customer_file_source
        (ACCOUNT, {"name": "x", "subtype": "LOOKALIKE", "customer_file_source": "BOTH"}, 100),
        (ACCOUNT, {"name": "x", "subtype": "CUSTOM", "customer_file_source": "BOTH"}, 100),
        (ACCOUNT, {"subtype": "CUSTOM", "customer_file_source": "USER_PROVIDED_ONLY"}, 100),
        (OTHER_ACCOUNT, {"name": "x", **CREATE}, 200),  # the token does not own this account
    ],
)
def test_create_rejects_bad_requests(
    sandbox: MetaSandbox, api: FacebookAdsApi, account: str, params: dict[str, str], code: int
) -> None:
    error = graph_error(lambda: AdAccount(account, api=api).create_custom_audience(params=params))
    assert error.api_error_code() == code and error.http_status() == 400
    assert error.body()["error"]["type"] == "OAuthException"
    assert sandbox.audiences(OTHER_ACCOUNT) == []


def test_customer_file_audiences_are_capped_at_500_per_account(
    sandbox: MetaSandbox, api: FacebookAdsApi
) -> None:
    account = AdAccount(f"act_{CAP_ACCOUNT}", api=api)
    for n in range(500):
        account.create_custom_audience(params={"name": f"segment {n}", **CREATE})
    error = graph_error(
        lambda: account.create_custom_audience(params={"name": "one more", **CREATE})
    )
    assert error.api_error_code() == 100 and "500" in error.api_error_message()
    assert len(sandbox.audiences(CAP_ACCOUNT)) == 500


def test_a_deleted_audience_is_gone_for_every_call(
    sandbox: MetaSandbox, api: FacebookAdsApi, audience: CustomAudience
) -> None:
    add(audience, people(0, 3))
    other = CustomAudience(audience["id"], api=graph_api(sandbox, OTHER_TOKEN))
    assert graph_error(other.api_delete).api_error_code() == 200  # not its audience
    assert api.call("DELETE", (audience["id"],)).json() == {"success": True}
    assert audience["id"] not in [a["id"] for a in sandbox.audiences(ACCOUNT)]
    listed = AdAccount(ACCOUNT, api=api).get_custom_audiences(fields=["id"])
    assert audience["id"] not in [a["id"] for a in listed]
    # Meta's answer for a node that no longer exists, whatever the call on it or its edges.
    for call, method in [
        (lambda: audience.api_get(fields=["name"]), "get"),
        (lambda: add(audience, people(3, 4)), "post"),
        (lambda: add(audience, people(0, 1), method="DELETE"), "post"),
        (audience.api_delete, "delete"),
    ]:
        error = graph_error(call)
        assert (error.http_status(), error.api_error_code(), error.api_error_subcode()) == (
            400,
            100,
            33,
        )
        assert error.api_error_type() == "GraphMethodException"
        assert error.api_error_message().startswith(
            f"Unsupported {method} request. Object with ID '{audience['id']}' does not exist"
        )
    with pytest.raises(KeyError):
        sandbox.members(audience["id"])


# ----- adding and removing members ------------------------------------------------------------


def test_multi_key_adds_are_idempotent_and_counted(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    session = {"session_id": 11, "batch_seq": 1, "last_batch_flag": True}
    result = add(audience, people(0, 3), session=session)
    assert result["audience_id"] == audience["id"] and result["session_id"] == "11"
    assert result["num_received"] == 3 and result["num_invalid_entries"] == 0
    assert extern_ids(sandbox, audience) == {"cust-0", "cust-1", "cust-2"}
    member = next(m for m in sandbox.members(audience["id"]) if m["EXTERN_ID"] == "cust-1")
    assert member == dict(zip(SCHEMA, person(1), strict=True))

    again = add(audience, people(1, 4), session=session)
    assert again["num_received"] == 6  # rows received in session 11 so far
    node = audience.api_get(
        fields=["approximate_count_lower_bound", "approximate_count_upper_bound"]
    )
    assert node["approximate_count_lower_bound"] == node["approximate_count_upper_bound"] == 4


def test_remove_with_post_method_delete(sandbox: MetaSandbox, audience: CustomAudience) -> None:
    add(audience, people(0, 4))
    by_email = sha("solo@example.com")
    add(audience, [by_email], schema="EMAIL_SHA256")
    assert len(sandbox.members(audience["id"])) == 5

    result = add(audience, [["cust-1"], ["cust-3"]], schema=["EXTERN_ID"], method="DELETE")
    assert result["num_received"] == 2
    add(audience, [by_email], schema="EMAIL_SHA256", method="DELETE")
    assert extern_ids(sandbox, audience) == {"cust-0", "cust-2"}
    assert len(sandbox.members(audience["id"])) == 2
    removals = [r for r in sandbox.requests("/users") if r.form.get("method") == "DELETE"]
    assert [r.method for r in removals] == ["POST", "POST"]


def test_sdk_delete_fails_on_a_long_url_but_post_delete_works(
    sandbox: MetaSandbox, api: FacebookAdsApi, audience: CustomAudience
) -> None:
    rows = people(0, 1000)
    add(audience, rows)
    # SDK quirk: the 414 HTML page is not an error to the SDK, whose response parser then
    # fails on the text body with a TypeError instead of raising FacebookRequestError.
    with pytest.raises(TypeError):
        audience.delete_users(params={"payload": upload(rows)})
    raw = api.call("DELETE", (audience["id"], "users"), params={"payload": upload(rows)})
    assert raw.status() == 414 and "414" in raw.body()
    assert [r.status for r in sandbox.requests("/users") if r.method == "DELETE"] == [414, 414]
    assert len(sandbox.members(audience["id"])) == 1000

    # A short real DELETE does get through: the failure is the URL length, not the verb.
    assert audience.delete_users(params={"payload": upload(rows[:3])})["num_received"] == 3
    assert len(sandbox.members(audience["id"])) == 997
    result = add(audience, rows[3:], method="DELETE")
    assert result["num_received"] == 997 and sandbox.members(audience["id"]) == []


def test_badly_hashed_rows_are_counted_and_dropped(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    good = person(1)
    rows = [
        good,
        ["cust-2", "mary@example.com", "", "", ""],  # unhashed email
        ["cust-3", sha("x").upper(), "", "", ""],  # uppercase hex
        ["cust-4", "", sha("y")[:63], "", ""],  # truncated digest
        ["", "", "", "", ""],  # nothing to match on
        ["cust-5", "", "", "", ""],  # EXTERN_ID alone is enough
    ]
    result = add(audience, rows)
    assert result["num_received"] == 6 and result["num_invalid_entries"] == 4
    assert set(result["invalid_entry_samples"]) == {"1", "2", "3", "4"}
    assert "EMAIL" in result["invalid_entry_samples"]["1"]
    assert extern_ids(sandbox, audience) == {"cust-1", "cust-5"}


def test_batch_limit_is_10000_rows(sandbox: MetaSandbox, audience: CustomAudience) -> None:
    rows = people(0, 10_001)
    error = graph_error(lambda: add(audience, rows))
    assert error.api_error_code() == 100 and "10000" in error.api_error_message()
    assert sandbox.members(audience["id"]) == []

    assert add(audience, rows[:10_000])["num_received"] == 10_000
    assert len(sandbox.members(audience["id"])) == 10_000


@pytest.mark.parametrize(
    ("schema", "rows", "message"),
    [
        (SCHEMA, [person(1), person(2)[:4]], "does not match schema"),
        (SCHEMA, [person(1)[0]], "does not match schema"),  # flat row for a multi-key schema
        ("EMAIL_SHA256", [[sha("a")]], "does not match schema"),  # list row, single-key schema
        (SCHEMA, [], "does not match schema"),
        (["EXTERN_ID", "EMAIL_ADDRESS"], [["a", sha("a")]], "EMAIL_ADDRESS"),
        ("EMAIL", [sha("a")], "Invalid schema"),
        (["EMAIL", "EMAIL"], [[sha("a"), sha("a")]], "Duplicate"),
    ],
)
def test_malformed_payloads_are_rejected_whole(
    sandbox: MetaSandbox, audience: CustomAudience, schema: Any, rows: list[Any], message: str
) -> None:
    error = graph_error(lambda: add(audience, rows, schema=schema))
    assert error.api_error_code() == 100 and message in error.api_error_message()
    assert sandbox.members(audience["id"]) == []


# ----- faults ---------------------------------------------------------------------------------

ERROR_FAULTS = {
    # kind: (code, subcode, is_transient, HTTP status)
    "rate_limit": (80003, 2446289, True, 400),
    "user_rate_limit": (17, 2446079, True, 400),
    "account_rate_limit": (613, 1487742, True, 400),
    "app_rate_limit": (4, None, True, 400),
    "server_error": (2, None, True, 500),
    "invalid_parameter": (100, None, False, 400),
    "sensitive_category": (100, 1713230, False, 400),
}


def test_every_fault_kind_is_covered() -> None:
    assert set(META_FAULT_KINDS) == {
        *ERROR_FAULTS,
        "bad_gateway_html",
        "token_echo",
        "never_answer",
    }


def test_a_token_graph_cannot_parse_is_quoted_in_its_error(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    sandbox.inject("token_echo")
    error = graph_error(lambda: add(audience, people(0, 2)))
    assert error.api_error_code() == 190
    assert error.api_error_message() == f"Malformed access token {TOKEN}"


@pytest.mark.timeout(30)
def test_a_request_never_answered_is_held_until_the_client_gives_up(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    sandbox.inject("never_answer")
    url = f"{sandbox.graph_url}/v26.0/{audience['id']}/users"
    started = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        requests.post(url, data={"access_token": TOKEN}, timeout=(5, 1))
    assert 1 <= time.monotonic() - started < 5
    assert sandbox.requests("/users")[-1].fault == "never_answer"
    assert len(sandbox.members(audience["id"])) == 0


def test_an_app_requiring_its_secret_refuses_calls_without_a_valid_proof() -> None:
    secret = "app-secret-of-the-sandbox"
    with MetaSandbox({TOKEN: [ACCOUNT]}, app_secret=secret) as strict:
        url = f"{strict.graph_url}/v26.0/{ACCOUNT}/customaudiences"
        proof = hmac.new(secret.encode(), TOKEN.encode(), hashlib.sha256).hexdigest()
        for sent, expected in (
            ({}, "API calls from the server require an appsecret_proof argument"),
            ({"appsecret_proof": sha("wrong")}, "Invalid appsecret_proof provided in the API"),
        ):
            body = requests.get(url, params={"access_token": TOKEN, **sent}, timeout=10).json()
            assert body["error"]["code"] == 100 and expected in body["error"]["message"]
        params = {"access_token": TOKEN, "appsecret_proof": proof, "fields": "id"}
        assert requests.get(url, params=params, timeout=10).json() == {"data": []}


@pytest.mark.parametrize("kind", sorted(ERROR_FAULTS))
def test_injected_fault_raises_and_changes_nothing(
    sandbox: MetaSandbox, audience: CustomAudience, kind: str
) -> None:
    add(audience, people(0, 2))
    sandbox.inject(kind)
    error = graph_error(lambda: add(audience, people(2, 5)))
    code, subcode, transient, status = ERROR_FAULTS[kind]
    assert (error.api_error_code(), error.api_error_subcode()) == (code, subcode)
    assert error.api_transient_error() is transient and error.http_status() == status
    assert extern_ids(sandbox, audience) == {"cust-0", "cust-1"}
    assert sandbox.requests("/users")[-1].fault == kind

    add(audience, people(2, 5))  # the fault was used up by one request
    assert len(sandbox.members(audience["id"])) == 5


def test_bad_gateway_html_comes_back_as_a_response(
    sandbox: MetaSandbox, api: FacebookAdsApi, audience: CustomAudience
) -> None:
    sandbox.inject("bad_gateway_html", times=2)
    params = {"payload": upload(people(0, 3))}
    response = api.call("POST", (audience["id"], "users"), params=params)
    # SDK quirk: is_success() reads the body, so an HTML 502 is a "success" and raises nothing.
    assert response.status() == 502 and response.is_success()
    assert "502 Bad Gateway" in response.body()
    with pytest.raises(TypeError):  # the generated method chokes on the text body instead
        add(audience, people(0, 3))
    assert sandbox.members(audience["id"]) == []


def test_faults_match_paths_in_order_and_can_be_cleared(
    sandbox: MetaSandbox, api: FacebookAdsApi, audience: CustomAudience
) -> None:
    sandbox.inject("user_rate_limit", times=2, path_contains="/customaudiences")
    add(audience, people(0, 1))  # /users does not match, so it leaves the queue alone
    account = AdAccount(ACCOUNT, api=api)
    for _ in range(2):
        error = graph_error(lambda: account.create_custom_audience(params={"name": "x", **CREATE}))
        assert error.api_error_code() == 17
    account.create_custom_audience(params={"name": "x", **CREATE})

    sandbox.inject("server_error", times=3)
    sandbox.clear_faults()
    add(audience, people(1, 2))
    assert len(sandbox.members(audience["id"])) == 2
    with pytest.raises(ValueError):
        sandbox.inject("timeout")


# ----- replace sessions -------------------------------------------------------------------------


def replace(audience: CustomAudience, rows: list[Any], session_id: int, seq: int, last: bool):
    session = {"session_id": session_id, "batch_seq": seq, "last_batch_flag": last}
    return audience.create_users_replace(params={"payload": upload(rows), "session": session})


def test_replace_session_swaps_membership_on_the_last_batch(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    add(audience, people(0, 5))
    first = replace(audience, people(3, 6), session_id=77, seq=1, last=False)
    assert first["num_received"] == 3
    # Staged rows are not members yet; the audience reports the replace and refuses /users.
    assert extern_ids(sandbox, audience) == {f"cust-{n}" for n in range(5)}
    status = audience.api_get(fields=["operation_status"])["operation_status"]
    assert status["code"] != 200
    error = graph_error(lambda: add(audience, people(9, 10)))
    assert (error.api_error_code(), error.api_error_subcode()) == (2650, 1870145)

    replace(audience, people(6, 8), session_id=77, seq=2, last=False)
    replace(audience, people(6, 8), session_id=77, seq=2, last=False)  # a resent batch is fine
    last = replace(audience, people(8, 9), session_id=77, seq=3, last=True)
    assert last["num_received"] == 8
    assert extern_ids(sandbox, audience) == {f"cust-{n}" for n in range(3, 9)}
    # Meta processes the replace after its last batch: the audience stays locked meanwhile.
    assert operation_status(audience)["description"] == "Replace in progress"
    error = graph_error(lambda: add(audience, people(9, 10)))
    assert (error.api_error_code(), error.api_error_subcode()) == (2650, 1870145)
    wait_until_normal(audience)
    node = audience.api_get(fields=["operation_status", "approximate_count_lower_bound"])
    assert node["operation_status"]["code"] == 200 and node["approximate_count_lower_bound"] == 6
    add(audience, people(9, 10))  # /users works again
    assert len(sandbox.members(audience["id"])) == 7


def operation_status(audience: CustomAudience) -> dict[str, Any]:
    return audience.api_get(fields=["operation_status"])["operation_status"]


def wait_until_normal(audience: CustomAudience) -> None:
    deadline = time.monotonic() + 10
    while operation_status(audience)["code"] != 200:
        assert time.monotonic() < deadline, "the replace was never processed"
        time.sleep(0.05)


def test_a_replace_locks_the_audience_as_long_as_meta_processes_it(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    sandbox.set_limits(GraphLimits(replace_lock_seconds=3600))  # hours, as in production
    add(audience, people(0, 3))
    replace(audience, people(5, 7), session_id=91, seq=1, last=True)
    time.sleep(0.5)
    assert dict(operation_status(audience)) == {"code": 300, "description": "Replace in progress"}
    for remove in (False, True):
        method = {"method": "DELETE"} if remove else {}
        error = graph_error(lambda m=method: add(audience, people(5, 6), **m))
        assert (error.api_error_code(), error.api_error_subcode()) == (2650, 1870145)
    # Nor may another replace start before this one is done.
    error = graph_error(lambda: replace(audience, people(0, 1), 92, seq=1, last=True))
    assert (error.api_error_code(), error.api_error_subcode()) == (2650, 1870145)
    assert extern_ids(sandbox, audience) == {"cust-5", "cust-6"}


def test_replace_session_protocol_errors(sandbox: MetaSandbox, audience: CustomAudience) -> None:
    def subcode(call: Any) -> tuple[int, int]:
        error = graph_error(call)
        return error.api_error_code(), error.api_error_subcode()

    rows = people(0, 2)
    assert subcode(lambda: replace(audience, rows, 5, seq=2, last=True)) == (2650, 1870147)
    replace(audience, rows, 5, seq=1, last=False)
    assert subcode(lambda: replace(audience, rows, 5, seq=1, last=False)) == (2650, 1870159)
    assert subcode(lambda: replace(audience, rows, 6, seq=1, last=False)) == (2650, 1870145)
    replace(audience, rows, 5, seq=2, last=True)
    assert subcode(lambda: replace(audience, rows, 5, seq=3, last=True)) == (2650, 1870159)
    missing_session = {"payload": upload(rows)}
    error = graph_error(lambda: audience.create_users_replace(params=missing_session))
    assert error.api_error_code() == 100
    assert extern_ids(sandbox, audience) == {"cust-0", "cust-1"}


# ----- tokens, versions, recording -----------------------------------------------------------


def test_tokens_and_ownership(sandbox: MetaSandbox, audience: CustomAudience) -> None:
    for token in ("not-a-token", None):
        stranger = CustomAudience(audience["id"], api=graph_api(sandbox, token))
        error = graph_error(lambda: stranger.api_get(fields=["name"]))  # noqa: B023
        assert error.api_error_code() == 190 and error.api_error_type() == "OAuthException"
    other = CustomAudience(audience["id"], api=graph_api(sandbox, OTHER_TOKEN))
    error = graph_error(lambda: add(other, people(0, 1)))
    assert error.api_error_code() == 200
    assert sandbox.members(audience["id"]) == []


def test_any_graph_version_and_unknown_paths(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    older = CustomAudience(audience["id"], api=graph_api(sandbox, version="v19.0"))
    assert older.api_get(fields=["name"])["name"] == audience.api_get(fields=["name"])["name"]
    versioned = [r.path for r in sandbox.requests() if r.path.startswith("/v19.0/")]
    assert versioned == [f"/v19.0/{audience['id']}/"]

    api = graph_api(sandbox)
    for method, path in [("GET", (audience["id"], "users")), ("POST", ("999", "users"))]:
        error = graph_error(lambda: api.call(method, path))  # noqa: B023
        assert (error.api_error_code(), error.api_error_subcode()) == (100, 33)


def test_requests_are_recorded_with_parsed_payloads(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    session = {"session_id": 42, "batch_seq": 1, "last_batch_flag": True}
    add(audience, people(0, 2), session=session)
    (recorded,) = sandbox.requests("/users")
    assert recorded.method == "POST" and recorded.status == 200 and recorded.fault is None
    assert recorded.payload == upload(people(0, 2)) and recorded.session == session
    assert recorded.query["access_token"] == TOKEN
    assert time.time() - 60 < recorded.at <= time.time()

    served = requests.get(f"{sandbox.graph_url}/_sandbox/requests?path_contains=/users", timeout=5)
    assert served.json()[0]["form"]["payload"]["data"] == people(0, 2)
    listing = requests.get(f"{sandbox.graph_url}/_sandbox/audiences", timeout=5).json()
    mine = next(a for a in listing[ACCOUNT] if a["id"] == audience["id"])
    assert mine["approximate_count_upper_bound"] == 2
    sandbox.clear_requests()
    assert sandbox.requests() == []


# ----- volume and concurrency ----------------------------------------------------------------


def test_100k_adds_in_10_requests(sandbox: MetaSandbox, audience: CustomAudience) -> None:
    # Timing is the benchmark's business (cdp_devkit/bench/activation.py); this checks the volume.
    for batch in range(10):
        session = {"session_id": 9, "batch_seq": batch + 1, "last_batch_flag": batch == 9}
        result = add(audience, people(batch * 10_000, (batch + 1) * 10_000), session=session)
        assert result["num_received"] == (batch + 1) * 10_000
    assert len(sandbox.members(audience["id"])) == 100_000


def test_concurrent_uploads_lose_nothing(sandbox: MetaSandbox, audience: CustomAudience) -> None:
    def worker(offset: int) -> None:
        # One API per thread: the SDK's requests.Session is not meant to be shared.
        mine = CustomAudience(audience["id"], api=graph_api(sandbox))
        for start in range(offset, offset + 500, 100):
            add(mine, people(start, start + 100))

    threads = [threading.Thread(target=worker, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sandbox.members(audience["id"])) == 2000
    assert [r.status for r in sandbox.requests("/users")] == [200] * 20


# ----- paging and rate limits ------------------------------------------------------------------


def test_audience_listings_are_paged_25_at_a_time(
    sandbox: MetaSandbox, api: FacebookAdsApi
) -> None:
    account = AdAccount(f"act_{PAGED_ACCOUNT}", api=api)
    for n in range(60):
        account.create_custom_audience(params={"name": f"paged {n}", **CREATE})
    path = f"/act_{PAGED_ACCOUNT}/customaudiences"
    first = requests.get(
        f"{sandbox.graph_url}/v21.0{path}", params={"access_token": TOKEN, "fields": "name"}
    ).json()
    assert [a["name"] for a in first["data"]] == [f"paged {n}" for n in range(25)]
    assert first["paging"]["next"].startswith(f"{sandbox.graph_url}/v21.0{path}?")
    last = requests.get(first["paging"]["next"], params={"access_token": TOKEN, "limit": 50}).json()
    assert [a["name"] for a in last["data"]] == [f"paged {n}" for n in range(25, 60)]
    assert "next" not in last["paging"]  # the last page
    # The SDK's cursor follows the pages to the end.
    listed = account.get_custom_audiences(fields=["name"])
    assert [a["name"] for a in listed] == [f"paged {n}" for n in range(60)]


def test_minutes_to_regain_are_whole_minutes_of_the_wait_not_of_its_float_error() -> None:
    # A monotonic clock reading at which now + 300 - now is 300.00000000006.
    now = 524053.39072207216
    assert (now + 300) - now > 300
    assert minutes_to_regain(now + 300, now) == 5
    assert minutes_to_regain(now + 300.5, now) == 6
    assert minutes_to_regain(now + 1, now) == 1
    assert minutes_to_regain(now, now) == 0


def usage_headers(response: requests.Response) -> tuple[dict[str, Any], dict[str, Any]]:
    business = response.headers["X-Business-Use-Case-Usage"]
    return orjson.loads(business), orjson.loads(response.headers["X-Ad-Account-Usage"])


def test_usage_is_reported_and_past_100_percent_the_account_is_throttled_for_minutes(
    sandbox: MetaSandbox, audience: CustomAudience
) -> None:
    sandbox.set_limits(GraphLimits(calls_per_window=10, window_seconds=3600, throttle_seconds=300))
    url = f"{sandbox.graph_url}/v21.0/{audience['id']}"
    read = {"access_token": TOKEN, "fields": "name"}
    sandbox.use(ACCOUNT, 6)
    answer = requests.get(url, params=read)
    business, account = usage_headers(answer)
    (usage,) = business[ACCOUNT.removeprefix("act_")]
    assert answer.status_code == 200 and usage["type"] == "custom_audience"
    assert usage["call_count"] == 70 and usage["estimated_time_to_regain_access"] == 0
    assert account["acc_id_util_pct"] == 70
    for _ in range(3):
        assert requests.get(url, params=read).status_code == 200
    over = requests.get(url, params=read)  # the 11th call of the window
    assert over.json()["error"]["code"] == 80003
    (usage,) = usage_headers(over)[0][ACCOUNT.removeprefix("act_")]
    assert usage["call_count"] == 100 and usage["estimated_time_to_regain_access"] == 5
    # Every call on the account is refused while the throttle lasts, adds included.
    error = graph_error(lambda: add(audience, people(0, 1)))
    assert error.api_error_code() == 80003
    assert extern_ids(sandbox, audience) == set()
