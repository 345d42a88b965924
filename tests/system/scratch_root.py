"""A throwaway copy of this machine's root filesystem, for running the installer's scripts where a
mistake cannot cost anything: a script that removes /opt, or /, removes it from the copy only.

    with ScratchRoot() as root:
        root.path("/opt/keep-me").write_text("x")        # plant a file, from outside
        done = root.run(["bash", "/root/swactor/install.sh", "uninstall", "--prefix", "/opt"])
        assert root.changes(before) == {}                  # nothing written or deleted anywhere

The copy is an overlay: this machine's / as its read-only lower layer, a tmpfs as its upper layer,
mounted in a mount namespace of its own, and a PID namespace of its own with its own /proc, so that
the uninstall's search for the swactor user's processes (and its kill) sees the copy's processes
only. Commands run chrooted into it. Every write and every deletion lands in the tmpfs, which is gone
with the namespace when the copy closes; there is no bind mount of anything of the host in it.
Needs root and unshare/nsenter (util-linux); building one takes well under a second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
             "LANG": "C.UTF-8"}

# Run by the namespace's first process, in the scratch directory: the tmpfs, the overlay on it, the
# copy's /proc and device nodes (made, not bound: an rm -rf of the copy's /dev must not reach the
# host's). Then it waits to be killed, which ends the namespaces and all that was mounted in them;
# meanwhile, as their init, it reaps the processes orphaned in them (bash's `wait` reaps any child),
# or a killed one would stay a zombie of its uid.
_SETUP = r"""
set -eu
mount -t tmpfs -o size=512m,mode=0755 scratch "$1"
cd "$1"
mkdir upper work root
mount -t overlay overlay -o lowerdir=/,upperdir=upper,workdir=work root
mount -t proc proc root/proc
for node in "null 1 3" "zero 1 5" "urandom 1 9"; do
    set -- $node
    rm -f "root/dev/$1" && mknod -m 0666 "root/dev/$1" c "$2" "$3"
done
rm -rf root/dev/fd && ln -s /proc/self/fd root/dev/fd  # bash's <(...)
echo ready
while :; do sleep 3600 & wait; done
"""


def scratch_root_unavailable_reason() -> str | None:
    """Why this machine cannot make a scratch root, or None."""
    if os.geteuid() != 0:
        return "the scratch root needs root (mount and PID namespaces, an overlay mount)"
    for tool in ("unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (util-linux, coreutils)"
    return None


class ScratchRootError(RuntimeError):
    """The scratch root could not be made."""


class ScratchRoot:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="swactor-scratch-"))
        self._unshare: subprocess.Popen[str] | None = None
        self.holder = 0  # the namespaces' first process, as this machine numbers it

    def __enter__(self) -> ScratchRoot:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        self._unshare = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "bash", "-c", _SETUP, "setup",
             str(self.dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._unshare.stdout is not None
        if self._unshare.stdout.readline().strip() != "ready":
            self._unshare.kill()
            _, err = self._unshare.communicate(timeout=10)
            raise ScratchRootError(f"could not make the scratch root: {err.strip()}")
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children").read_text().split()
        self.holder = int(children[0])

    def close(self) -> None:
        """Kill the namespaces' first process: the kernel ends the rest of them and unmounts it all."""
        if self.holder:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.holder, 9)
        if self._unshare is not None:
            try:
                self._unshare.wait(10)
            except subprocess.TimeoutExpired:
                self._unshare.kill()
                self._unshare.wait(10)
            self._unshare.communicate()
        for _ in range(50):  # the namespace is gone a moment after its last process
            with contextlib.suppress(FileNotFoundError):
                self.dir.rmdir()
            if not self.dir.exists():
                break
            time.sleep(0.02)

    @property
    def _scratch(self) -> Path:
        """The tmpfs, seen from outside through the holder's working directory."""
        return Path(f"/proc/{self.holder}/cwd")

    def path(self, inside: str) -> Path:
        """Where the copy's file `inside` is, for reading and writing it from outside."""
        return self._scratch / "root" / inside.lstrip("/")

    def run(self, argv: Sequence[str], *, cwd: str = "/root", timeout: float = 60.0,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run `argv` as root inside the copy, in a clean environment, from `cwd`."""
        inner = ["env", "-i", *(f"{k}={v}" for k, v in CLEAN_ENV.items()), "bash", "-c", 'cd "$1" && shift && exec "$@"',
                 "run", cwd, *argv]
        full = ["nsenter", "-t", str(self.holder), "-m", "-p", "chroot", str(self.dir / "root"), *inner]
        done = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr[-3000:]}")
        return done

    def sh(self, script: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a bash script inside the copy (strict mode), `args` as its $1...$n."""
        return self.run(["bash", "-euo", "pipefail", "-c", script, "sh", *args], **kw)

    def snapshot(self) -> dict[str, tuple]:
        """Everything written or deleted in the copy so far: the upper layer's entries, each with its
        type, mode, owner, size, mtime and link target; a host file deleted in the copy is a whiteout
        there. A directory's mtime is left out: its entries that changed are listed themselves."""
        upper = self._scratch / "upper"
        out: dict[str, tuple] = {}
        for dirpath, dirnames, filenames in os.walk(upper):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                st = p.lstat()
                inside = "/" + str(p.relative_to(upper))
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    out[inside] = ("whiteout",)
                elif stat.S_ISDIR(st.st_mode):
                    out[inside] = ("dir", st.st_mode, st.st_uid, st.st_gid)
                else:
                    out[inside] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
                                   os.readlink(p) if stat.S_ISLNK(st.st_mode) else "")
        return out

    def changes(self, before: dict[str, tuple]) -> dict[str, str]:
        """What changed in the copy since the snapshot `before`: path -> "made", "changed" or "gone".
        A host directory copied up to the upper layer unchanged (to hold a change below it) is none."""
        after = self.snapshot()
        diff = {p: "gone" for p in before.keys() - after.keys()}
        for p in after.keys() - before.keys():
            if after[p] == ("whiteout",):
                diff[p] = "gone"
            elif not (after[p][0] == "dir" and os.path.isdir(p) and not os.path.islink(p)):
                diff[p] = "made"
        diff.update({p: "changed" for p in before.keys() & after.keys() if before[p] != after[p]})
        return diff
