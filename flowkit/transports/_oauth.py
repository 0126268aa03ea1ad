"""OAUTHBEARER tokens for the Kafka clients, whichever client asks: what a user's token
provider may return, and the OIDC client-credentials grant for the aiokafka client
(librdkafka has its own, ``sasl.oauthbearer.method=oidc``).

A token provider is a plain function of no arguments that returns the token, or the token
and when it expires (Unix seconds); the clients call it in a thread of their own when they
connect or the token is due for refreshing. Without an expiry, a JWT's ``exp`` claim is
used, else the token is asked for again after ``UNKNOWN_LIFETIME`` seconds.

>>> unsecured = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzaG9wIiwiZXhwIjoxODAwMDAwMDAwfQ."
>>> token_and_expiry(unsecured, now=0.0)[1]
1800000000.0
>>> token_and_expiry(("opaque", 1700000000), now=0.0)
('opaque', 1700000000.0)
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import quote, urlencode

from ..errors import ConfigurationError
from ..redaction import redact_url

__all__ = ["UNKNOWN_LIFETIME", "ClientCredentials", "TokenProvider", "token_and_expiry"]

TokenProvider = Callable[[], "str | tuple[str, float]"]
"""A function that returns an OAUTHBEARER token, or the token and its expiry."""

UNKNOWN_LIFETIME = 300.0  # seconds a token without a known expiry is kept
_REFRESH_AT = 0.8  # of a token's lifetime: a fetched token is fetched again after this


def _jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (signed or not: it is read, not verified), else None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def token_and_expiry(result: object, now: float) -> tuple[str, float]:
    """A token provider's answer as (token, expiry in Unix seconds); anything but a
    non-empty string or a (string, number) pair is a ``ConfigurationError``."""
    if isinstance(result, tuple) and len(result) == 2:
        token, expiry = result
        if isinstance(token, str) and token and type(expiry) in (int, float):
            return token, float(expiry)
    elif isinstance(result, str) and result:
        expiry = _jwt_expiry(result)
        return result, now + UNKNOWN_LIFETIME if expiry is None else expiry
    raise ConfigurationError(
        f"sasl_oauth_token_provider returned {type(result).__name__}: expected a token"
        " (a non-empty str) or (token, expiry in Unix seconds)"
    )


class ClientCredentials:
    """The OIDC client-credentials grant (RFC 6749, 4.4): a token from ``url`` for the
    client ``client_id``/``client_secret`` (sent as HTTP Basic authentication), with
    ``scope`` if given. A token is kept until 80% of its lifetime has passed. Callable from
    any thread: it is a token provider.

    A refusal by the endpoint, or an endpoint that cannot be reached or answers without a
    token, raises ``ConfigurationError`` with the reason in one line (never the secret).
    """

    def __init__(
        self,
        url: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        *,
        timeout: float = 10.0,
    ) -> None:
        self.url, self.client_id, self.scope, self.timeout = url, client_id, scope, timeout
        # RFC 6749 2.3.1: the id and secret are form-encoded before they are joined.
        basic = f"{quote(client_id, safe='')}:{quote(client_secret, safe='')}".encode()
        self._authorization = "Basic " + base64.b64encode(basic).decode()
        self._lock = threading.Lock()
        self._token: tuple[str, float] | None = None
        self._refresh_at = 0.0

    def __repr__(self) -> str:
        return f"<ClientCredentials {redact_url(self.url)!r} client_id={self.client_id!r}>"

    def __call__(self) -> tuple[str, float]:
        with self._lock:  # one fetch at a time: every client connecting asks at once
            now = time.time()
            if self._token is None or now >= self._refresh_at:
                token, expiry = self._fetch(now)
                self._token = token, expiry
                self._refresh_at = now + max(expiry - now, 0.0) * _REFRESH_AT
            return self._token

    def _fail(self, reason: str) -> ConfigurationError:
        return ConfigurationError(
            f"no OAUTHBEARER token from {redact_url(self.url)} for client"
            f" {self.client_id!r}: {reason}; check the sasl_oauth_* settings"
        )

    def _fetch(self, now: float) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        request = urllib.request.Request(
            self.url,
            data=urlencode(form).encode(),
            headers={
                "Authorization": self._authorization,
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise self._fail(f"HTTP {exc.code} {_oauth_error(exc)}".rstrip()) from None
        except urllib.error.URLError as exc:
            raise self._fail(f"cannot reach it ({exc.reason})") from None
        except (OSError, ValueError) as exc:
            raise self._fail(f"{type(exc).__name__}: {exc}") from None
        token = answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise self._fail("the answer has no access_token")
        lifetime = answer.get("expires_in")
        if type(lifetime) in (int, float) and lifetime > 0:
            return token, now + float(lifetime)
        return token_and_expiry(token, now)


def _oauth_error(exc: urllib.error.HTTPError) -> str:
    """The ``error`` and ``error_description`` of an OAuth error answer, if it has them."""
    try:
        body = json.loads(exc.read(4096))
    except (OSError, ValueError):
        return ""
    if not isinstance(body, dict):
        return ""
    return ": ".join(str(body[key]) for key in ("error", "error_description") if key in body)
