"""A service for the supervisor's tests: sd_notify readiness and watchdog pings through
swactor.common.systemd, as the real services do, and a few ways to misbehave on request.

    python fake_service.py NAME [--ready-after S] [--hang-after S] [--exit-after S --code N] [--child]

It records `started PID`/`stopping PID` lines in $FAKE_LOG (appended), so a test reads the order
units started and stopped in; SIGTERM ends it with status 0 (a clean stop)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

from swactor.common import systemd


def record(what: str, name: str) -> None:
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(f"{what} {name} {os.getpid()} uid={os.getuid()} watchdog_pid={os.environ.get('WATCHDOG_PID', '')}\n")


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--hang-after", type=float, default=None)
    p.add_argument("--exit-after", type=float, default=None)
    p.add_argument("--code", type=int, default=1)
    p.add_argument("--child", action="store_true", help="leave a child process in the group")
    p.add_argument("--no-ready", action="store_true")
    args = p.parse_args()
    record("started", args.name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if args.child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"plain line from {args.name}", flush=True)  # not JSON: the supervisor wraps it
    await asyncio.sleep(args.ready_after)
    if not args.no_ready:
        systemd.notify_ready(f"{args.name} serving")
        systemd.start_watchdog()
    if args.exit_after is not None:
        await asyncio.sleep(args.exit_after)
        record("exiting", args.name)
        sys.exit(args.code)
    if args.hang_after is not None:
        await asyncio.sleep(args.hang_after)
        record("hanging", args.name)
        time.sleep(600)  # blocks the loop: the watchdog pings stop
    await stop.wait()
    record("stopping", args.name)


if __name__ == "__main__":
    asyncio.run(main())
