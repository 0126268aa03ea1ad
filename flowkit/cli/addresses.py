"""Checking the address ``--web-port``/``--web-host`` name before a worker starts on it.

A worker that cannot serve its web endpoint stops; checking first turns that into one line
that names the option and the address, before anything connects to a broker.
"""

from __future__ import annotations

import errno
import socket

from ..errors import ConfigurationError

__all__ = ["check_web_address"]


def check_web_address(host: str, port: int) -> None:
    """Raise ``ConfigurationError`` if ``host`` does not resolve or ``host:port`` is taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigurationError(
            f"--web-host {host!r} does not resolve ({exc.strerror}): give a name or address"
            " of this machine, such as 127.0.0.1 or 0.0.0.0"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as exc:
            option = "--web-port" if exc.errno == errno.EADDRINUSE else "--web-host"
            raise ConfigurationError(
                f"cannot serve on {host}:{port} ({exc.strerror}); check {option}"
            ) from None
