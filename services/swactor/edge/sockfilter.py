"""A classic BPF filter on the endpoint's UDP socket that drops a flood of Initials in the kernel.

Under a flood of new-connection Initials the driver's Python receive path (recvfrom, a header
look, a counted refusal: several µs each) cannot keep up with one sender process; the socket's
receive queue fills and members' packets wait behind junk or are dropped with it. While admission
says so (`ConnectionAdmission.flood_tick`: more unvalidated strangers' Initials than we would
answer with Retry), the endpoint attaches this filter, which, before anything is queued, drops

    a long-header QUIC v1 Initial without a token, from an IPv4 source that is no member's,

except a random 1 in 2**`sample_shift`, which still reaches admission (so the flood stays
measured, and a stranger's Initial still gets its Retry after a few retransmissions). Everything
else passes untouched: members' Initials, Initials carrying a token (validated clients), all
other packet types and short-header packets (established connections). IPv4 only: on an IPv6
socket no filter is attached. The policy (when, for whom) is admission.py's; this module only
builds and attaches the program.

The filter sees the UDP header at offset 0 (the QUIC packet starts at 8) and the IPv4 header at
SKF_NET_OFF; a load beyond the datagram ends the program with 0 (drop), which only a datagram too
short to be a valid Initial can reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import socket
import struct
from collections.abc import Iterable

SO_ATTACH_FILTER, SO_DETACH_FILTER = 26, 27  # <asm-generic/socket.h>
SKF_NET_OFF = -0x100000
SKF_AD_RANDOM = -0x1000 + 56
MAX_MEMBERS = 200  # one compare each; jump offsets are 8 bits

# opcodes (linux/filter.h)
LD_B_ABS, LD_B_IND, LD_W_ABS = 0x30, 0x50, 0x20
ALU_AND_K, ALU_ADD_X, TAX = 0x54, 0x0C, 0x07
JEQ_K, RET_K = 0x15, 0x06
UDP = 8  # the QUIC packet starts after the UDP header
ACCEPT, DROP = 0xFFFFFFFF, 0

Insn = tuple[int, int, int, int]  # (code, jt, jf, k)


def initial_filter(members: Iterable[str], sample_shift: int) -> list[Insn]:
    """The program: drop token-less v1 Initials from non-member IPv4 sources, but 1 in 2**shift."""
    ips = sorted({int(ipaddress.IPv4Address(h)) for h in members if _is_ipv4(h)})
    if len(ips) > MAX_MEMBERS:
        raise ValueError(f"{len(ips)} member addresses: the kernel filter holds at most {MAX_MEMBERS}")
    n = len(ips)
    # Layout: [0..9] header checks, [10] source load, [11..10+n] member compares,
    # [11+n..13+n] sampling, [14+n] ACCEPT, [15+n] DROP.
    accept = 14 + n

    def to_accept(at: int) -> int:
        return accept - at - 1

    prog: list[Insn] = [
        (LD_B_ABS, 0, 0, UDP),  # 0: first byte
        (ALU_AND_K, 0, 0, 0xF0),  # 1
        (JEQ_K, 0, to_accept(2), 0xC0),  # 2: long header, fixed bit, type Initial (v1); else accept
        (LD_B_ABS, 0, 0, UDP + 5),  # 3: destination CID length
        (TAX, 0, 0, 0),  # 4
        (LD_B_IND, 0, 0, UDP + 6),  # 5: source CID length
        (ALU_ADD_X, 0, 0, 0),  # 6
        (TAX, 0, 0, 0),  # 7
        (LD_B_IND, 0, 0, UDP + 7),  # 8: first byte of the token length
        (JEQ_K, 0, to_accept(9), 0),  # 9: a token: let admission check it
        (LD_W_ABS, 0, 0, (SKF_NET_OFF + 12) & 0xFFFFFFFF),  # 10: IPv4 source address
    ]
    for i, ip in enumerate(ips):
        prog.append((JEQ_K, to_accept(11 + i), 0, ip))  # a member: accept
    mask = (1 << sample_shift) - 1
    prog += [
        (LD_W_ABS, 0, 0, SKF_AD_RANDOM & 0xFFFFFFFF),  # 11+n
        (ALU_AND_K, 0, 0, mask),  # 12+n
        (JEQ_K, 0, 1, 0),  # 13+n: the sampled one in 2**shift goes on
        (RET_K, 0, 0, ACCEPT),  # 14+n
        (RET_K, 0, 0, DROP),  # 15+n
    ]
    assert len(prog) == accept + 2
    return prog


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def attach(sock: socket.socket, prog: list[Insn]) -> None:
    """Attach (or replace) the socket's filter; OSError if the kernel refuses it."""
    code = b"".join(struct.pack("HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def detach(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # ENOENT: none attached
        sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
