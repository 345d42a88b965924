"""`swactor-host status` as `systemctl status` prints it: one block per unit, its last log lines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

_BULLET = {"active": "●", "activating": "●", "deactivating": "●", "failed": "\u00d7", "inactive": "○"}


def _ago(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}min {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}min"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def unit_block(u: dict[str, Any], now: float) -> str:
    since = ""
    if u["since"]:
        stamp = time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(u["since"]))
        since = f" since {stamp}; {_ago(now - u['since'])} ago"
    sub = u["sub_state"]
    if u["waiting_for"]:
        sub += f": {', '.join(u['waiting_for'])}"
    lines = [f"{_BULLET.get(u['active_state'], '?')} {u['name']} - {u['description']}",
             f"     Loaded: loaded ({u['path']}; supervised by swactor-host)",
             f"     Active: {u['active_state']} ({sub}){since}"]
    if u["main_pid"]:
        lines.append(f"   Main PID: {u['main_pid']} ({_comm(u['main_pid'])})")
    if u["status_text"]:
        lines.append(f'     Status: "{u["status_text"]}"')
    last = f" (last: {u['last_exit']})" if u["last_exit"] else ""
    lines.append(f"   Restarts: {u['restarts']}{last}")
    if u["not_applied"]:
        lines.append(f"Not applied: {' '.join(u['not_applied'])} (need systemd)")
    if u["log"]:
        lines += ["", *u["log"]]
    return "\n".join(lines)


def shown(answer: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    """The units `names` asks for (swactor-worker or swactor-worker.service); every unit when empty."""
    return [u for u in answer["units"] if not names or u["name"] in names or u["name"].removesuffix(".service") in names]


def render(answer: dict[str, Any], names: list[str]) -> tuple[str, bool]:
    """The text for `names` (every unit when empty) and whether every one shown is active."""
    units = shown(answer, names)
    now = time.time()
    text = "\n\n".join(unit_block(u, now) for u in units)
    if answer.get("not_applied"):
        text += "\n\nOn this host the supervisor cannot apply: " + "; ".join(answer["not_applied"])
    return text, bool(units) and all(u["active_state"] == "active" for u in units)
