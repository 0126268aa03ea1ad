"""flowkit's benchmarks: each comparison runs flowkit and a baseline (most often the loop a
developer would write by hand) over the same data in the same run, and prints the ratio.

``python -m benchmarks`` lists them, with the first line of each module's docstring;
docs/benchmarks.md gives their figures. The other modules here are the harness they share
(paired rounds, callgrind, cachegrind, the Kafka broker) and the chart of the docs;
``benchmarks/probes/`` holds probes, which measure one mechanism each.
"""

COMPARISONS = (
    # on the memory broker
    "throughput",
    "ysb",
    "ops_overhead",
    "web_flood",
    "web_flood_split",
    "latency",
    "recovery",
    "state_stores",
    "window_keys",
    "ttl_count",
    "state_size",
    "router",
    "router_filters",
    "router_count",
    "joins",
    "formats",
    "sessions",
    "sliding",
    # on Kafka
    "ysb_kafka",
    "ysb_clients",
    "rdkafka_count",
    "router_kafka",
    "scale_out",
)
"""The comparisons a user runs, as ``python -m benchmarks.NAME``, in the order of
docs/benchmarks.md. A module that runs as a script is one of these, a probe (in
``benchmarks/probes/``) or the chart."""
