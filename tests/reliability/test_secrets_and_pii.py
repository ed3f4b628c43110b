"""Secrets and PII: after a full run (shared_tenants.py: VTEX sandbox -> ingestion -> dbt,
CLV, churn -> audiences -> Meta, Google Data Manager, Google Ads and VTEX collections) and
after runs made to fail (a refused VTEX token, a VTEX redirect to another host, a VTEX error
echoing the request's headers, a VTEX token ending in a newline, Meta unreachable, a refused
Meta token, a Meta error quoting the token, Google denying access), no credential value and no
raw e-mail or phone appears in anything the platform writes or sends outside the warehouse:

- Dagster's event log (every entry of every run: messages, metadata, errors), run storage
  (tags, config) and compute logs (what each step printed);
- what was printed or logged (file descriptors, Python streams, the logging module);
- what the Meta and Google sandboxes received, except the credentials they must receive
  (Meta's `access_token` parameter, Google's `developer-token` header), and what reached the
  host a VTEX redirect pointed to;
- exception texts, cdp.sync_errors (filled by the real failure sensor), the alerts it posted
  to the webhook, cdp.activation_runs and cdp.activation_rejects.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import phonenumbers
import psycopg
import pytest
from shared_tenants import STORES, Pipeline, shared_pipeline

from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.google.resources import GoogleResource
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.lib.redaction import redact, remember
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.sensors import sync_errors_sensor
from cdp_assets.ops.webhook import WEBHOOK_ENV
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.assets import vtex_products
from cdp_assets.vtex.resources import VtexResource
from cdp_devkit.sandbox import (
    GoogleSandbox,
    MetaSandbox,
    SandboxProcess,
    StoreSpec,
    credentials_for,
)

# What each sandbox must receive, so is not a leak there.
META_AUTH_PARAMS = {"access_token", "appsecret_proof"}
GOOGLE_AUTH_HEADERS = {"developer-token", "authorization"}


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@contextmanager
def webhook() -> Iterator[tuple[str, list[str]]]:
    """An alert webhook on loopback: its URL and the bodies posted to it."""
    posted: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/alerts", posted
    finally:
        server.shutdown()
        server.server_close()


def record_failure(
    instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult, warehouse_url: str
) -> None:
    """What the daemon does with a failed run: the real sensor fills cdp.sync_errors."""
    assert not result.success
    context = dg.build_run_status_sensor_context(
        sensor_name=sync_errors_sensor.name,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(),
        resources={"warehouse": WarehouseResource(url=warehouse_url)},
    )
    sync_errors_sensor(context)


def provoke_failures(
    warehouse_url: str,
    instance: dg.DagsterInstance,
    pipeline: Pipeline,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, str], list[str], list, list[str], list[str]]:
    """Eight failed runs; the credentials they used, their exception texts, the requests the
    sandboxes saw, what the host a redirect pointed to received, and the alerts posted."""
    store = StoreSpec("leaky", 9, 3, 5, 2)
    key, token = credentials_for(store.account)
    wrong = {
        "refused VTEX token": f"vtex-wrong-token-{uuid.uuid4().hex}",
        "refused Meta token": f"meta-wrong-token-{uuid.uuid4().hex}",
        "VTEX app token of leaky": token,
    }
    results = []
    # Tenants of one store: a VTEX app token the store refuses (its key is right: a secret too);
    # answers redirecting to another host, or echoing the request's headers in an error; the
    # right token with the newline it was pasted with.
    monkeypatch.setenv("VTEX_LEAKY_KEY", key)
    monkeypatch.setenv("VTEX_LEAKY_WRONG_TOKEN", wrong["refused VTEX token"])
    monkeypatch.setenv("VTEX_LEAKY_TOKEN", token)
    monkeypatch.setenv("VTEX_LEAKY_PASTED_TOKEN", token + "\n")
    leaky = {
        "leaky": "VTEX_LEAKY_WRONG_TOKEN",
        "leaky_redirect": "VTEX_LEAKY_TOKEN",
        "leaky_echo": "VTEX_LEAKY_TOKEN",
        "leaky_pasted": "VTEX_LEAKY_PASTED_TOKEN",
    }
    with psycopg.connect(warehouse_url) as conn:
        for tenant_id, token_ref in leaky.items():
            add_tenant(conn, Tenant(tenant_id, "leaky", "VTEX_LEAKY_KEY", token_ref))
        conn.commit()
    instance.add_dynamic_partitions(tenants.name, list(leaky))
    warehouse = WarehouseResource()
    with SandboxProcess([store]) as vtex:
        elsewhere = vtex.base_url.replace("127.0.0.1", "localhost")  # another origin
        faults = {
            "leaky_redirect": {"redirect": {"get_product": elsewhere}},
            "leaky_echo": {"echo_headers": ["get_product"]},
        }
        for tenant_id in leaky:
            vtex.set_faults(faults.get(tenant_id, {}))
            results.append(
                dg.materialize(
                    [vtex_products],
                    partition_key=tenant_id,
                    instance=instance,
                    resources={
                        "warehouse": warehouse,
                        "vtex": VtexResource(
                            base_url_template=vtex.base_url + "/{account}", max_retries=1
                        ),
                    },
                    raise_on_error=False,
                )
            )
        captured = [json.dumps(request) for request in vtex.captured()]
    # The tenants' own tokens, back in the environment for these runs.
    for tenant_id in STORES:
        monkeypatch.setenv(
            f"META_{tenant_id.upper()}_TOKEN", pipeline.secrets[f"Meta token of {tenant_id}"]
        )
    monkeypatch.setenv(
        "GOOGLE_ADS_ISO_C_DEVELOPER_TOKEN", pipeline.secrets["Google developer token"]
    )
    # Meta unreachable: the SDK's error quotes the URL, and a GET carries the token in it.
    unreachable = MetaResource(graph_url=closed_port_url(), attempts=2, retry_base_seconds=0.01)
    results.append(push(meta_custom_audiences, "iso_a", instance, warehouse, meta=unreachable))
    # A token Meta refuses.
    monkeypatch.setenv("META_ISO_B_TOKEN", wrong["refused Meta token"])
    with MetaSandbox({}) as meta, GoogleSandbox(job_seconds=0) as google:
        resource = MetaResource(graph_url=meta.graph_url, retry_base_seconds=0.01)
        results.append(push(meta_custom_audiences, "iso_b", instance, warehouse, meta=resource))
        # An error quoting the (right) token.
        meta.inject("token_echo", path_contains="/")
        results.append(push(meta_custom_audiences, "iso_a", instance, warehouse, meta=resource))
        # Google Ads denying the developer token's access.
        for method in ("Search", "SearchStream", "MutateUserLists"):
            google.inject(method, "not_allowlisted", times=20)
        resource = GoogleResource(sandbox_address=google.address, retry_base_seconds=0.01)
        results.append(push(google_customer_match, "iso_c", instance, warehouse, google=resource))
        requests = [*meta.requests(), *google.requests()]
    exceptions = []
    with webhook() as (url, alerts):
        monkeypatch.setenv(WEBHOOK_ENV, url)
        for result in results:
            record_failure(instance, result, warehouse_url)
            exceptions += [
                str(event.step_failure_data.error)
                for event in result.all_events
                if event.is_step_failure
            ]
    assert len(exceptions) >= len(results) and len(alerts) == len(results)
    return wrong, exceptions, requests, captured, alerts


def compute_logs(instance: dg.DagsterInstance) -> list[str]:
    """What the steps printed, as the instance's compute log manager kept it."""
    root = Path(instance.root_directory)
    return [path.read_text(errors="replace") for path in root.rglob("*") if path.is_file()]


