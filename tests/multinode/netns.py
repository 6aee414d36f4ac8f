"""Two "machines" on one host: two Linux network namespaces joined by a veth pair.

Each namespace has its own loopback, one end of the veth pair with a private test
address (``10.231.0.1/24`` and ``10.231.0.2/24``: they exist only inside these
namespaces), and its own ``/etc/hosts`` (``/etc/netns/<ns>/hosts``, which ``ip netns
exec`` mounts over ``/etc/hosts``) that resolves the shared hostname to that node's
address, as a real machine's does. Names carry the creating process's pid, so a
namespace left by a killed run never blocks the next one; ``sweep_stale`` removes
those whose creator is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "lifecycle-mn-"
"""Every namespace this module makes is named ``lifecycle-mn-<pid>-<n>-<node>``."""
SUBNET = "10.231.0"
NETNS_ETC = Path("/etc/netns")
_IP_TIMEOUT_S = 10.0
_counter = iter(range(1_000_000))


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, or the kernel refused); says why."""


@dataclass(frozen=True, slots=True)
class Node:
    """One namespace: its name, its end of the veth pair, and that end's address."""

    index: int
    netns: str
    ifname: str
    addr: str

    def exec(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this node's namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.netns, *command]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (bounded); raise ``NetnsUnavailable`` with its stderr if ``check`` and it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why two namespaces cannot be made here, or None if they can (checked by making and removing one)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
    except (NetnsUnavailable, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace: {exc}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


def ours() -> list[str]:
    """Names of the namespaces this module's naming scheme covers that exist now."""
    done = ip("netns", "list", check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [name for name in names if name.startswith(PREFIX)]


def sweep_stale() -> list[str]:
    """Remove namespaces (and hosts files) left by runs whose process is gone; return their names."""
    removed = []
    for name in ours():
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove(name)
            removed.append(name)
    return removed


def _remove(netns: str) -> None:
    """Delete ``netns`` (its veth end goes with it, and with it the peer) and its ``/etc/netns`` folder."""
    ip("netns", "del", netns, check=False)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
    with contextlib.suppress(OSError):
        NETNS_ETC.rmdir()  # only if empty: another namespace's files stay


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple[Node, Node]]:
    """Make two namespaces joined by a veth pair, up and addressed; remove both on exit (Ctrl-C included)."""
    run = f"{os.getpid()}-{next(_counter)}"
    tag = f"{os.getpid():x}{next(_counter) % 36:x}"  # interface names: at most 15 characters
    nodes = tuple(
        Node(index=i, netns=f"{PREFIX}{run}-{i}", ifname=f"lmn{tag}n{i}", addr=f"{SUBNET}.{i + 1}") for i in (0, 1)
    )
    hostname = socket.gethostname()
    try:
        for node in nodes:
            # A name with this pid that exists already was left by an earlier process with the same pid.
            _remove(node.netns)
            ip("link", "del", node.ifname, check=False)
            ip("netns", "add", node.netns)
        ip("link", "add", nodes[0].ifname, "type", "veth", "peer", "name", nodes[1].ifname)
        for node in nodes:
            ip("link", "set", node.ifname, "netns", node.netns)
            ip("-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", node.ifname)
            ip("-n", node.netns, "link", "set", "lo", "up")
            ip("-n", node.netns, "link", "set", node.ifname, "up")
            etc = NETNS_ETC / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{node.addr} {hostname}\n")
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            _remove(node.netns)


def set_link(node: Node, up: bool) -> None:
    """Take ``node``'s end of the veth pair down (a partition: the peer loses its carrier too) or up."""
    ip("-n", node.netns, "link", "set", node.ifname, "up" if up else "down")
