"""The Prometheus metrics of ``pulse up`` (``GET /metrics``), kept and written out by
``prometheus_client``: requests by route, method and status, their latency by route, and
how far this host's state is behind the stream it reads.

Each app has a registry of its own (two services in one process, as in tests, do not
share counts). The names are those the service has always exposed:
``pulse_http_requests_total``, ``pulse_http_request_duration_seconds``,
``pulse_events_applied_total``, ``pulse_applied_sequence``, and, while the stream answers,
``pulse_stream_sequence`` and ``pulse_replication_lag_events``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sync.instance import PulseDB

# the text exposition format 0.0.4, which every Prometheus reads
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Replication(Collector):
    """The replication figures of an instance, read when Prometheus scrapes. The stream's
    last sequence needs a round trip to NATS, so the scrape asks first and passes it in
    (``Metrics.render``); None leaves the stream's two gauges out."""

    def __init__(self, db: PulseDB) -> None:
        self.db = db
        self.stream_seq: int | None = None

    def collect(self) -> Iterator[Metric]:
        applied = CounterMetricFamily(
            "pulse_events_applied", "Events applied by the replication loop."
        )
        applied.add_metric([], self.db.events_applied)
        yield applied
        yield GaugeMetricFamily(
            "pulse_applied_sequence",
            "Last stream sequence applied to the local state.",
            value=self.db.applied_seq,
        )
        if self.stream_seq is not None:
            yield GaugeMetricFamily(
                "pulse_stream_sequence",
                "Last sequence of what this host reads.",
                value=self.stream_seq,
            )
            yield GaugeMetricFamily(
                "pulse_replication_lag_events",
                "Stream events not yet applied here.",
                value=max(0, self.stream_seq - self.db.applied_seq),
            )


class Metrics:
    """The metrics of one app over ``db``."""

    def __init__(self, db: PulseDB) -> None:
        # no `*_created` series beside the counter and the histogram: the names stay those
        # listed above (a process-wide switch of prometheus_client; Pulse has no other use)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "pulse_http_requests",
            "HTTP requests by route, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "pulse_http_request_duration_seconds",
            "HTTP request latency by route.",
            ("route",),
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.replication = Replication(db)
        self.registry.register(self.replication)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self, stream_seq: int | None) -> bytes:
        """The text exposition of every metric; ``stream_seq`` is the stream's last
        sequence (None: the stream did not answer). One synchronous call, so concurrent
        scrapes on the event loop cannot mix their ``stream_seq``."""
        self.replication.stream_seq = stream_seq
        return generate_latest(self.registry)
