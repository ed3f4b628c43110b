"""Secrets and PII: after a full run (shared_tenants.py: VTEX sandbox -> ingestion -> dbt,
CLV, churn -> audiences -> Meta, Google Data Manager, Google Ads and VTEX collections) and
after runs made to fail (a refused VTEX token, Meta unreachable, a refused Meta token, Google
denying access), no credential value and no raw e-mail or phone appears in anything the
platform writes or sends outside the warehouse:

- Dagster's event log (every entry of every run: messages, metadata, errors) and run storage
  (tags, config);
- what was printed or logged (file descriptors, Python streams, the logging module);
- what the Meta and Google sandboxes received, except the credentials they must receive
  (Meta's `access_token` parameter, Google's `developer-token` header);
- exception texts, cdp.sync_errors (filled by the real failure sensor), cdp.activation_runs
  and cdp.activation_rejects.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import uuid
from collections.abc import Iterable
from typing import Any

import dagster as dg
import phonenumbers
import psycopg
import pytest
from shared_tenants import STORES, Pipeline, shared_pipeline

from cdp_assets.google.assets import google_customer_match
from cdp_assets.google.resources import GoogleResource
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.assets import meta_custom_audiences
from cdp_assets.meta.resources import MetaResource
from cdp_assets.ops.sensors import sync_errors_sensor
from cdp_assets.partitions import tenants
from cdp_assets.sandbox import (
    GoogleSandbox,
    MetaSandbox,
    SandboxProcess,
    StoreSpec,
    credentials_for,
)
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.assets import vtex_customers
from cdp_assets.vtex.resources import VtexResource

# What each sandbox must receive, so is not a leak there.
META_AUTH_PARAMS = {"access_token", "appsecret_proof"}
GOOGLE_AUTH_HEADERS = {"developer-token", "authorization"}


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


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
) -> tuple[dict[str, str], list[str], list]:
    """Four failed runs; the credentials they used, their exception texts, and the requests
    the sandboxes saw."""
    wrong = {
        "refused VTEX token": f"vtex-wrong-token-{uuid.uuid4().hex}",
        "refused Meta token": f"meta-wrong-token-{uuid.uuid4().hex}",
    }
    results = []
    # A VTEX app token the store refuses (its key is right: a secret too).
    store = StoreSpec("leaky", 9, 3, 5, 2)
    key, _ = credentials_for(store.account)
    monkeypatch.setenv("VTEX_LEAKY_KEY", key)
    monkeypatch.setenv("VTEX_LEAKY_TOKEN", wrong["refused VTEX token"])
    with psycopg.connect(warehouse_url) as conn:
        add_tenant(conn, Tenant("leaky", "leaky", "VTEX_LEAKY_KEY", "VTEX_LEAKY_TOKEN"))
        conn.commit()
    instance.add_dynamic_partitions(tenants.name, ["leaky"])
    warehouse = WarehouseResource()
    with SandboxProcess([store]) as vtex:
        results.append(
            dg.materialize(
                [vtex_customers],
                partition_key="leaky",
                instance=instance,
                resources={
                    "warehouse": warehouse,
                    "vtex": VtexResource(base_url_template=vtex.base_url + "/{account}"),
                },
                raise_on_error=False,
            )
        )
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
    with MetaSandbox({}) as meta, GoogleSandbox(running_polls=0) as google:
        resource = MetaResource(graph_url=meta.graph_url, retry_base_seconds=0.01)
        results.append(push(meta_custom_audiences, "iso_b", instance, warehouse, meta=resource))
        # Google Ads denying the developer token's access.
        for method in ("Search", "SearchStream", "MutateUserLists"):
            google.inject(method, "not_allowlisted", times=20)
        resource = GoogleResource(sandbox_address=google.address, retry_base_seconds=0.01)
        results.append(push(google_customer_match, "iso_c", instance, warehouse, google=resource))
        requests = [*meta.requests(), *google.requests()]
    exceptions = []
    for result in results:
        record_failure(instance, result, warehouse_url)
        exceptions += [
            str(event.step_failure_data.error)
            for event in result.all_events
            if event.is_step_failure
        ]
    assert len(exceptions) >= len(results)
    return wrong, exceptions, requests


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
    wrong, exceptions, failed_requests = provoke_failures(
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
        **tables,
    }
    # The scan is worth something only if these were not empty.
    assert len(metadata) > 20 and len(sources["sandbox requests"]) > 10
    assert tables["cdp.sync_errors"] and tables["cdp.activation_runs"]
    # The unreachable Meta did fail, by a connection error (its text once held the token).
    assert "ConnectionError" in " ".join(tables["cdp.activation_runs"])

    leaks = find_leaks(sources, secrets, emails, phones)
    texts = sum(len(texts) for texts in sources.values())
    reliability_report.record(
        f"secrets and PII: {len(secrets) + len(emails) + len(phones)} values in {texts} texts",
        faults=f"{len(exceptions)} failed runs (refused tokens, Meta unreachable, Google denied)",
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
