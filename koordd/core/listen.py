"""The address the metrics endpoint listens on: "host:port", checked when the config loads.

Only IP literals and "localhost" are taken: a name resolved at bind time could turn out to be a
public address after the config was checked.
"""
from __future__ import annotations

import ipaddress


def parse_listen(text: str) -> tuple[str, int]:
    """"127.0.0.1:9316" -> ("127.0.0.1", 9316); "[::1]:9316" -> ("::1", 9316); "localhost" is 127.0.0.1.
    ValueError saying what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f'expected "address:port" (e.g. "127.0.0.1:9316", "[::1]:9316"), got {text!r}')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f'an IPv6 address goes in brackets ("[::1]:9316"), got {text!r}')
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address (or localhost)") from None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"port must be 1..65535, got {port!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback
