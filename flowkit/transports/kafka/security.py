"""What aiokafka needs for a secured connection, made from flowkit's settings: the TLS
context (with the password of an encrypted client key) and the OAUTHBEARER token provider
(the user's function, or the OIDC client-credentials grant).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aiokafka.errors as kerr
from aiokafka.abc import AbstractTokenProvider

from ...errors import ConfigurationError
from .._kafka_common import tls_context
from .._oauth import ClientCredentials, TokenProvider, token_and_expiry

__all__ = ["KafkaTokenProvider", "security_options"]


class KafkaTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # (untyped)
    """aiokafka's token provider over a flowkit one (a plain function, called in a thread
    so that fetching a token never blocks the event loop)."""

    def __init__(self, source: TokenProvider) -> None:
        self.source = source
        self._had_one = False

    async def token(self) -> str:
        try:
            result = await asyncio.to_thread(self.source)
            token = token_and_expiry(result, time.time())[0]
        except ConfigurationError as exc:
            if not self._had_one:
                raise  # at the start: the worker stops with this one line
            # Later (a reconnect), a token endpoint that fails may heal: aiokafka retries
            # the connection as it retries a lost broker, and the broker watch times it.
            raise kerr.KafkaConnectionError(str(exc)) from None
        self._had_one = True
        return token


def security_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The aiokafka client options for checked flowkit ``settings``: ``ssl_context`` for
    an SSL protocol, ``sasl_oauth_token_provider`` for OAUTHBEARER."""
    options: dict[str, Any] = {}
    if "SSL" in settings.get("security_protocol", ""):
        options["ssl_context"] = tls_context(settings)
    if settings.get("sasl_mechanism") == "OAUTHBEARER":
        source = settings.get("sasl_oauth_token_provider") or ClientCredentials(
            settings["sasl_oauth_token_endpoint_url"],
            settings["sasl_oauth_client_id"],
            settings["sasl_oauth_client_secret"],
            settings.get("sasl_oauth_scope"),
        )
        options["sasl_oauth_token_provider"] = KafkaTokenProvider(source)
    return options
