"""A Schema Registry: where a topic's schema lives, shared with services in other languages.

``SchemaRegistry`` is a declaration like the app: building it does no I/O and imports no
client. The registry client (``confluent_kafka.schema_registry``, from the extra
``flowkit[registry]``) is made when a worker first needs it, from the URL given here or,
when none is given, from ``FLOWKIT_SCHEMA_REGISTRY``. Its lookups block: they run at worker
start (the compatibility check) and once per schema id a reader has not seen before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl

from ..errors import ConfigurationError, RegistryError
from ..redaction import redact_settings, redact_url

__all__ = ["URL_VAR", "RegisteredSchema", "SchemaRegistry"]

URL_VAR = "FLOWKIT_SCHEMA_REGISTRY"
"""The environment variable a ``SchemaRegistry()`` without a URL reads (at first use)."""

_NOT_FOUND = 404


class RegisteredSchema:
    """One version of a subject: its schema id, version number, type and text."""

    __slots__ = ("schema_id", "schema_type", "text", "version")

    def __init__(self, schema_id: int, version: int, schema_type: str, text: str) -> None:
        self.schema_id = schema_id
        self.version = version
        self.schema_type = schema_type
        self.text = text

    def __repr__(self) -> str:
        return f"<RegisteredSchema id={self.schema_id} version={self.version} {self.schema_type}>"


class SchemaRegistry:
    """A Schema Registry that speaks Confluent's REST API (Confluent's own, Karapace, ...).

    ``url`` is the registry's address (``https://user:password@registry:8081``, several
    separated by commas, or ``mock://name`` for the client's in-process registry); without
    it, ``$FLOWKIT_SCHEMA_REGISTRY`` is read when the registry is first used. ``settings``
    are the registry client's own (``basic.auth.user.info``, ``bearer.auth.token``,
    ``ssl.ca.location``, ``timeout``, ``max.retries``, ...), given here or as the URL's
    query (``https://registry:8081?timeout=5``), as a ``kafka://`` URL takes client
    settings; secrets in them and in the URL never show in a ``repr``, a log line or an
    error.

    >>> SchemaRegistry("https://shop:hunter2@registry:8081")
    <SchemaRegistry 'https://***@registry:8081'>
    >>> SchemaRegistry("mock://x", settings={"basic.auth.user.info": "shop:hunter2"}).settings
    {'basic.auth.user.info': '***'}
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Mapping[str, Any] | None = None,
        client: Any = None,
    ) -> None:
        if url is not None and not isinstance(url, str):
            raise ConfigurationError(f"SchemaRegistry(): url must be text, not {url!r}")
        if settings is not None and not isinstance(settings, Mapping):
            raise ConfigurationError("SchemaRegistry(): settings must be a dict")
        self.url = url
        self._settings = dict(settings or {})
        self._client = client
        self._lock = threading.Lock()
        self._by_id: dict[int, RegisteredSchema | None] = {}

    def __repr__(self) -> str:
        return f"<SchemaRegistry {redact_url(self.url or '$' + URL_VAR)!r}>"

    @property
    def settings(self) -> dict[str, Any]:
        """The client settings as they may be shown: secrets masked."""
        return redact_settings(self._settings)

    @property
    def client(self) -> Any:
        """The registry client (``confluent_kafka.schema_registry.SchemaRegistryClient``),
        made at first use: share it with Confluent's own serialisers where both run."""
        with self._lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> Any:
        url = self.url or os.environ.get(URL_VAR, "")
        if not url:
            raise ConfigurationError(
                f"no schema registry URL: pass SchemaRegistry(url) or set {URL_VAR}"
            )
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError:
            raise ConfigurationError(
                "the schema registry needs the extra flowkit[registry] "
                "(pip install 'flowkit[registry]')"
            ) from None
        url, query = _split(url)
        try:
            return SchemaRegistryClient.new_client({**query, **self._settings, "url": url})
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"schema registry {redact_url(url)}: {_redacted(str(exc), self._settings)}"
            ) from None

    # -- lookups (blocking) -----------------------------------------------------------------

    def schema(self, schema_id: int) -> RegisteredSchema | None:
        """The schema with this id, or None when the registry has none (cached for good:
        an id never changes its schema)."""
        if schema_id in self._by_id:
            return self._by_id[schema_id]
        with self._errors(f"schema id {schema_id}"):
            try:
                found = self.client.get_schema(schema_id)
            except Exception as exc:
                if getattr(exc, "http_status_code", None) != _NOT_FOUND:
                    raise
                found = None
        schema = None
        if found is not None:
            schema = RegisteredSchema(schema_id, 0, found.schema_type or "AVRO", found.schema_str)
        self._by_id[schema_id] = schema
        return schema

    def versions(self, subject: str) -> list[RegisteredSchema]:
        """Every version of ``subject``, oldest first; empty when the subject does not exist."""
        with self._errors(f"subject {subject!r}"):
            try:
                numbers = self.client.get_versions(subject)
            except Exception as exc:
                if getattr(exc, "http_status_code", None) == _NOT_FOUND:
                    return []
                raise
            found = []
            for number in sorted(numbers):
                got = self.client.get_version(subject, number)
                found.append(
                    RegisteredSchema(
                        got.schema_id,
                        got.version,
                        got.schema.schema_type or "AVRO",
                        got.schema.schema_str,
                    )
                )
            return found

    def compatibility(self, subject: str) -> str:
        """The subject's compatibility rule (``BACKWARD``, ``FULL_TRANSITIVE``, ...): its own,
        else the registry's, else ``BACKWARD``, every registry's default."""
        with self._errors(f"subject {subject!r}"):
            for name in (subject, None):
                try:
                    config = self.client.get_config(name)
                except Exception as exc:
                    if getattr(exc, "http_status_code", None) == _NOT_FOUND:
                        continue
                    raise
                level = config and (config.compatibility_level or config.compatibility)
                if level is not None:
                    return str(getattr(level, "value", level))
        return "BACKWARD"

    def register(self, subject: str, schema_type: str, text: str) -> int:
        """The id of ``text`` under ``subject``, registering it as a new version if needed."""
        from confluent_kafka.schema_registry import Schema

        with self._errors(f"subject {subject!r}"):
            schema_id: int = self.client.register_schema(subject, Schema(text, schema_type))
        return schema_id

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """The client's errors as one ``RegistryError`` line, secrets masked."""
        try:
            yield
        except (RegistryError, ConfigurationError):
            raise
        except Exception as exc:
            url = redact_url(self.url or os.environ.get(URL_VAR, ""))
            text = _redacted(str(exc) or type(exc).__name__, self._settings)
            raise RegistryError(f"schema registry {url}: {what}: {text}") from None


def _split(url: str) -> tuple[str, dict[str, Any]]:
    """The URL without its query, and the query's settings (numbers as numbers).

    >>> _split("http://r:8081?max.retries=0&timeout=2.5&basic.auth.user.info=a%3Ab")
    ('http://r:8081', {'max.retries': 0, 'timeout': 2.5, 'basic.auth.user.info': 'a:b'})
    """
    base, _, query = url.partition("?")
    settings: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        for kind in (int, float):
            try:
                settings[name] = kind(value)
                break
            except ValueError:
                continue
        else:
            settings[name] = value
    return base, settings


def _redacted(text: str, settings: Mapping[str, Any]) -> str:
    """``text`` without the secret values of ``settings`` (a client error may quote them)."""
    for name, value in settings.items():
        if isinstance(value, str) and value and redact_settings({name: value})[name] != value:
            text = text.replace(value, "***")
    return text
