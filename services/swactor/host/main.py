"""`swactor-host`: this host's services without systemd (a container whose PID 1 is not systemd).

    swactor-host run [--units DIR]          # foreground; a container's entrypoint; SIGTERM stops all
    swactor-host status [UNIT...] [--json]  # what `systemctl status swactor-*` prints
    swactor-host stop                       # stop every unit and the supervisor; returns once it exited

`run` reads the unit files `install.sh host --no-systemd` wrote (PREFIX/units, the same files systemd
would run) and gives their services what the units give under systemd: start order, readiness through
a NOTIFY_SOCKET it owns, the watchdog, restart on failure with back-off, the swactor user, one JSON log
stream on stderr, and a clean stop. Exit statuses as systemctl's: status 0 when every unit shown is
active, 3 when one is not, 4 for a unit it does not run; 1 when no supervisor answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from swactor.common.events import configure_logging
from swactor.host import control
from swactor.host.shell import HostSupervisor
from swactor.host.spawn import HostPaths
from swactor.host.status import render, shown
from swactor.host.units import UnitError, read_units

DEFAULT_CONTROL = HostPaths().control
STOP_TIMEOUT_S = 300.0  # the sum of the units' stop timeouts, with room


def _default_units() -> Path:
    """PREFIX/units beside the venv this command runs from (PREFIX/venv)."""
    return Path(sys.prefix).parent / "units"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swactor-host", description=__doc__.split("\n\n")[0])
    p.add_argument("--control", type=Path, default=DEFAULT_CONTROL,
                   help=f"the supervisor's control socket (default {DEFAULT_CONTROL})")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start and supervise every unit (foreground)")
    run.add_argument("--units", type=Path, default=None,
                     help="directory of the *.service files to run (default: PREFIX/units of this install)")
    status = sub.add_parser("status", help="the units' state, as systemctl status prints it")
    status.add_argument("units", nargs="*", metavar="UNIT", help="swactor-worker or swactor-worker.service")
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    sub.add_parser("stop", help="stop every unit, then the supervisor")
    return p


def _run(units_dir: Path, control_path: Path) -> int:
    configure_logging("swactor-host")
    try:
        units = read_units(units_dir)
    except UnitError as e:
        print(f"swactor-host run: {e}", file=sys.stderr)
        return 1
    try:  # two supervisors would start every service twice and fight over their sockets
        running = control.ask(control_path, "status", timeout_s=5)
    except (control.NotRunning, OSError, ValueError):
        pass
    else:
        print(f"swactor-host run: a supervisor already runs here (pid {running.get('pid')}, {control_path}); "
              "swactor-host stop ends it", file=sys.stderr)
        return 1
    paths = HostPaths(own=control_path.parent)

    async def main() -> int:
        return await HostSupervisor(units, paths).run()

    return asyncio.run(main())


def _status(control_path: Path, names: list[str], as_json: bool) -> int:
    answer = control.ask(control_path, "status", timeout_s=10)
    known = {u["name"] for u in answer["units"]} | {u["name"].removesuffix(".service") for u in answer["units"]}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"swactor-host status: no unit {', '.join(unknown)} here (units: "
              f"{', '.join(u['name'] for u in answer['units'])})", file=sys.stderr)
        return 4
    text, all_active = render(answer, names)
    if as_json:
        print(json.dumps({**answer, "units": shown(answer, names)}))
    else:
        print(text)
    return 0 if all_active else 3


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            sys.exit(_run(args.units or _default_units(), args.control))
        if args.command == "status":
            sys.exit(_status(args.control, args.units, args.json))
        control.ask(args.control, "stop", timeout_s=STOP_TIMEOUT_S)
    except control.NotRunning as e:
        print(f"swactor-host {args.command}: {e}", file=sys.stderr)
        sys.exit(1)
    except PermissionError as e:
        print(f"swactor-host {args.command}: {e} (the control socket is root's)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
