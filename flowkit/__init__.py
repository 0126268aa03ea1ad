"""flowkit: stream processing for Python.

>>> import flowkit
>>> app = flowkit.App("hello")
>>> greetings = app.topic("greetings", value_type=str)
"""

from __future__ import annotations

from .agents import Agent, Output
from .app import App
from .clock import Clock, SystemClock
from .codecs import Codec, JsonCodec, MsgpackCodec, RawCodec, StrCodec
from .errors import (
    AgentError,
    AppNotFound,
    BrokerUnavailable,
    CommitFailed,
    ConfigurationError,
    DecodeError,
    DefinitionError,
    FlowkitError,
    GraphError,
    NotRunningError,
    ProcessingError,
    SinkError,
    TransportError,
    WorkerStalled,
)
from .graph import Graph
from .records import Event, Message, Record, TopicPartition
from .runtime import Worker
from .streams import Stream
from .tables import GlobalTable, Table
from .topics import Repartition, Topic
from .windowed import FutureRecord, LateRecord, WindowedTable
from .windows import HoppingWindow, TumblingWindow, Window, WindowResult, WindowSpec

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentError",
    "App",
    "AppNotFound",
    "BrokerUnavailable",
    "Clock",
    "Codec",
    "CommitFailed",
    "ConfigurationError",
    "DecodeError",
    "DefinitionError",
    "Event",
    "FlowkitError",
    "FutureRecord",
    "GlobalTable",
    "Graph",
    "GraphError",
    "HoppingWindow",
    "JsonCodec",
    "LateRecord",
    "Message",
    "MsgpackCodec",
    "NotRunningError",
    "Output",
    "ProcessingError",
    "RawCodec",
    "Record",
    "Repartition",
    "SinkError",
    "StrCodec",
    "Stream",
    "SystemClock",
    "Table",
    "Topic",
    "TopicPartition",
    "TransportError",
    "TumblingWindow",
    "Window",
    "WindowResult",
    "WindowSpec",
    "WindowedTable",
    "Worker",
    "WorkerStalled",
    "__version__",
]