def push(
    asset: dg.AssetsDefinition,
    tenant_id: str,
    instance: dg.DagsterInstance,
    warehouse: WarehouseResource,
    **resources: Any,
) -> dg.ExecuteInProcessResult:
    """A forced full replace: the audiences were pushed already, and an unchanged audience's
    diff would make no call to fail on (a replace alone is refused as a mass removal)."""
    return dg.materialize(
        [asset],
        partition_key=tenant_id,
        instance=instance,
        resources={"warehouse": warehouse, **resources},
        run_config={"ops": {asset.key.path[-1]: {"config": {"full_replace": True, "force": True}}}},
        raise_on_error=False,
    )


def event_log_texts(instance: dg.DagsterInstance) -> tuple[list[str], list[str], list[str]]:
    """(every event log entry, run storage of every run, materialization metadata) as text."""
    entries, runs, metadata = [], [], []
    for run in instance.get_runs():
        runs.append(dg.serialize_value(run))
        runs.append(json.dumps([run.tags, run.run_config], default=str))
        for entry in instance.all_logs(run.run_id):
            entries.append(dg.serialize_value(entry))
            entries.append(entry.user_message)
            event = entry.dagster_event
            if event is not None and event.is_step_materialization:
                materialization = event.step_materialization_data.materialization
                metadata.append(
                    json.dumps({k: str(v.value) for k, v in materialization.metadata.items()})
                )
    return entries, runs, metadata


