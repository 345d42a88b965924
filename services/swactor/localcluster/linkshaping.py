"""Link conditions (linkconditions.py) applied to a local pool's hosts in network namespaces (root only).

Every packet one host sends another arrives over the receiver's `eth0`, from the bridge; one chain in each host's
own namespace acts on it there, jumped to from INPUT:

    table ip filter (iptables, nft backend)
      chain INPUT         iifname "eth0" jump SWACTOR-WAN
      chain SWACTOR-WAN   loss:              -m statistic --mode random --probability p -j DROP   (nft: meta random)
                          delay/jitter/rate: -j NFQUEUE --queue-num 100, to the host's link delayer (linkdelay.py),
                                             which holds each packet for the path it came over (linkschedule.py)

So every ordered pair of hosts is a one-way path with the given conditions: a round trip between two hosts takes
twice the delay and loses loss_pct each way; the rate caps what one host gets from one other host. Not shaped: a
host's traffic to itself (it goes over `lo`), and the client, which reaches the orchestrator over host 0's Unix
socket.

Why on arrival, not on the sender's way out: a packet held there still counts against its sender's socket. TCP
Small Queues then lets a connection keep only about a millisecond of data below it, so a TCP stream crawled at
~1 MB/s over a 20 ms delay whatever the rate (the demo's weight fetch took 68 s for 65 MB), and a UDP socket's
send buffer caps QUIC the same way; netem orphans the packets it holds for this reason, NFQUEUE cannot. And a
packet dropped on the way out fails its sender's send() with EPERM, where a real path loses packets silently. On
arrival the sender has long let go of the packet.

Loss is a kernel rule, not the delayer's: no user-space round trip, and no delayer at all for loss alone. The rate
cap is in the delayer, a shaper with a buffer as a real bottleneck has, not an iptables/nft `limit` policer, under
which TCP and QUIC back off at every burst and reach far less than the rate.

Why iptables rather than a table of our own in nft: this kernel lacks nft's `queue` statement (CONFIG_NFT_QUEUE),
while the xtables NFQUEUE target that iptables-nft uses is here and on stock Debian kernels alike; the loss rule
goes through the same tool so that there is one thing to add and one to remove.

Fail closed: the NFQUEUE rule has no --queue-bypass, so a delayer that dies cuts its host off rather than leaving
the pool running unshaped while the operator believes it runs at WAN conditions; the pool's bring-up watches the
delayers like its services. The rules go in only once every delayer has bound its queue.

Teardown (`remove`, idempotent): the jump and the chain go in one iptables-restore (atomic), the filter table too
when this created it and nothing else put a rule in it since, then every delayer gets SIGTERM (it lets what it
holds go) and is waited for. The delayers run in their own sessions, recorded with the pool's reaper like the
services, so an owner that dies without tearing down loses them with its namespaces (which take the rules along).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from swactor.common.events import get_logger
from swactor.localcluster import ready
from swactor.localcluster.lifeline import Lifeline
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.procs import Service

QUEUE_NUM = 100  # inside each host's namespace; the tests' one-port delayers use 3..7 there
CHAIN = "SWACTOR-WAN"
DEVICE = "eth0"  # each host's one link to the bridge (netns.py)
READY_EVENT = "link_delay_ready"
log = get_logger(component="localcluster")


class LinkShapingError(RuntimeError):
    """Shaping could not be applied; the message names the host and the command or the delayer's log."""


@dataclass(frozen=True)
class ShapedHost:
    name: str  # "h1": how messages and logs name it
    ns: str  # its network namespace
    log_dir: Path  # where its delayer's log goes
    # What packets arriving at this host get, instead of LinkShaping.conditions (None: those). A host whose arrivals
    # alone are delayed by D is D ms of round trip from every other host, which stay near each other: a far host.
    conditions: LinkConditions | None = None


@dataclass
class _Applied:
    host: ShapedHost
    delayer: Service | None = None
    log_offset: int = 0  # where its delayer's log ended before it started
    rules: bool = False
    created_table: bool = False


