"""The metrics /metrics computes from the database when it is scraped.

Runs by state, the run queue and the pending asks are facts of the shared database, not
of one process: read at scrape time, they are right whichever process answers and
however many there are (counted in a process, every Daphne would report its own part).
A few indexed aggregate queries per scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from sessions_app.models import AskIndex, Run


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        by_state = GaugeMetricFamily("sectr_runs", "Runs by state (Run rows).", labels=["state"])
        counts = dict(Run.objects.values_list("status").annotate(count=Count("pk")).values_list("status", "count"))
        for state, _label in Run.STATUS_CHOICES:
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state

        queued = Run.objects.filter(status=Run.QUEUED).aggregate(depth=Count("pk"), oldest=Min("created_at"))
        yield GaugeMetricFamily(
            "sectr_run_queue_depth", "Runs queued for a worker (journaled, not claimed yet).", value=queued["depth"]
        )
        yield GaugeMetricFamily(
            "sectr_run_queue_oldest_age_seconds",
            "Age of the oldest queued run (0 when none is queued).",
            value=(now - queued["oldest"]).total_seconds() if queued["oldest"] else 0.0,
        )
        expired = Run.objects.filter(status=Run.RUNNING, lease_expires_at__lt=now).count()
        yield GaugeMetricFamily(
            "sectr_runs_lease_expired", "Running runs whose lease expired (waiting to be recovered).", value=expired
        )

        # The ask index is written with the journal (sessions_app.journal.ask_index).
        asks = AskIndex.objects.filter(status=AskIndex.PENDING).aggregate(
            pending=Count("pk"), oldest=Min("requested_at")
        )
        yield GaugeMetricFamily("sectr_asks_pending", "Approval asks waiting for a decision.", value=asks["pending"])
        yield GaugeMetricFamily(
            "sectr_asks_pending_oldest_age_seconds",
            "Age of the oldest pending approval ask (0 when none is pending).",
            value=(now - asks["oldest"]).total_seconds() if asks["oldest"] else 0.0,
        )


#: Only /metrics reads this registry (the default one must not touch the database: a
#: worker's own metrics port serves it).
database_registry = CollectorRegistry(auto_describe=False)
database_registry.register(DatabaseCollector())
