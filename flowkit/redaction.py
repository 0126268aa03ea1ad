"""Secrets kept out of what flowkit prints: the one place that knows which client settings
are secret and how a broker URL or a settings mapping looks with their values masked.

Every error, ``repr`` and log line that shows a broker URL or client settings passes them
through ``redact_url`` or ``redact_settings`` first. A setting is secret when its name says
so: it ends in ``password``, ``secret``, ``token`` or ``user_info`` (a schema registry's
``user:password``), or is the token provider, whichever client's spelling it has
(``sasl_plain_password``, ``ssl.key.password``, ``sasl.oauthbearer.client.secret``,
``basic.auth.user.info``).

>>> redact_url("kafka://k1:9094?sasl_plain_username=shop&sasl_plain_password=hunter2")
'kafka://k1:9094?sasl_plain_username=shop&sasl_plain_password=***'
>>> redact_settings({"sasl_plain_username": "shop", "ssl_key_password": "hunter2"})
{'sasl_plain_username': 'shop', 'ssl_key_password': '***'}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

__all__ = ["MASK", "is_secret", "redact_settings", "redact_url"]

MASK = "***"
"""What a secret value is shown as."""

_SECRET_NAME = re.compile(r"(password|secret|token|token_provider|user_info)$")


def is_secret(name: str) -> bool:
    """Whether the client setting ``name`` (flowkit's or librdkafka's spelling) holds a
    secret.

    >>> [is_secret(n) for n in ("sasl_plain_password", "sasl.oauthbearer.client.secret",
    ...     "sasl_oauth_token_endpoint_url", "sasl_plain_username", "basic.auth.user.info")]
    [True, True, False, False, True]
    """
    return bool(_SECRET_NAME.search(name.lower().replace(".", "_").replace("-", "_")))


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with the value of every secret setting replaced by ``MASK``."""
    return {name: MASK if is_secret(name) else value for name, value in settings.items()}


def redact_url(url: object) -> str:
    """``url`` with its user part and the values of its secret query
    settings replaced by ``MASK`` (the whole user part: a user name alone may be a token);
    the rest stays, so the URL still says where it points.

    Works on any text, malformed URLs included (it never raises): it is what error
    messages about a bad URL show.

    >>> redact_url("kafka://shop:hunter2@k1:9092,k2:9092")
    'kafka://***@k1:9092,k2:9092'
    >>> redact_url("kafka://k1:x?sasl%5Fplain%5Fpassword=hunter2&linger_ms=5")
    'kafka://k1:x?sasl%5Fplain%5Fpassword=***&linger_ms=5'
    """
    text = url if isinstance(url, str) else repr(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        # The whole user part: a user name alone may be a token.
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    path, question, query = tail.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        pairs = []
        for pair in query.split("&"):
            name, equals, _ = pair.partition("=")
            pairs.append(f"{name}={MASK}" if equals and is_secret(unquote_plus(name)) else pair)
        tail = f"{path}?{'&'.join(pairs)}{hash_}{fragment}"
    return f"{scheme}{sep}{authority}{tail}"
