"""NAT'd hosts on one machine (issue 22 item 1): the local pool's `--nat` mode.

Rented GPU hosts sit behind NAT: a service binds one port and the world reaches it on another (the marketplace's port
map). Here every host's services bind their usual ports and advertise (gossip, config) PUBLIC_OFFSET above them,
and one nft table in the host's own namespace plays the NAT box on its `eth0`:

    table ip swactor_nat
      prerouting   a packet for an advertised port is DNAT'ed to the bound one
      output       the same for the host's own traffic to its own advertised address (a stage on the orchestrator's
                   host fetches from its model server over it)
      postrouting  what the UDP services (gossip, QUIC) send from their bound port leaves from the advertised one, as
                   a port-preserving NAT maps it
      input        from another host, a bound port is reachable only through the mapping: a connection to it that
                   was not DNAT'ed (or is not the reply of one this host opened) is dropped

So a service that hands out its bound port instead of its advertised one, or dials a peer's bound port, fails here
as it would behind a real NAT. The table goes with the namespace at teardown.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from swactor.localcluster.layout import CONTROL_PORT, EDGE_PORT, MEMBERSHIP_PORT, MODEL_PORT

PUBLIC_OFFSET = 10_000
TABLE = "swactor_nat"
DEVICE = "eth0"


@dataclass(frozen=True)
class Mapped:
    name: str
    protos: tuple[str, ...]
    port: int  # bound

    @property
    def public(self) -> int:
        return self.port + PUBLIC_OFFSET


# Every listening port of a host (the model server only listens on the orchestrator's host; mapped on every host
# alike, which costs nothing).
MAPPED = (Mapped("membership", ("udp", "tcp"), MEMBERSHIP_PORT), Mapped("edge", ("udp",), EDGE_PORT),
          Mapped("control", ("tcp",), CONTROL_PORT), Mapped("model", ("tcp",), MODEL_PORT))


class NatError(RuntimeError):
    """The rules could not be applied; names the host and nft's error."""


def rules(addr: str) -> str:
    """The nft script for the host at `addr`."""
    dnat = [f"{p} dport {m.public} dnat to :{m.port}" for m in MAPPED for p in m.protos]
    snat = [f'oifname "{DEVICE}" udp sport {m.port} snat to :{m.public}' for m in MAPPED if "udp" in m.protos]
    bound = {p: ", ".join(str(m.port) for m in MAPPED if p in m.protos) for p in ("udp", "tcp")}
    return "\n".join([
        f"table ip {TABLE} {{",
        "  chain prerouting {", "    type nat hook prerouting priority dstnat; policy accept;",
        *(f'    iifname "{DEVICE}" {r}' for r in dnat), "  }",
        "  chain output {", "    type nat hook output priority -100; policy accept;",
        *(f"    ip daddr {addr} {r}" for r in dnat), "  }",
        "  chain postrouting {", "    type nat hook postrouting priority srcnat; policy accept;",
        *(f"    {r}" for r in snat), "  }",
        "  chain input {", "    type filter hook input priority 0; policy accept;",
        f'    iifname "{DEVICE}" ct status dnat accept',
        f'    iifname "{DEVICE}" ct state established,related accept',
        *(f'    iifname "{DEVICE}" {p} dport {{ {ports} }} drop' for p, ports in bound.items()), "  }",
        "}", ""])


def apply(ns: str, addr: str, host: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules(addr), capture_output=True,
                          text=True, timeout=10)
    if done.returncode != 0:
        raise NatError(f"{host}: nft could not add the NAT table: {done.stderr.strip()}")
