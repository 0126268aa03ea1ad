"""An app that declares its Kafka security settings, half of them: SASL without its
credentials. Every command that talks to its broker must refuse it, before connecting."""

import flowkit

app = flowkit.App(
    "secured",
    broker="kafka://127.0.0.1:9?connect_timeout=1",
    client_settings={"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"},
)
orders = app.topic("orders", value_type=int, partitions=4)
seen = app.table("seen", default=int)
