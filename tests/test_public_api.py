"""The flat public API: ``flowkit.__all__`` is exactly the public names, sorted."""

from __future__ import annotations

import inspect

import flowkit
import flowkit.routing
import flowkit.testing
import flowkit.transports


def test_all_lists_exactly_the_public_names() -> None:
    # Submodules are reachable as attributes once imported; they are not API names.
    public = {
        name
        for name, obj in vars(flowkit).items()
        if not name.startswith("_") and not inspect.ismodule(obj) and name != "annotations"
    }
    assert set(flowkit.__all__) - {"__version__"} == public


def test_all_is_sorted_and_resolvable() -> None:
    names = [n for n in flowkit.__all__ if n != "__version__"]
    assert names == sorted(names)
    for name in flowkit.__all__:
        assert getattr(flowkit, name) is not None


def test_user_submodules_export_their_names() -> None:
    for module in (flowkit.routing, flowkit.testing, flowkit.transports):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)


def test_import_flowkit_imports_no_broker_or_registry_client() -> None:
    import subprocess
    import sys

    # An app pays for a client only when it uses one: Kafka's at a kafka:// URL, the
    # Schema Registry's (the extra flowkit[registry]) where a registry format is used.
    clients = ("aiokafka", "confluent_kafka", "fastavro", "jsonschema", "httpx2")
    code = (
        f"import sys, flowkit, flowkit.testing\nprint([m for m in {clients!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