def request_texts(requests: Iterable) -> list[str]:
    """What the sandboxes received, minus the credentials they must receive."""
    texts = []
    for request in requests:
        if hasattr(request, "form"):  # Meta
            params = {**request.query, **request.form}
            texts.append(
                f"{request.method} {request.path} "
                + json.dumps({k: v for k, v in params.items() if k not in META_AUTH_PARAMS})
            )
        else:  # Google
            metadata = {
                k: str(v) for k, v in request.metadata.items() if k not in GOOGLE_AUTH_HEADERS
            }
            texts.append(f"{request.method} {json.dumps(request.request)} {json.dumps(metadata)}")
    return texts


def table_texts(conn: psycopg.Connection) -> dict[str, list[str]]:
    return {
        table: [text for (text,) in conn.execute(f"SELECT t::text FROM {table} t")]
        for table in ("cdp.sync_errors", "cdp.activation_runs", "cdp.activation_rejects")
    }


EMAIL_LIKE = re.compile(r"[^\s\"'<>(),;:\\]*@[^\s\"'<>(),;:\\]+")
DIGIT_RUN = re.compile(r"\d[\d ().-]{5,}\d")


def pii_forms(emails: set[str], phones: set[str]) -> tuple[set[str], set[str]]:
    """(e-mails, phone digit strings) to look for: each raw value as stored and the forms it
    takes once normalized (a leaked normalized address is as much a leak). A phone is looked
    for by its digits, so it is found however it was punctuated."""
    email_forms = {form for email in emails for form in (email, email.strip().lower())}
    phone_forms = set()
    for phone in phones:
        phone_forms.add(re.sub(r"\D", "", phone))
        try:
            number = phonenumbers.parse(phone, "BR")
        except phonenumbers.NumberParseException:
            continue
        phone_forms.add(str(number.national_number))
    return email_forms, {form for form in phone_forms if len(form) >= 8}


def find_leaks(
    sources: dict[str, list[str]], secrets: dict[str, str], emails: set[str], phones: set[str]
) -> list[tuple[str, str]]:
    """(source, what leaked). Substring search of thousands of values through megabytes of
    text is slow, so e-mails are looked for among the e-mail-like tokens of the text and
    phones among its digit runs, both reduced to one string per source."""
    leaks = []
    for source, texts in sources.items():
        text = "\n".join(texts)
        leaks += [
            (source, f"credential: {name}") for name, value in secrets.items() if value in text
        ]
        tokens = "\n".join(EMAIL_LIKE.findall(text))
        tokens_lower = tokens.lower()
        leaks += [
            (source, f"e-mail {email!r}")
            for email in emails
            if email in tokens_lower or email in tokens
        ]
        runs = "|".join(re.sub(r"\D", "", run) for run in DIGIT_RUN.findall(text))
        leaks += [(source, f"phone {phone}") for phone in phones if phone in runs]
    return leaks


