"""What the CLI accepts and how it ends: argument types that refuse a bad value by name before anything is
called, the one-line error discipline, and the exit statuses (documented in `swactor --help` and
docs/operations.md).

Every value bound for the orchestrator is checked against its proto field's range here, so an operator
sees "argument --max-tokens: ..." rather than a protobuf ValueError or a server round trip."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from swactor.localcluster.linkconditions import LinkConditions

EXIT_OK = 0
EXIT_FAILED = 1  # the operation was refused or failed: the orchestrator said no, the run faulted, no pool came up
EXIT_USAGE = 2  # a bad invocation: an argument was wrong, nothing was asked of anyone
EXIT_STOPPED = 3  # the run was stopped (swactor stop, or --stop-on-interrupt)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT); 128 + the signal for SIGTERM / SIGHUP

EXIT_STATUSES = f"""exit status:
  {EXIT_OK}    done (a watched run completed)
  {EXIT_FAILED}    refused or failed: the orchestrator refused the request or could not be reached,
       the run faulted, the local pool could not be brought up
  {EXIT_USAGE}    bad invocation: an argument was wrong (the message names it); nothing was sent
  {EXIT_STOPPED}    the watched run was stopped
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); 143 SIGTERM, 129 SIGHUP"""

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
FLOAT32_MAX = 3.4028234663852886e38  # a larger value is infinite once in the proto's float field
CHAT_ROLES = ("system", "user", "assistant", "tool")
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class CliError(Exception):
    """A one-line refusal; `status` is EXIT_USAGE for a bad invocation, EXIT_FAILED for a failed operation."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """argparse that ends a bad invocation with one line naming what was wrong (not the usage block), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def not_utf8(text: str) -> str | None:
    """Why `text` (an argv string: undecodable bytes arrive as surrogate escapes) is not UTF-8, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(text)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
        return "is not valid UTF-8"
    return None


def text(value: str) -> str:
    """Text that travels to the orchestrator (protobuf strings are UTF-8)."""
    why = not_utf8(value)
    if why:
        raise argparse.ArgumentTypeError(why)
    return value


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """An integer in lo..hi (the proto field's range, or tighter)."""

    def parse(value: str) -> int:
        try:
            number = int(text(value).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if not lo <= number <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {number}")
        return number

    parse.__name__ = "integer"  # argparse names the type in some messages
    return parse


def number(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """A finite float in [lo, hi] ((lo, hi] with lo_open): NaN and infinities are refused by name."""

    def parse(value: str) -> float:
        try:
            x = float(text(value).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {value!r}")
        if x < lo or x > hi or (lo_open and x == lo):
            raise argparse.ArgumentTypeError(f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {x:g}")
        return x

    parse.__name__ = "number"
    return parse


def run_id(value: str) -> int:
    try:
        n = int(text(value).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"run id {value!r} is not an integer") from None
    if not 0 < n <= UINT64_MAX:
        raise argparse.ArgumentTypeError(f"run id {n} is out of range (1..{UINT64_MAX})")
    return n


def address(value: str) -> str:
    """unix:/path or HOST:PORT ([v6]:PORT): anything else would make gRPC guess (DNS, port 443) and hang."""
    text(value)
    if value.startswith("unix:"):
        if len(value) == len("unix:"):
            raise argparse.ArgumentTypeError("unix: needs a socket path (unix:/run/swactor/orchestrator.sock)")
        return value
    m = _HOST_PORT.match(value)
    if m is None or not 0 < int(m[1]) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is neither unix:/path nor HOST:PORT (port 1..65535)")
    return value


def host_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._:-]+", text(value)):
        raise argparse.ArgumentTypeError(f"{value!r} is not a host name or IP address")
    return value


def chat_message(value: str):  # -> opb.ChatMessage (imported late: the stubs are generated)
    from swactor.v1 import orchestrator_pb2 as opb

    role, sep, content = text(value).partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"wants ROLE:TEXT, got {value!r}")
    if role not in CHAT_ROLES:
        raise argparse.ArgumentTypeError(f"role {role!r} is not one of {', '.join(CHAT_ROLES)}")
    return opb.ChatMessage(role=role, content=content)


def token_ids(value: str) -> list[int]:
    try:
        ids = [int(t) for t in text(value).replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants comma-separated token ids, got {value!r}") from None
    if not ids or min(ids) < 0 or max(ids) > UINT32_MAX:
        raise argparse.ArgumentTypeError(f"wants token ids in 0..2^32-1, got {value!r}")
    return ids


def local_path(value: str) -> str:
    """A path the local pool writes into its hosts' configs (a GGUF, a cluster dir): TOML is UTF-8, so is the path."""
    text(value)
    if not value.strip():
        raise argparse.ArgumentTypeError("is empty")
    return value


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=number(0.0, FLOAT32_MAX), default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=integer(0, UINT32_MAX), default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=number(0.0, 1.0), default=1.0,
                   help="nucleus cut in [0, 1]; 0 or 1 = off (default 1), as the orchestrator reads it")
    p.add_argument("--seed", type=integer(0, UINT64_MAX), default=None,
                   help="sampling seed (default: with --temperature > 0, the orchestrator picks a random one and "
                        "records it in the run, so `swactor show` tells you how to replay it)")


def add_link_conditions(p: argparse.ArgumentParser) -> None:
    """The local pool's link conditions (`python -m swactor.localcluster`, `swactor demo`); read them back with
    `link_conditions`."""
    from swactor.localcluster.linkconditions import MAX_DELAY_MS, MAX_RATE_MBIT

    g = p.add_argument_group("link conditions", "one way, on every packet a simulated host sends to another host "
                             "(network namespaces, root; docs/operations.md \"Trying WAN conditions locally\")")
    g.add_argument("--link-delay-ms", type=integer(0, MAX_DELAY_MS), default=0, metavar="MS",
                   help=f"one-way delay, 0..{MAX_DELAY_MS} (default 0): a round trip between two hosts is twice this")
    g.add_argument("--link-jitter-ms", type=integer(0, MAX_DELAY_MS), default=0, metavar="MS",
                   help="each packet's delay is uniform in delay +- this, at most --link-delay-ms (default 0); "
                        "packets of one flow keep their order")
    g.add_argument("--link-loss-pct", type=number(0.0, 100.0), default=0.0, metavar="PCT",
                   help="percent of the packets dropped, 0..100 (default 0)")
    g.add_argument("--link-rate-mbit", type=number(0.0, MAX_RATE_MBIT, lo_open=True), default=None, metavar="MBIT",
                   help="what one host gets from one other host at most, Mbit/s > 0 (default: no cap)")


def far_host(value: str) -> tuple[int, int]:
    """`--far-host H=RTT_MS`: host index H and the round trip, in ms, between it and every other host."""
    from swactor.localcluster.linkconditions import MAX_DELAY_MS

    host, sep, ms = text(value).partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected HOST=RTT_MS (e.g. 2=40), got {value!r}")
    return integer(0, 1_000)(host), integer(1, MAX_DELAY_MS)(ms)


def link_conditions(args: argparse.Namespace) -> LinkConditions:
    """The conditions `add_link_conditions`' flags gave; CliError naming --link-jitter-ms when it exceeds the delay
    (the one range argparse cannot check alone)."""
    from swactor.localcluster.linkconditions import LinkConditions

    if args.link_jitter_ms > args.link_delay_ms:
        raise CliError(f"argument --link-jitter-ms: must be in 0..{args.link_delay_ms} (at most --link-delay-ms), "
                       f"got {args.link_jitter_ms}")
    return LinkConditions(float(args.link_delay_ms), float(args.link_jitter_ms), args.link_loss_pct,
                          args.link_rate_mbit)
