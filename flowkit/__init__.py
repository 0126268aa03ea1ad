"""flowkit: stream processing for Python.

>>> import flowkit
>>> app = flowkit.App("hello")
>>> greetings = app.topic("greetings", value_type=str)
"""

from __future__ import annotations

from .agents import Agent, Output
from .aggregations import (
    Aggregation,
    Collect,
    Count,
    DistinctCount,
    Last,
    Max,
    Mean,
    Min,
    Sum,
)
from .app import App
from .clock import Clock, SystemClock
from .codecs import Codec, CodecFormat, JsonCodec, MsgpackCodec, RawCodec, StrCodec
from .deadletter import DeadLetter
from .errors import (
    AgentError,
    AppNotFound,
    BrokerUnavailable,
    CommitFailed,
    ConfigurationError,
    DecodeError,
    DefinitionError,
    FlowkitError,
    FutureRecord,
    GraphError,
    LateRecord,
    MissingFieldError,
    NotRunningError,
    PartialWrite,
    ProcessingError,
    ReadStalled,
    RecordRejected,
    RegistryError,
    SinkError,
    TaskFailed,
    TooManyFailures,
    TransactionAborted,
    TransportError,
    WorkerStalled,
)
from .graph import Graph
from .policies import ErrorPolicy, FailureGuard, Retry
from .records import Event, Message, Record, TopicPartition
from .routing import Field, Filter, Transform, all_of, any_of, field
from .runtime import Worker
from .schemas import Avro, JsonSchema, SchemaRegistry
from .sinks import CallableSink, Sink
from .state import (
    GlobalTable,
    Joined,
    SessionTable,
    SlidingTable,
    StreamJoin,
    Table,
    WindowedTable,
    WindowSet,
)
from .streams import Stream
from .topics import Repartition, Topic
from .windows import (
    HoppingWindow,
    SessionSpec,
    SessionWindow,
    SlidingSpec,
    SlidingWindow,
    TumblingWindow,
    Window,
    WindowResult,
    WindowSpec,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentError",
    "Aggregation",
    "App",
    "AppNotFound",
    "Avro",
    "BrokerUnavailable",
    "CallableSink",
    "Clock",
    "Codec",
    "CodecFormat",
    "Collect",
    "CommitFailed",
    "ConfigurationError",
    "Count",
    "DeadLetter",
    "DecodeError",
    "DefinitionError",
    "DistinctCount",
    "ErrorPolicy",
    "Event",
    "FailureGuard",
    "Field",
    "Filter",
    "FlowkitError",
    "FutureRecord",
    "GlobalTable",
    "Graph",
    "GraphError",
    "HoppingWindow",
    "Joined",
    "JsonCodec",
    "JsonSchema",
    "Last",
    "LateRecord",
    "Max",
    "Mean",
    "Message",
    "Min",
    "MissingFieldError",
    "MsgpackCodec",
    "NotRunningError",
    "Output",
    "PartialWrite",
    "ProcessingError",
    "RawCodec",
    "ReadStalled",
    "Record",
    "RecordRejected",
    "RegistryError",
    "Repartition",
    "Retry",
    "SchemaRegistry",
    "SessionSpec",
    "SessionTable",
    "SessionWindow",
    "Sink",
    "SinkError",
    "SlidingSpec",
    "SlidingTable",
    "SlidingWindow",
    "StrCodec",
    "Stream",
    "StreamJoin",
    "Sum",
    "SystemClock",
    "Table",
    "TaskFailed",
    "TooManyFailures",
    "Topic",
    "TopicPartition",
    "TransactionAborted",
    "Transform",
    "TransportError",
    "TumblingWindow",
    "Window",
    "WindowResult",
    "WindowSet",
    "WindowSpec",
    "WindowedTable",
    "Worker",
    "WorkerStalled",
    "all_of",
    "any_of",
    "field",
    "__version__",
]