def test_no_secret_or_raw_pii_anywhere_after_a_full_run(
    warehouse_url, instance, capfd, caplog, monkeypatch, reliability_report
):
    caplog.set_level(logging.INFO)
    pipeline = shared_pipeline(warehouse_url, instance)
    wrong, exceptions, failed_requests, captured, alerts = provoke_failures(
        warehouse_url, instance, pipeline, monkeypatch
    )
    secrets = {**pipeline.secrets, **wrong}
    secrets["VTEX app key of leaky"] = credentials_for("leaky")[0]
    emails, phones = pii_forms(pipeline.raw_emails, pipeline.raw_phones)
    assert len(emails) > 100 and len(phones) > 100

    entries, runs, metadata = event_log_texts(instance)
    captured = capfd.readouterr()
    with psycopg.connect(warehouse_url) as conn:
        tables = table_texts(conn)
    sources: dict[str, list[str]] = {
        "event log": entries,
        "run storage": runs,
        "materialization metadata": metadata,
        "captured output": [pipeline.output, captured.out, captured.err],
        "log records": [*pipeline.log_records, caplog.text],
        "sandbox requests": request_texts(
            [*pipeline.meta_requests, *pipeline.google_requests, *failed_requests]
        ),
        "exception texts": exceptions,
        "compute logs": compute_logs(instance),
        "the host a redirect pointed to": captured,
        "webhook posts": alerts,
        **tables,
    }
    # The scan is worth something only if these were not empty.
    assert len(metadata) > 20 and len(sources["sandbox requests"]) > 10
    assert tables["cdp.sync_errors"] and tables["cdp.activation_runs"]
    # The unreachable Meta did fail, by a connection error (its text once held the token), and
    # so did the others, each as provoked.
    assert "ConnectionError" in " ".join(tables["cdp.activation_runs"])
    errors = " ".join(tables["cdp.sync_errors"])
    for cause in ("another origin (localhost)", "HTTP 400", "VTEX_LEAKY_PASTED_TOKEN"):
        assert cause in errors, cause
    assert "Malformed access token ***" in " ".join(tables["cdp.activation_runs"])
    assert sources["compute logs"]

    leaks = find_leaks(sources, secrets, emails, phones)
    texts = sum(len(texts) for texts in sources.values())
    reliability_report.record(
        f"secrets and PII: {len(secrets) + len(emails) + len(phones)} values in {texts} texts",
        faults=f"{len(exceptions)} failed runs (refused tokens, a redirect to another host, a"
        " header echo, a pasted newline, Meta unreachable, a token quoted, Google denied)",
        checked=texts,
        lost=len(leaks),  # a leaked value is lost secrecy
        duplicates=0,
        passed=not leaks,
    )
    assert not leaks, leaks


def test_the_scan_finds_planted_values():
    """However a value is written (case, padding, phone punctuation), the scan sees it."""
    emails, phones = pii_forms({" Ana.Souza12@Gmail.com "}, {"(21) 95127-2727"})
    sources = {
        "log": [
            "sent to ana.souza12@gmail.com",
            "called +55 21 95127-2727 twice",
            "authorization: tok-1234567890",
        ]
    }
    leaks = find_leaks(sources, {"planted": "tok-1234567890"}, emails, phones)
    assert sorted(kind.split()[0] for _, kind in leaks) == ["credential:", "e-mail", "phone"]
    assert find_leaks({"log": ["nothing here 2195"]}, {"planted": "tok-1"}, emails, phones) == []


def test_redaction_masks_every_credential_read_in_every_form_an_echo_gives_it():
    """A value read as a credential is masked whatever its variable is named: as written,
    stripped of the newline it was pasted with, JSON-escaped, URL-encoded, and as Python's
    repr quotes it (requests' InvalidHeader)."""
    value = 'tok/"quoted" value+1\n'
    remember(value)
    texts = {
        "raw": f"header value: {value}",
        "stripped": f"Malformed access token {value.strip()}",
        "repr": f"InvalidHeader: header value: {value!r}",
        "JSON": json.dumps({"echo": value}),
        "URL": "GET /x?token_like=tok%2F%22quoted%22%20value%2B1%0A",
        "form": "payload=tok%2F%22quoted%22+value%2B1",
    }
    for form, text in texts.items():
        assert "quoted" not in redact(text, environ={}), form