def unavailable() -> str | None:
    """Why link conditions cannot be applied on this machine (a missing binary), or None."""
    for tool in ("iptables-restore", "nft", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (link conditions need iptables with the nft backend, nftables, iproute2)"
    return None


def _in_ns(ns: str, argv: Sequence[str], stdin: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", "netns", "exec", ns, *argv]
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        raise LinkShapingError(f"`{' '.join(cmd)}` did not finish within 10 s") from None
    if check and done.returncode != 0:
        raise LinkShapingError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _filter_rules(ns: str) -> int | None:
    """Rules in the namespace's `ip filter` table, or None when it has no such table."""
    done = _in_ns(ns, ["nft", "-j", "list", "table", "ip", "filter"], check=False)
    if done.returncode != 0:
        return None
    return sum("rule" in item for item in json.loads(done.stdout)["nftables"])


def rules_script(conditions: LinkConditions) -> str:
    """The iptables-restore input that adds the chain (with --noflush: nothing else in the table changes)."""
    lines = ["*filter", f":{CHAIN} - [0:0]", f"-A INPUT -i {DEVICE} -j {CHAIN}"]
    if conditions.loss_pct > 0:  # first: a lost packet takes no room on the rate-capped path
        lines.append(f"-A {CHAIN} -m statistic --mode random --probability {conditions.loss_pct / 100:.10f} -j DROP")
    if conditions.needs_delayer:
        lines.append(f"-A {CHAIN} -j NFQUEUE --queue-num {QUEUE_NUM}")
    return "\n".join([*lines, "COMMIT", ""])


REMOVE_SCRIPT = "\n".join(["*filter", f"-D INPUT -i {DEVICE} -j {CHAIN}", f"-F {CHAIN}", f"-X {CHAIN}", "COMMIT", ""])


def delayer_argv(conditions: LinkConditions) -> list[str]:
    argv = [sys.executable, "-m", "swactor.localcluster.linkdelay", "--queue", str(QUEUE_NUM),
            "--delay-ms", repr(conditions.delay_ms), "--jitter-ms", repr(conditions.jitter_ms)]
    if conditions.rate_mbit is not None:
        argv += ["--rate-mbit", repr(conditions.rate_mbit)]
    return argv


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _delayer_ready(svc: Service, since: int) -> None:
    """Its ready event, in what it logged after `since` (the log is appended to: a kept dir holds older runs')."""
    try:
        with svc.log.open("rb") as f:
            f.seek(since)
            text = f.read()
    except OSError:
        text = b""
    if READY_EVENT.encode() not in text:
        raise ready.NotReady(f"{svc.name} has not bound its queue yet")


@dataclass
class LinkShaping:
    conditions: LinkConditions
    hosts: Sequence[ShapedHost]
    lifeline: Lifeline | None = None  # the pool's reaper learns of each delayer's process group
    stop_timeout_s: float = 5.0
    _applied: list[_Applied] = field(default_factory=list)

    def of(self, host: ShapedHost) -> LinkConditions:
        return host.conditions if host.conditions is not None else self.conditions

    def apply(self, timeout_s: float = 30.0) -> None:
        """Start the delayers (when delay, jitter or a rate need them), wait until each has bound its queue, then add
        every host's chain. On failure, what was set up stays for `remove`."""
        shaped = [h for h in self.hosts if self.of(h).shaped]
        if not shaped:
            return
        why = unavailable()
        if why is not None:
            raise LinkShapingError(why)
        self._applied = [_Applied(h) for h in shaped]
        for a in self._applied:
            conditions = self.of(a.host)
            if conditions.needs_delayer:
                a.delayer = Service(f"{a.host.name}/link-delay", delayer_argv(conditions),
                                    a.host.log_dir / "link-delay.log")
                a.log_offset = _log_size(a.delayer.log)
                a.delayer.start(["ip", "netns", "exec", a.host.ns])
                if self.lifeline is not None:
                    self.lifeline.own_group(a.delayer.pid)  # its own session: the group id is its pid
        for a in self._applied:
            if (svc := a.delayer) is not None:
                try:
                    ready.wait_for(svc.name, lambda a=a, svc=svc: _delayer_ready(svc, a.log_offset), timeout_s,
                                   check=self._check_alive)
                except TimeoutError as e:
                    raise LinkShapingError(str(e)) from None
        for a in self._applied:
            a.created_table = _filter_rules(a.host.ns) is None
            _in_ns(a.host.ns, ["iptables-restore", "--noflush"], stdin=rules_script(self.of(a.host)))
            a.rules = True
            log.info("link_shaping_applied", host=a.host.name, queue=QUEUE_NUM,
                     delayer=a.delayer.pid if a.delayer is not None else None, **self.of(a.host).as_dict())

    @property
    def delayer_pids(self) -> list[int]:
        return [a.delayer.pid for a in self._applied if a.delayer is not None]

    def dead(self) -> str | None:
        """A delayer that exited (its host is cut off: the rule fails closed), described with its log, or None."""
        for a in self._applied:
            if a.delayer is not None and a.delayer.exited() is not None:
                return a.delayer.describe_exit()
        return None

    def _check_alive(self) -> None:
        why = self.dead()
        if why is not None:
            raise LinkShapingError(why)

    def remove(self) -> None:
        """Remove the chain (and a filter table this created), then stop the delayers. Safe to call twice, and on a
        namespace that is already gone."""
        if not self._applied:
            return
        failed = []
        for a in self._applied:
            if a.rules:
                done = _in_ns(a.host.ns, ["iptables-restore", "--noflush"], stdin=REMOVE_SCRIPT, check=False)
                if done.returncode != 0:
                    failed.append(f"{a.host.name}: {done.stderr.strip()}")
                elif a.created_table and _filter_rules(a.host.ns) == 0:
                    _in_ns(a.host.ns, ["nft", "delete", "table", "ip", "filter"], check=False)
                a.rules = False
        delayers = [a.delayer for a in self._applied if a.delayer is not None]
        for svc in delayers:
            svc.signal(signal.SIGTERM)
        killed = [svc.name for svc in delayers if not svc.finish(self.stop_timeout_s)]
        if self.lifeline is not None:
            for svc in delayers:
                self.lifeline.release_group(svc.pid)
        self._applied = []
        log.info("link_shaping_removed", hosts=[h.name for h in self.hosts], delayers_stopped=len(delayers),
                 killed=killed, rules_not_removed=failed)
