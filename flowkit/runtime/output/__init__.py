"""An agent's outputs on their way to the broker: its emitter, the sinks it names,
the publisher every send goes through, and the latency of acknowledged outputs.
"""
