"""An app on a Kafka broker nothing listens on, for commands refused before they connect."""

import flowkit

app = flowkit.App("on-kafka", broker="kafka://127.0.0.1:9?connect_timeout=1")
orders = app.topic("orders", value_type=int, partitions=4)
one = app.topic("one", value_type=int, partitions=1)
