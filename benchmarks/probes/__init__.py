"""Probes: each measures one mechanism (raw client reads, the cost of a produce call, the CPU
of each thread, the instructions of each step of the record path), to find where the time
of a comparison goes. ``python -m benchmarks --probes`` lists them."""
