"""Hosts for the system tests: one `systemd-nspawn` container per host, on an overlay of the cached
Debian rootfs, in a network namespace of the netns harness. Booted with systemd (`--boot`), or, as a
container image runs, with a given command as its main process (PID 1) and no systemd at all.

    with Container("sys-h0", rootfs, workdir, netns="/run/netns/x-h0") as c:
        c.start(); c.wait_booted()                  # waits for `systemctl is-system-running`
        c.sh("systemctl is-active dbus")            # nsenter -t LEADER -a, clean environment

    with Container("sys-h1", rootfs, workdir, netns="/run/netns/x-h1") as c:
        c.mount()
        c.run_once(["bash", "/root/swactor/install.sh", "host", ...])  # nothing runs before, or after
        c.start_command(["/opt/swactor/venv/bin/swactor-host", "run"])
        c.wait_started()                            # its main process found: c.run() works
        status = c.terminate()                      # SIGTERM to PID 1, as `docker stop`; nspawn's exit status

The container is started with `--register=no --keep-unit` (no machined needed), its init (or main
process) is found as the nspawn process's child in a new PID namespace, and every command enters all
of its namespaces with `nsenter -t PID -a`. `close()` powers a booted container off through its own
systemd, and SIGTERMs the main process of one that is not (SIGKILLs it if that takes too long),
unmounts the overlay and its tmpfs and deletes the host's copy: nothing stays behind, also when the
body raised.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
             "LANG": "C.UTF-8", "TERM": "dumb"}
PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")
TMPFS_SIZE = "3g"  # a host's writes: the venv (~210 MB), the model copy, state; only what is used counts


class ContainerError(RuntimeError):
    """A container did not boot, a command inside it failed, or it did not stop; names which."""


def nspawn_unavailable_reason() -> str | None:
    """Why this machine cannot boot nspawn containers (not root, tools missing), or None."""
    if os.geteuid() != 0:
        return "system tests need root (debootstrap, overlay mounts, systemd-nspawn, network namespaces)"
    for tool, pkg in (("systemd-nspawn", "systemd-container"), ("debootstrap", "debootstrap"),
                      ("nsenter", "util-linux"), ("ip", "iproute2"), ("git", "git")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install {pkg}; install.sh dev installs it)"
    return None


def _pid_ns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(entry.path, "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


class Container:
    """One booted Debian host. `workdir` (created, then deleted on close) is a tmpfs holding the
    overlay's upper, work and merged dirs and the console log."""

    def __init__(self, name: str, rootfs: Path, workdir: Path, *, netns: str, addr: str = "",
                 bind_ro: Sequence[tuple[Path, str]] = ()) -> None:
        self.name = name
        self.addr = addr  # this host's address in its network namespace
        self.rootfs = rootfs
        self.workdir = workdir
        self.netns = netns
        self.bind_ro = list(bind_ro)
        self.merged = workdir / "merged"
        self.console = workdir / "console.log"
        self.proc: subprocess.Popen[Any] | None = None
        self.leader: int | None = None
        self.command: list[str] = []  # the main process of a container that is not booted; [] when booted
        self._mounted = False
        self._tmpfs = False
        self._log: IO[Any] | None = None

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- lifecycle ----

    def start(self) -> None:
        """Mount the overlay and start `systemd-nspawn -b` in the background (see `wait_booted`)."""
        self.mount()
        self._launch()

    def start_command(self, argv: Sequence[str]) -> None:
        """Mount the overlay (unless mounted) and start `systemd-nspawn` with `argv` as the container's
        main process, PID 1 in its PID namespace, no systemd inside (see `wait_started`). Its
        stdout and stderr go to the console log as they are (--console=pipe)."""
        self.command = list(argv)
        self.mount()
        self._launch()

    def mount(self) -> None:
        """The tmpfs and the overlay on it, once: the container's file system, before anything runs."""
        if self._mounted:
            return
        # The host's writes (venv, model copy, state) go to a tmpfs: nothing to write back to disk
        # at unmount (on a slow disk that took ~10 s per host), and freed at once.
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._check(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(self.workdir)],
                    "mount the tmpfs for the overlay's upper dir")
        self._tmpfs = True
        for d in ("upper", "work", "merged"):
            (self.workdir / d).mkdir()
        opts = f"lowerdir={self.rootfs},upperdir={self.workdir / 'upper'},workdir={self.workdir / 'work'}"
        self._check(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.merged)], "mount the overlay")
        self._mounted = True

    def _nspawn(self) -> list[str]:
        return ["systemd-nspawn", "--register=no", "--keep-unit", f"--machine={self.name}",
                f"--network-namespace-path={self.netns}", "--directory", str(self.merged),
                *(f"--bind-ro={src}:{dst}" for src, dst in self.bind_ro)]

    def _launch(self) -> None:
        if self.command:
            # The command as PID 1 (no --as-pid2: it is the container's init, as in an image); nspawn's
            # own SIGTERM (a killed test) reaches it as SIGTERM, not as the SIGKILL nspawn sends by default.
            argv = [*self._nspawn(), "--console=pipe", "--quiet", "--kill-signal=SIGTERM", "--", *self.command]
        else:
            argv = [*self._nspawn(), "--boot"]
        self.leader = None
        if self._log is not None:
            self._log.close()  # an earlier start's
        self._log = self.console.open("ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**CLEAN_ENV, "SYSTEMD_LOG_COLOR": "0"}, start_new_session=True)

    def run_once(self, argv: Sequence[str], *, timeout: float = 420.0,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `argv` as the main process of a container that is not running (no systemd, nothing
        else in it), in the host's network namespace with its bind mounts, a clean root environment;
        returns when it exits, and with it the container."""
        if self.proc is not None and self.proc.poll() is None:
            raise ContainerError(f"{self.name}: running; run_once() is for a container that is not")
        self.mount()
        env = [f"--setenv={k}={v}" for k, v in CLEAN_ENV.items()]
        full = [*self._nspawn(), "--console=pipe", "--quiet", *env, "--", *argv]
        try:
            done = subprocess.run(full, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                                  env={**CLEAN_ENV, "SYSTEMD_LOG_COLOR": "0"})
        except subprocess.TimeoutExpired as e:
            raise ContainerError(f"{self.name}: `{' '.join(argv)}` did not finish within {timeout} s; "
                                 f"stderr tail: {(e.stderr or b'')[-2000:]!r}") from None
        if check and done.returncode != 0:
            raise ContainerError(f"{self.name}: `{' '.join(argv)}` failed ({done.returncode}); "
                                 f"stderr tail: {done.stderr[-3000:]}")
        return done

    def wait_started(self, timeout_s: float = 30.0) -> int:
        """Wait for the main process of a container started with `start_command` to be found (the
        nspawn's child in a new PID namespace running the command); returns its pid as this machine
        numbers it. Raises ContainerError with the console tail when nspawn exits first."""
        assert self.proc is not None and self.command, "start_command() first"
        deadline = time.monotonic() + timeout_s
        own_ns = _pid_ns("self")
        want = Path(self.command[0]).name[:15]  # comm: the executable's name, as the kernel cuts it
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ContainerError(f"{self.name}: systemd-nspawn exited with {self.proc.returncode} while "
                                     f"starting; console: {self.console_tail()}")
            for child in _children(self.proc.pid):
                with contextlib.suppress(OSError):
                    if _pid_ns(child) != own_ns and Path(f"/proc/{child}/comm").read_text().strip() == want:
                        self.leader = child
                        return child
            time.sleep(0.1)
        raise ContainerError(f"{self.name}: main process not started within {timeout_s} s; "
                             f"console: {self.console_tail()}")

    def terminate(self, timeout_s: float = 60.0, sig: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM (or `sig`) to the main process of a container that is not booted (what `docker
        stop` sends), then wait for nspawn to exit; returns its exit status, the main process's.
        Raises ContainerError, the container still running, when it does not exit within `timeout_s`."""
        assert self.proc is not None and self.command, "start_command() first"
        if self.proc.poll() is None and self.leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise ContainerError(f"{self.name}: not stopped within {timeout_s} s of SIGTERM; "
                                 f"console: {self.console_tail()}") from None

    def wait_booted(self, timeout_s: float = 90.0) -> str:
        """Wait for init to be found and `systemctl is-system-running` to say running or degraded;
        returns that state. Raises ContainerError with the console tail otherwise."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        own_ns = _pid_ns("self")
        state = "no init yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ContainerError(f"{self.name}: systemd-nspawn exited with {self.proc.returncode} "
                                     f"while booting; console: {self.console_tail()}")
            if self.leader is None:
                for child in _children(self.proc.pid):
                    with contextlib.suppress(OSError):
                        if _pid_ns(child) != own_ns and Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                            self.leader = child
            if self.leader is not None:
                done = self.run(["systemctl", "is-system-running"], check=False, timeout=10)
                state = done.stdout.strip() or done.stderr.strip()
                if state in ("running", "degraded"):
                    return state
            time.sleep(0.5)
        raise ContainerError(f"{self.name}: not booted within {timeout_s} s (last state {state!r}); "
                             f"console: {self.console_tail()}")

    def reboot(self, timeout_s: float = 90.0) -> str:
        """Power off through systemd and boot again from the same disk (the overlay and its upper
        dir stay): what the host's services do at boot, not what the installer started."""
        self._poweroff(timeout_s)
        if self._log is not None:
            self._log.close()
        self._launch()
        return self.wait_booted(timeout_s)

    def _poweroff(self, timeout_s: float) -> None:
        assert self.proc is not None
        if self.command:
            self.terminate(timeout_s)
            return
        if self.leader is not None:
            self.run(["systemctl", "poweroff"], check=False, timeout=10)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise ContainerError(f"{self.name}: not powered off within {timeout_s} s; "
                                 f"console: {self.console_tail()}") from None

    def close(self, timeout_s: float = 30.0) -> None:
        """Power off (systemd inside; SIGTERM to a main process that is not systemd), kill nspawn if
        it lingers, unmount, delete the copy."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    self._poweroff(timeout_s)
                except ContainerError:
                    # SIGKILL to the container's init ends its PID namespace; nspawn then exits.
                    # (Killing nspawn alone would orphan the container, still running.)
                    if self.leader is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(self.leader, signal.SIGKILL)
                    try:
                        self.proc.wait(10)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait(10)
        finally:
            if self._log is not None:
                self._log.close()
            for mounted, path in ((self._mounted, self.merged), (self._tmpfs, self.workdir)):
                if mounted:
                    subprocess.run(["umount", str(path)], capture_output=True)
                    if os.path.ismount(path):
                        subprocess.run(["umount", "-l", str(path)], capture_output=True)
            self._mounted = self._tmpfs = False
            with contextlib.suppress(OSError):
                (PROPAGATE_DIR / self.name).rmdir()  # nspawn's mount-propagation dir, left behind
            if not os.path.ismount(self.workdir):
                shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- commands ----

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the container (all of init's namespaces, a clean root environment)."""
        if self.leader is None:
            raise ContainerError(f"{self.name}: not booted")
        full = ["nsenter", "-t", str(self.leader), "-a", "env", "-i", *(f"{k}={v}" for k, v in CLEAN_ENV.items()),
                *argv]
        try:
            done = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input)
        except subprocess.TimeoutExpired as e:
            raise ContainerError(f"{self.name}: `{' '.join(argv)}` did not finish within {timeout} s; "
                                 f"stderr tail: {(e.stderr or b'')[-2000:]!r}") from None
        if check and done.returncode != 0:
            raise ContainerError(f"{self.name}: `{' '.join(argv)}` failed ({done.returncode}); "
                                 f"stderr tail: {done.stderr[-3000:]}")
        return done

    def sh(self, script: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(["bash", "-c", script], **kw)

    def path(self, inside: str) -> Path:
        """The host-side path of a file inside the (mounted) container."""
        return self.merged / inside.lstrip("/")

    def console_tail(self, n: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.console.read_bytes()[-n:].decode(errors="replace")
        return ""

    def _check(self, argv: list[str], what: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise ContainerError(f"{self.name}: could not {what}: `{' '.join(argv)}`: {done.stderr.strip()}")
