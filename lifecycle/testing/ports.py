"""Free TCP ports for a test's rendezvous: picked below the ephemeral range, checked by binding.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, which is
also where every outgoing connection takes its local port: between the check and the
store's own ``bind``, a rank's connection elsewhere could take it. Ports are therefore
drawn at random from below that range (from the operating system's random source, so
processes that share a seeded ``random`` do not draw the same ones).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from lifecycle._core.errors import check_number

_LOWEST = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DRAWS = 500
_random = random.SystemRandom()


def _first_ephemeral_port() -> int:
    """The lowest port of the kernel's ephemeral range (32768, the Linux default, where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_ports(n: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """Return ``n`` consecutive TCP ports ``(P, P + 1, …)`` on ``host`` that were all free a moment ago.

    Each port was bound (and released) by this call; none is in the kernel's ephemeral
    range unless that range leaves fewer than 1000 ports below it, in which case the
    kernel picks ``P`` (``n`` must then be 1). Consecutive ports suit launchers that
    derive ports from one base (NVRx's Wrapper store sits at ``MASTER_PORT + 1``).
    Raises ``RuntimeError`` when no such run of ports is found.
    """
    check_number("n", n, at_least=1)
    top = _first_ephemeral_port() - n
    if top - _LOWEST < 1000:
        if n != 1:
            raise RuntimeError(f"the ephemeral range starts at {top + n}: no room for {n} consecutive ports below it")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return (int(sock.getsockname()[1]),)
    for _ in range(_DRAWS):
        base = _random.randrange(_LOWEST, top)
        if all(_bindable(host, port) for port in range(base, base + n)):
            return tuple(range(base, base + n))
    raise RuntimeError(f"no {n} consecutive free ports on {host} after {_DRAWS} draws")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (see ``free_ports``)."""
    return free_ports(1, host)[0]
