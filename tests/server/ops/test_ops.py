"""Operations endpoints and metrics (docs/operations.md): /healthz and /readyz without login,
/readyz naming what is not ready, /metrics for the token or an unproxied loopback client
only, database gauges computed at scrape time, and the counters and gauges counted where
things happen (appends, publish drops, lease expiries and recoveries, websockets, SSE).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app import actions, runs
from sessions_app.api.sse import RunStream
from sessions_app.journal import DatabaseJournal
from sessions_app.journal.publish import publish_on_commit
from sessions_app.models import Run
from sessions_app.ops import views as ops_views
from tests.server.chat.test_consumers import connect, frames_until_ready

BROKEN_REDIS = {
    "default": {
        "BACKEND": "sectr_web.channel_layer.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"], "prefix": "ops11-broken"},
    }
}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def scrape(client: Client, **extra: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


# ---- health and readiness ----


@pytest.mark.django_db
def test_healthz_answers_without_login() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json()["ok"] is True


@pytest.mark.django_db(transaction=True)  # readyz's checks use database_sync_to_async
def test_readyz_answers_without_login_when_everything_is_ready() -> None:
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["ok"] is True and body["failing"] == []
    assert set(body["checks"]) == {"database", "migrations", "channel_layer", "plugins"}
    assert "plugin_failures" not in body
    assert all(outcome.startswith("ok") for outcome in body["checks"].values())


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_naming_the_channel_layer_when_it_is_down(settings: Any, caplog: Any) -> None:
    settings.CHANNEL_LAYERS = BROKEN_REDIS
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["channel_layer"]
    # Anyone may read this: the check is named, its exception (host, port, error) is not.
    assert body["checks"]["channel_layer"] == "failed"
    assert "127.0.0.1" not in response.content.decode() and "Error" not in response.content.decode()
    assert body["checks"]["database"].startswith("ok")
    (logged,) = [r for r in caplog.records if r.name == "sectr.ops" and "channel_layer" in r.getMessage()]
    assert logged.exc_info is not None  # the operator's log has the exception


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_naming_unapplied_migrations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_views, "_migrated", False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, app, name, applied FROM django_migrations WHERE app = 'sessions_app' ORDER BY id")
        row = cursor.fetchall()[-1]
        cursor.execute("DELETE FROM django_migrations WHERE id = %s", [row[0]])
    try:
        response = Client().get("/readyz")
        body = response.json()
        assert response.status_code == 503 and body["failing"] == ["migrations"]
        assert body["checks"]["migrations"] == "1 unapplied migration(s)"  # the names are in the log
    finally:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO django_migrations (id, app, name, applied) VALUES (%s, %s, %s, %s)", row)
    assert Client().get("/readyz").status_code == 200


# ---- who may read /metrics ----


@pytest.mark.django_db
def test_metrics_answer_a_loopback_client_without_login() -> None:
    samples = scrape(Client())  # the test client's REMOTE_ADDR is 127.0.0.1
    assert ("sectr_run_queue_depth", ()) in samples
    assert ("sectr_runs", (("state", "queued"),)) in samples


@pytest.mark.django_db
@pytest.mark.parametrize(
    "extra",
    [
        {"REMOTE_ADDR": "10.1.2.3"},
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.9"},  # through a local proxy
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_FORWARDED": "for=203.0.113.9"},
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_REAL_IP": "203.0.113.9"},  # nginx's usual header
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_HOST": "sectr.example.com"},
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_PROTO": "https"},
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_VIA": "1.1 proxy"},
        {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": ""},  # present, even empty
        {"REMOTE_ADDR": "10.1.2.3", "HTTP_AUTHORIZATION": "Bearer wrong-token"},
    ],
)
def test_metrics_refuse_other_clients(extra: dict[str, str], settings: Any) -> None:
    settings.SECTR_METRICS_TOKEN = "s3cret-metrics"
    response = Client().get("/metrics", **extra)
    assert response.status_code == 403
    assert b"sectr_" not in response.content


@pytest.mark.django_db
def test_metrics_answer_the_token_from_anywhere(settings: Any) -> None:
    settings.SECTR_METRICS_TOKEN = "s3cret-metrics"
    scrape(Client(), REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR="1.2.3.4", HTTP_AUTHORIZATION="Bearer s3cret-metrics")


@pytest.mark.django_db
def test_without_a_token_only_loopback_may_read(settings: Any) -> None:
    settings.SECTR_METRICS_TOKEN = ""
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer ").status_code == 403


# ---- database gauges, at scrape time ----


@pytest.mark.django_db
def test_runs_by_state_queue_and_asks_come_from_the_database(make_session: Any, owner: Any) -> None:
    first, second, third = make_session(), make_session(), make_session()
    actions.do_post_message(owner, first.pk, "hello")
    actions.do_post_message(owner, second.pk, "hello")
    Run.objects.filter(session=second).update(created_at=timezone.now() - timedelta(seconds=90))
    actions.do_post_message(owner, third.pk, "note: x")
    run = Run.objects.get(session=third)
    claim = runs.claim_next_run("w-test", 30.0)
    assert claim is not None and claim.run_id != run.pk  # the oldest (second's) run first

    samples = scrape(Client())
    assert samples[("sectr_runs", (("state", "running"),))] == 1
    assert samples[("sectr_runs", (("state", "queued"),))] == 2
    assert samples[("sectr_runs", (("state", "completed"),))] == 0
    assert samples[("sectr_run_queue_depth", ())] == 2
    assert 0 <= samples[("sectr_run_queue_oldest_age_seconds", ())] < 60  # the 90 s one was claimed
    assert samples[("sectr_asks_pending", ())] == 0
    assert samples[("sectr_asks_pending_oldest_age_seconds", ())] == 0


# ---- counters where things happen ----


@pytest.mark.django_db(transaction=True)
def test_appends_count_envelopes_and_deltas_once_committed(make_session: Any) -> None:
    session = make_session()
    envelopes, deltas = sample("sectr_journal_envelopes_total"), sample("sectr_journal_deltas_total")
    journal = DatabaseJournal()
    journal.append_sync(session.pk, [NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"})])
    journal.append_sync(
        session.pk, [NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m1", "text": t}) for t in ("a", "b", "c")]
    )
    async_to_sync(journal.append)(session.pk, [NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m1", "text": "d"})])
    assert sample("sectr_journal_envelopes_total") - envelopes == 5
    assert sample("sectr_journal_deltas_total") - deltas == 4


@pytest.mark.django_db(transaction=True)
def test_failed_publications_are_counted_as_drops(make_session: Any, settings: Any) -> None:
    session = make_session()
    before = sample("sectr_publish_drops_total", group_kind="session")
    settings.CHANNEL_LAYERS = BROKEN_REDIS
    envelope = DatabaseJournal(publish=False).append_sync(
        session.pk, [NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"})]
    )
    publish_on_commit(envelope)  # outside a transaction: sent now, to a Redis that is not there
    assert sample("sectr_publish_drops_total", group_kind="session") - before == 1


@pytest.mark.django_db(transaction=True)
def test_an_expired_lease_counts_an_expiry_and_a_recovery(make_session: Any, owner: Any) -> None:
    session = make_session()
    actions.do_post_message(owner, session.pk, "hello")
    expiries = sample("sectr_run_lease_expiries_total", outcome="recovered")
    recoveries = sample("sectr_run_recoveries_total")
    first = runs.claim_next_run("w-dead", 30.0)
    assert first is not None
    Run.objects.filter(pk=first.run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    second = runs.claim_next_run("w-rescuer", 30.0)
    assert second is not None and second.recovered
    assert sample("sectr_run_lease_expiries_total", outcome="recovered") - expiries == 1
    assert sample("sectr_run_recoveries_total") - recoveries == 1
    assert scrape(Client())[("sectr_run_recoveries_total", ())] >= 1


@pytest.fixture
def no_embedded_worker(settings: Any) -> Iterator[None]:
    settings.SECTR_EMBEDDED_WORKER = False
    yield


@pytest.mark.django_db(transaction=True)
async def test_open_websockets_are_a_gauge(make_session: Any, owner: Any, no_embedded_worker: None) -> None:
    session = await database_sync_to_async(make_session)()
    before = sample("sectr_websocket_clients", consumer="chat")
    communicator, connected, _ = await connect(owner, f"/ws/sessions/{session.pk}/?after=0")
    assert connected
    await frames_until_ready(communicator)
    assert sample("sectr_websocket_clients", consumer="chat") - before == 1
    await communicator.disconnect()
    assert sample("sectr_websocket_clients", consumer="chat") == before
    refused, connected, _ = await connect(None, f"/ws/sessions/{session.pk}/?after=0")
    assert not connected  # a refused socket is never counted
    assert sample("sectr_websocket_clients", consumer="chat") == before


@pytest.mark.django_db(transaction=True)
async def test_open_sse_streams_are_a_gauge(make_session: Any, owner: Any) -> None:
    session = await database_sync_to_async(make_session)()
    run = await database_sync_to_async(actions.do_post_message)(owner, session.pk, "hello")
    before = sample("sectr_sse_clients")
    frames = RunStream(run, 0).frames()
    assert (await frames.__anext__()).startswith(b": stream of ")
    assert sample("sectr_sse_clients") - before == 1
    await frames.aclose()
    assert sample("sectr_sse_clients") == before


# ---- several processes: prometheus_client's multiprocess mode ----

COUNT_IN_A_PROCESS = """
import django
django.setup()
from sessions_app.telemetry import metrics
metrics.ENVELOPES.inc(7)
metrics.WEBSOCKET_CLIENTS.labels("chat").inc(2)
"""

SCRAPE_IN_A_PROCESS = """
import django
django.setup()
from sessions_app.telemetry import metrics
from sessions_app.ops.views import process_metrics_text
metrics.ENVELOPES.inc(5)
print(process_metrics_text().decode())
"""


def test_multiprocess_mode_adds_up_the_processes_of_a_machine(tmp_path: Any) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "sectr_web.settings"}
    for _ in range(2):  # two processes count, and exit
        subprocess.run([sys.executable, "-c", COUNT_IN_A_PROCESS], env=env, check=True, timeout=60)
    scraped = subprocess.run(
        [sys.executable, "-c", SCRAPE_IN_A_PROCESS], env=env, check=True, timeout=60, capture_output=True, text=True
    ).stdout
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
    }
    assert values[("sectr_journal_envelopes_total", ())] == 7 + 7 + 5
    assert values[("sectr_websocket_clients", (("consumer", "chat"),))] == 4


def test_a_run_that_keeps_streaming_is_recovered_however_often_its_workers_die(make_session: Any, owner: Any) -> None:
    """max_attempts stops a poison run (lost again with nothing journaled), not one whose
    workers keep dying while it makes progress (bench/chaos.py)."""
    from sessions_app.journal import get_journal
    from sessions_app.models import Run

    session = make_session()
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    claim = runs.claim_next_run("w-1", 30.0)
    assert claim is not None
    Run.objects.filter(pk=posted.pk).update(attempts=3)  # lost often already
    message = {"message_id": "msg_1", "role": "assistant"}
    get_journal().append_sync(
        session.pk,
        [
            NewEvent(EventType.MESSAGE_START, message, claim.invocation_id),
            NewEvent(EventType.MESSAGE_DELTA, {"message_id": "msg_1", "text": "tick 1 "}, claim.invocation_id),
        ],
        fence=claim.fence,
    )
    Run.objects.filter(pk=posted.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    again = runs.claim_next_run("w-2", 30.0)
    assert again is not None and again.recovered  # it had moved on: recovered, not failed
    # Lost once more, this time with nothing journaled since its claim: it fails.
    Run.objects.filter(pk=posted.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert runs.claim_next_run("w-3", 30.0) is None
    failed = Run.objects.get(pk=posted.pk)
    assert (failed.status, failed.attempts) == (Run.FAILED, 4)
