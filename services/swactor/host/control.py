"""The supervisor's control socket (root only): `swactor-host status` and `swactor-host stop` ask it.

One request line per connection, one JSON answer line: `status` answers at once with every unit
(`core.UnitStatus`, its last log lines) and what the supervisor cannot apply on this host; `stop`
stops every unit and answers once they are all down, just before the supervisor exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swactor.host.shell import HostSupervisor

_REQUESTS = ("status", "stop")


class NotRunning(RuntimeError):
    """No supervisor answers on the control socket."""


async def serve(path: Path, supervisor: HostSupervisor) -> asyncio.base_events.Server:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        supervisor.answering.add(task)  # a `stop` answer is written after the units are down: the supervisor waits
        try:
            request = (await asyncio.wait_for(reader.readline(), 10)).decode(errors="replace").strip()
            if request == "status":
                reply: dict[str, Any] = status_of(supervisor)
            elif request == "stop":
                supervisor.stop()
                await supervisor.done.wait()
                reply = {"stopped": True}
            else:
                reply = {"error": f"unknown request {request[:40]!r}: one of {', '.join(_REQUESTS)}"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            supervisor.answering.discard(task)

    server = await asyncio.start_unix_server(answer, str(path))
    os.chmod(path, 0o600)
    return server


def status_of(supervisor: HostSupervisor) -> dict[str, Any]:
    units = []
    for s in supervisor.core.status():
        units.append({**dataclasses.asdict(s), "log": list(supervisor.tails[s.name])})
    return {"pid": os.getpid(), "units": units, "not_applied": supervisor.not_applied}


def ask(path: Path, request: str, timeout_s: float) -> dict[str, Any]:
    """Send one request and return the answer; NotRunning when no supervisor listens at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise NotRunning(f"no swactor-host supervisor answers at {path} ({e.strerror})") from None
        sock.sendall(request.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    if not data:
        raise NotRunning(f"the supervisor at {path} closed the connection without an answer")
    return json.loads(data)
