"""Prometheus metrics on a per-worker registry.

The worker resolves labelled children once (per topic, per agent) and updates them once per
batch, never through a per-record label lookup. Under ``--processes N`` the workers keep
them in prometheus-client's multiprocess files; a gauge's ``multiprocess_mode`` says how
the parent combines the processes' values (``livesum``: the sum over running processes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

# A record's way through a worker: from a millisecond (the memory broker) to minutes (a
# worker far behind its input).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)  # fmt: skip


class Metrics:
    """The worker's metrics; ``registry`` can be served over HTTP or read in tests."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.records_in = Counter(
            "flowkit_records_in", "Records fetched from the broker", ["topic"], registry=r
        )
        self.records_processed = Counter(
            "flowkit_records_processed", "Records an agent moved past", ["agent"], registry=r
        )
        self.outputs = Counter("flowkit_outputs", "Outputs sent to sinks", ["agent"], registry=r)
        self.dead_letters = Counter(
            "flowkit_dead_letters", "Records sent to the dead-letter topic", ["stage"], registry=r
        )
        self.dead_letters_lost = Counter(
            "flowkit_dead_letters_lost",
            "Failed records whose dead letter the broker refused (logged, then skipped)",
            ["stage"],
            registry=r,
        )
        self.errors = Counter(
            "flowkit_errors",
            "Records that failed, by agent and stage",
            ["agent", "stage"],
            registry=r,
        )
        self.retries = Counter(
            "flowkit_retries", "Records processed again after an error", ["agent"], registry=r
        )
        self.skipped = Counter(
            "flowkit_skipped",
            "Failed records skipped by an error policy",
            ["agent"],
            registry=r,
        )
        self.guard_trips = Counter(
            "flowkit_failure_guard_trips",
            "Times an agent failed on too many records (its FailureGuard), by what followed: "
            "stop (the worker) or pause (the agent instance)",
            ["agent", "action"],
            registry=r,
        )
        self.commits = Counter("flowkit_commits", "Offset commits", registry=r)
        self.commit_seconds = Histogram(
            "flowkit_commit_seconds",
            "Time to flush and commit",
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        self.queue_depth = Gauge(
            "flowkit_queue_depth",
            "Batches waiting for an agent instance",
            ["agent"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.assigned_partitions = Gauge(
            "flowkit_assigned_partitions",
            "Partitions this worker owns",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.rebalances = Counter(
            "flowkit_rebalances",
            "Partition assignments and revocations this worker went through",
            ["kind"],
            registry=r,
        )
        self.rebalance_seconds = Histogram(
            "flowkit_rebalance_seconds",
            "Time to handle an assignment (recovery included) or a revocation (drain and commit)",
            ["kind"],
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.e2e_latency = Histogram(
            "flowkit_e2e_latency_seconds",
            "Record timestamp to the agent's outputs acknowledged by the broker (sampled "
            "batches: the oldest record of each)",
            ["agent"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.committed_latency = Histogram(
            "flowkit_committed_latency_seconds",
            "Record timestamp to its offset committed, after its outputs and table changes "
            "are acknowledged (one observation per batch: the oldest record of the batch)",
            ["agent"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.batch_seconds = Histogram(
            "flowkit_batch_seconds",
            "From a batch's fetch to its agent being done with it (queue wait included)",
            ["agent"],
            registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        self.window_rejected = Counter(
            "flowkit_window_rejected_records",
            "Records a windowed table refused: late (window closed) or future (too far ahead)",
            ["agent", "reason"],
            registry=r,
        )
