"""What a web endpoint is given, without the web stack: its token (``WebToken``) and its
limits (``WebLimits``).

The command line and the worker take these before anything is served; aiohttp is imported
only by a worker that serves (``web``, ``web.access``, ``web.limits``).
"""

from __future__ import annotations

import hashlib
import hmac
import resource
from dataclasses import dataclass

from ...errors import ConfigurationError

__all__ = ["TOKEN_VAR", "WebLimits", "WebToken"]

TOKEN_VAR = "FLOWKIT_WEB_TOKEN"


class WebToken:
    """A bearer token, kept as its SHA-256 digest beside the text (for the children of
    a process group); its repr and str never show it.

    >>> token = WebToken("s3cret-s3cret")
    >>> token, str(token), token.matches("Bearer s3cret-s3cret"), token.matches("Bearer x")
    (WebToken(***), '***', True, False)
    >>> WebToken("two words")
    Traceback (most recent call last):
    ...
    flowkit.errors.ConfigurationError: the web token must be printable ASCII without spaces
    """

    __slots__ = ("_digest", "_text")

    def __init__(self, text: str) -> None:
        if not text or not text.isascii() or not text.isprintable() or " " in text:
            # (the message never quotes the value: it is a secret)
            raise ConfigurationError("the web token must be printable ASCII without spaces")
        self._text = text
        self._digest = hashlib.sha256(text.encode()).digest()

    def reveal(self) -> str:
        """The token's text, to hand to a child process or put in a request header."""
        return self._text

    def header(self) -> dict[str, str]:
        """The request header that carries it."""
        return {"Authorization": f"Bearer {self._text}"}

    def matches(self, authorization: str | None) -> bool:
        """True if an ``Authorization`` header value carries this token. Digests of equal
        length are compared in constant time, so neither the token's length nor how much
        of it a guess got right shows in the time."""
        if authorization is None:
            return False
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(given.strip().encode("utf-8", "replace")).digest()
        return hmac.compare_digest(digest, self._digest)

    def __repr__(self) -> str:
        return "WebToken(***)"

    def __str__(self) -> str:
        return "***"

    def __reduce__(self) -> tuple[object, ...]:  # no pickling a secret into a file
        raise TypeError("a WebToken is not pickled")


@dataclass(frozen=True)
class WebLimits:
    """How much of the worker a web endpoint may take (see the module's docstring).

    >>> WebLimits(max_connections=0)
    Traceback (most recent call last):
    ...
    flowkit.errors.ConfigurationError: web limits: max_connections must be at least 1, not 0
    """

    max_connections: int = 64
    header_timeout: float = 10.0
    max_body: int = 16 * 1024
    rate: float = 50.0
    burst: int = 20
    max_wait: float = 5.0
    concurrency: int = 4
    cache_seconds: float = 1.0  # how long /metrics and /status answers are reused
    # Accept and refuse connections in a gate process (``web.gate``); False: in the
    # serving process's own event loop (a group's children: only their parent asks them).
    gate: bool = True

    def __post_init__(self) -> None:
        for name in ("max_connections", "concurrency", "burst"):
            if getattr(self, name) < 1:
                raise ConfigurationError(
                    f"web limits: {name} must be at least 1, not {getattr(self, name)}"
                )
        for name in ("header_timeout", "rate", "max_wait"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ConfigurationError(f"web limits: {name} must be a positive number")
        if self.max_body < 0 or self.cache_seconds < 0:
            raise ConfigurationError("web limits: max_body and cache_seconds cannot be negative")

    def connections(self) -> int:
        """``max_connections``, but at most a quarter of the file descriptors the process
        may open: the rest are the broker's, the tables' and the answers' to overflow."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft <= 0:
            return self.max_connections
        return max(1, min(self.max_connections, soft // 4))
