"""What aiokafka needs for a secured connection, made from flowkit's settings: the TLS
context (with the password of an encrypted client key) and the OAUTHBEARER token provider
(the user's function, or the OIDC client-credentials grant).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

from ...errors import ConfigurationError
from .._oauth import ClientCredentials, TokenProvider, token_and_expiry

__all__ = ["KafkaTokenProvider", "security_options"]


class KafkaTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # (untyped)
    """aiokafka's token provider over a flowkit one (a plain function, called in a thread
    so that fetching a token never blocks the event loop)."""

    def __init__(self, source: TokenProvider) -> None:
        self.source = source

    async def token(self) -> str:
        result = await asyncio.to_thread(self.source)
        return token_and_expiry(result, time.time())[0]


def security_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The aiokafka client options for checked flowkit ``settings``: ``ssl_context`` for
    an SSL protocol, ``sasl_oauth_token_provider`` for OAUTHBEARER."""
    options: dict[str, Any] = {}
    if "SSL" in settings.get("security_protocol", ""):
        try:
            options["ssl_context"] = create_ssl_context(
                cafile=settings.get("ssl_cafile"),
                certfile=settings.get("ssl_certfile"),
                keyfile=settings.get("ssl_keyfile"),
                password=settings.get("ssl_key_password"),
            )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConfigurationError(f"Kafka ssl_* settings: {_ssl_reason(exc)}") from None
    if settings.get("sasl_mechanism") == "OAUTHBEARER":
        source = settings.get("sasl_oauth_token_provider") or ClientCredentials(
            settings["sasl_oauth_token_endpoint_url"],
            settings["sasl_oauth_client_id"],
            settings["sasl_oauth_client_secret"],
            settings.get("sasl_oauth_scope"),
        )
        options["sasl_oauth_token_provider"] = KafkaTokenProvider(source)
    return options


def _ssl_reason(exc: BaseException) -> str:
    # A wrong key password comes out of OpenSSL as "[SSL] PEM lib (_ssl.c:NNNN)".
    reason = getattr(exc, "reason", None)
    if reason in ("PEM_LIB", "BAD_DECRYPT") or "PEM lib" in str(exc):
        return "cannot load the client key: wrong ssl_key_password, or the key is not PEM"
    return str(exc)
