"""What a local pool's owner has told its reaper it owns, and what the reaper removes once the owner is gone.

Pure: the records the owner writes (one a line), how the reaper folds them, and the decision; `reaper.py` does the
pipe, the signals, the namespaces and the files.

  group N      a service's process group (its leader was started in a session of its own)
  release N    that group was stopped by the owner: never signal N again (the number may be reused)
  netns NAME   the owner's namespaces are NAME-br, NAME-h0, ... (also hosts added later)
  dir PATH     a temporary directory the owner created and would remove (never one the caller gave)
  done         the owner tore everything down itself: the reaper leaves at once, touching nothing
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, replace

GROUP, RELEASE, NETNS, DIR, DONE = "group", "release", "netns", "dir", "done"


def record(kind: str, value: object = "") -> bytes:
    """One record as the owner writes it (short enough for one atomic pipe write). Paths go as the file system's
    bytes (surrogateescape), so that a name that is not UTF-8 still names the same directory."""
    text = f"{kind} {value}" if value != "" else kind
    if "\n" in text:
        raise ValueError(f"a record is one line: {text!r}")
    return (text + "\n").encode(errors="surrogateescape")


@dataclass(frozen=True)
class Owned:
    groups: frozenset[int] = frozenset()
    netns: tuple[str, ...] = ()  # namespace name prefixes
    dirs: tuple[str, ...] = ()
    done: bool = False


def _group(value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"not a process group: {value!r}")
    pgid = int(value)
    # 0 would be the reaper's own group and 1 init's; neither is ever a service's.
    if pgid <= 1:
        raise ValueError(f"not a service's process group: {pgid}")
    return pgid


def apply(owned: Owned, line: str) -> Owned:
    """Fold one record into what is owned; ValueError names a malformed or unsafe one (which changes nothing)."""
    kind, _, value = line.rstrip("\n").partition(" ")
    match kind:
        case "group":
            return replace(owned, groups=owned.groups | {_group(value)})
        case "release":
            return replace(owned, groups=owned.groups - {_group(value)})
        case "netns" if value.split() == [value] and "/" not in value:
            return replace(owned, netns=(*owned.netns, value))
        # A relative or root path, or one with `..`, is never a temporary directory the owner made.
        case "dir" if posixpath.isabs(value) and posixpath.normpath(value) == value and value != "/":
            return replace(owned, dirs=(*owned.dirs, value))
        case "done" if not value:
            return replace(owned, done=True)
    raise ValueError(f"malformed record: {line.strip()!r}")


@dataclass(frozen=True)
class Cleanup:
    """What the reaper does, in this order: SIGKILL the groups, kill what runs inside the namespaces and delete
    them, then (once the groups are gone, so nothing writes there) remove the directories."""

    groups: tuple[int, ...] = ()
    namespaces: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.groups or self.namespaces or self.dirs)


def cleanup(owned: Owned, namespaces: Iterable[str]) -> Cleanup:
    """What is left to remove when the pipe from the owner closed; `namespaces` are those that exist now."""
    if owned.done:
        return Cleanup()
    mine = sorted(ns for ns in namespaces if any(ns.startswith(p + "-") for p in owned.netns))
    return Cleanup(tuple(sorted(owned.groups)), tuple(mine), owned.dirs)
