"""Model distribution benchmark (issue 14): two hosts in network namespaces (tests/harness/netns.py),
the orchestrator's model server on host A, a stage host's FetchPool on host B.

    .venv/bin/python bench/distribution.py [--rate 1gbit] [--big-gib 3.6 | --no-big] [--rounds 3]

Printed, per model (the real SmolLM2 GGUF, and a synthetic llama-7B-shaped sparse GGUF made here):
  * bytes each stage of S=3 needs (fraction of the file; aim <= 0.4 each);
  * fetch throughput of one stage (HTTPS + mutual TLS + per-piece SHA-256 + write) side by side
    with a plain TCP copy of the same byte ranges on the same path (sendfile -> recv_into + pwrite),
    and the ratio (aim >= 0.8x); `--rate` shapes host A's egress with tbf, as a real link would;
  * a fetch killed (SIGKILL) at 50 % and restarted (the link shaped so the stage takes about 4 s):
    bytes host B received twice, against one uninterrupted fetch (aim <= 5 %), two trials.
Needs root. Prints the load average: figures on a shared machine are noisy.

    .venv/bin/python bench/distribution.py --wan [--delay-ms 50] [--rate-mbit 100] [--stage 0] [--rounds 3] [--lanes 4]

Weights over a WAN link (issue 22: ">= 80 % of the link's rate at 50 ms one way, 100 Mbit/s"): the same two hosts,
every packet each sends the other delayed and rate-capped on arrival by the local pool's link shaping
(localcluster/linkshaping.py: NFQUEUE delayer, drop-tail buffer), SmolLM2's stage `--stage` of S=3 (stage 0: 54 MB)
fetched into a fresh cache per round. Printed per round: the fetch's rate as WEIGHTS_DOWNLOADED counts it (bytes
fetched / seconds from the acquire's start: manifest, header and pieces) and its share of the link, the seconds to
the manifest, the MB/s received per 0.5 s (the ramp), the TLS handshakes the model server made (the fetch's
connections), the bytes it sent, and a plain TCP copy of the same bytes over one fresh connection beside it; then
the median. Figures and ratios only: nothing is asserted.

    .venv/bin/python bench/distribution.py --from-source [--gib 4] [--rounds 1] [--lanes 4] [--no-warm]

Straight from the source beside from the orchestrator (issue 24: "three hosts fetching one 4 GB model from a URL:
>= 0.8x the server's rate each, none refetching a byte"). No root, loopback, every process on this machine's cores: a
sparse synthetic llama-shaped Q4_0 GGUF of about `--gib` GiB, served by one process (source-serve) three ways: the
orchestrator's model server (HTTPS, mutual TLS: the manifest always, and every piece for a host given no
source_url), a plain HTTP source (tests/fixtures/http_source.py, Range by sendfile) and an https source (a second
instance of the model server's code, standing in for an https URL). Each stage host is its own process
(source-fetch: a FetchPool, its own cache, `--lanes` connections) fetching its stage of S=3 from one origin: the
http URL or the https URL (FetchRequest.source_url), or the model server (no source_url: what a host does with
stages_fetch_from_source off). Printed:
  * the machine's cores, and its disk written as a fetch writes (rate; pwrite's CPU seconds per GiB);
  * the http source's single stream: one connection reading stage 1's ranges, bytes dropped (no TLS, hashing or
    writing), and the reader's CPU seconds per GiB;
  * one host alone (stage 1), then the three hosts at once (stages 0, 1, 2; `--rounds` times), from each origin in
    turn: per host its pieces' bytes, the raw rate (bytes / wall-clock seconds of its transfer: what happened here)
    against the single stream, its process's CPU seconds per GiB split into its connections' receiving (socket,
    TLS, HTTP) / SHA-256 / writing (pwrite) / the rest (recorder, event loop), a DERIVED rate (bytes / its CPU
    seconds, capped at the single stream: as if it had a core of its own), and the bytes it asked for twice; per
    phase the piece bytes each server sent, the serving process's CPU seconds per GiB (what one core of it would
    serve), and how busy the machine's cores were;
  * the three hosts from each URL beside the three from the model server (each origin's quickest round):
    raw and derived per host against the orchestrator's mean per host (aim >= 0.8x each) and host by host, the
    aggregate rates, whether any host asked for a byte twice (aim: none), and the piece bytes the model server sent
    while the hosts fetched from a URL (aim: none).
On the 2-core dev host the hosts and the servers share two cores: the raw per-host rates are bounded by CPU (TLS,
SHA-256, pwrite), not by the source; the derived rates say what the same work would do on cores of its own. Before
each phase a scratch file of the phase's size is written and deleted (`warm_pages`): on this VM pwrite into guest
pages it has not touched lately costs several times more CPU (virtio-balloon free page reporting), which otherwise
makes the write share of a host's CPU vary 0.2-2.3 s/GiB from phase to phase; `--no-warm` measures without it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swactor.common import control_tls  # noqa: E402
from swactor.distribution.cache import WeightsCache  # noqa: E402
from swactor.distribution.fetcher import Target  # noqa: E402
from swactor.distribution.job import spans  # noqa: E402
from swactor.distribution.request import FetchRequest  # noqa: E402
from swactor.distribution.server import FileTable, ServedFile, start_server  # noqa: E402
from swactor.distribution.stagefetch import FetchPool  # noqa: E402
from swactor.modelfile import support  # noqa: E402
from swactor.modelfile.header import read_header  # noqa: E402
from swactor.modelfile.manifest import Manifest, build_manifest  # noqa: E402
from tests.fixtures.synth_gguf import Shape, write_gguf  # noqa: E402
from tests.harness import NetnsCluster, netns_unavailable_reason  # noqa: E402

SMOLLM = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SECRET = b"bench distribution secret 32 b.."
ORCH, NODE = 1, 2
PORT, PLAIN_PORT = 7442, 7443



def wait_ready(server: subprocess.Popen, what: str) -> dict:
    """The '{"ready"...}' line a bench server subprocess prints once it listens."""
    assert server.stdout is not None
    while not (line := server.stdout.readline()).startswith('{"ready"'):
        if not line:
            raise SystemExit(f"bench: {what} did not start")
    return json.loads(line)


def server_stats(server: subprocess.Popen) -> dict:
    """Ask a bench server subprocess for its counters (the 'stats' line on its stdin)."""
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write("stats\n")
    server.stdin.flush()
    while True:
        line = server.stdout.readline()
        if not line:
            raise SystemExit("bench: the server exited")
        if line.startswith('{"sent"'):
            return json.loads(line)

def header_of(path: Path):
    with open(path, "rb") as f:
        return read_header(lambda n: (f.seek(0), f.read(n))[1])[0]


def stage_pieces(m: Manifest, path: Path, k: int, s: int) -> list[int]:
    h = header_of(path)
    n = int(h.get(f"{h.get('general.architecture')}.block_count"))
    arch = support.ARCHITECTURES[str(h.get("general.architecture"))]
    return m.pieces_for(support.stage_tensors(arch, set(m.tensors), k * n // s, (k + 1) * n // s, n))


# ---- host A: the model server and a plain TCP server of the same bytes ----

def serve(path: Path, manifest_path: Path) -> None:
    m = Manifest.decode(manifest_path.read_bytes())
    files = FileTable()
    files.add(ServedFile(m.file_sha256, path, m.size, m.encode()))
    server, _ = start_server(f"0.0.0.0:{PORT}", files, control_tls.model_server_context(SECRET, ORCH))
    plain = socket.create_server(("0.0.0.0", PLAIN_PORT), reuse_port=True)
    plain_sent = [0]

    def plain_loop() -> None:
        while True:
            conn, _ = plain.accept()
            with conn, open(path, "rb") as f:
                want = json.loads(conn.makefile("r").readline())
                for start, end in want:
                    pos = start
                    while pos < end:
                        pos += os.sendfile(conn.fileno(), f.fileno(), pos, end - pos)
                    plain_sent[0] += end - start

    threading.Thread(target=plain_loop, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(json.dumps({"sent": files.bytes_served.get(m.file_sha256, 0), "plain": plain_sent[0],
                              "handshakes": server.handshakes}), flush=True)
    server.shutdown()


# ---- host B: a stage's fetch, and the plain copy ----

def fetch(url: str, m: Manifest, k: int, s: int, n_layers: int, cache: Path, lanes: int = 4) -> None:
    ctx = control_tls.model_client_context(SECRET, NODE)
    pool = FetchPool(WeightsCache(cache), lambda u, name: Target(u, ctx, name), progress_interval_s=0.05, lanes=lanes)
    req = FetchRequest(url, m.file_sha256, m.size, m.digest(), k * n_layers // s, (k + 1) * n_layers // s, n_layers,
                       control_tls.orchestrator_name(ORCH))

    def progress(p) -> None:
        print(json.dumps({"done": p.bytes_done, "total": p.bytes_total}), flush=True)

    started: list[float] = []
    entry_of = pool._entry
    manifest_at: list[float] = []

    async def timed_entry(r):  # when the manifest is in (and the cache file open)
        try:
            return await entry_of(r)
        finally:
            manifest_at.append(time.monotonic())

    pool._entry = timed_entry  # type: ignore[method-assign]
    timeline: list[int] = []  # bytes received by the end of each 0.1 s since the start
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1 - (time.monotonic() - t0) % 0.1):
            timeline.append(pool.received_bytes)

    t0 = time.monotonic()
    threading.Thread(target=sample, daemon=True).start()
    lease = asyncio.run(pool.acquire(req, lambda s: started.append(time.monotonic()), progress))
    end = time.monotonic()
    stop.set()
    header = m.header_bytes
    # transfer: from the moment the stage's pieces are known (manifest, header fetched and parsed) to the end
    print(json.dumps({"fetched": lease.bytes_fetched, "total": lease.bytes_total, "seconds": end - t0,
                      "manifest_s": manifest_at[0] - t0, "transfer_bytes": lease.bytes_fetched - header,
                      "transfer_s": end - started[0], "timeline": timeline}), flush=True)


def plain(addr: str, ranges: list[tuple[int, int]], out: Path) -> None:
    t0 = time.monotonic()
    total = 0
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with socket.create_connection((addr, PLAIN_PORT)) as sock:
        sock.sendall((json.dumps(ranges) + "\n").encode())
        for start, end in ranges:
            pos = start
            while pos < end:
                n = sock.recv_into(view[:min(len(buf), end - pos)])
                if not n:
                    raise SystemExit("plain copy: connection closed early")
                os.pwrite(fd, view[:n], pos)
                pos += n
                total += n
    os.close(fd)
    print(json.dumps({"bytes": total, "seconds": time.monotonic() - t0}), flush=True)


# ---- the bench ----

def last_json(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=900)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench child failed ({proc.returncode}): {err[-2000:]}")
    return json.loads(lines[-1])


def spawn(host, argv: list[str], **kw) -> subprocess.Popen:
    """`argv` inside the host's namespace, text pipes; the cluster kills it on exit if still running."""
    proc = subprocess.Popen(["ip", "netns", "exec", host.ns, *argv], text=True, start_new_session=True, **kw)
    host.processes.append(proc)
    return proc


class Bench:
    def __init__(self, net: NetnsCluster, work: Path, rate: str) -> None:
        self.net, self.work, self.rate = net, work, rate
        self.a, self.b = net.hosts

    def py(self, *args: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), *args]

    def model(self, name: str, path: Path, rounds: int) -> None:
        t0 = time.monotonic()
        m = build_manifest(path, header_of(path))
        print(f"\n== {name}: {m.size / 1e9:.2f} GB, {len(m.pieces)} pieces of <= {m.piece_bytes >> 10} KiB "
              f"(manifest {len(m.encode()) >> 10} KiB, built in {time.monotonic() - t0:.1f} s)")
        man = self.work / "manifest.json"
        man.write_bytes(m.encode())
        h = header_of(path)
        n = int(h.get(f"{h.get('general.architecture')}.block_count"))
        fracs = []
        for k in range(3):
            b = sum(m.pieces[i].length for i in stage_pieces(m, path, k, 3))
            fracs.append(b / m.size)
        print("bytes per stage at S=3: " + ", ".join(f"stage {k} {f:.3f}" for k, f in enumerate(fracs))
              + "  (aim <= 0.4 each)")
        server = spawn(self.a, self.py("serve", str(path), str(man)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
        assert server.stdout is not None and server.stdin is not None
        while not server.stdout.readline().startswith('{"ready"'):
            pass
        url = f"https://{self.a.addr}:{PORT}/v1/files/{m.file_sha256}"

        def stats() -> dict:
            server.stdin.write("stats\n")
            server.stdin.flush()
            while True:  # the server's log lines share its stdout
                line = server.stdout.readline()
                if line.startswith('{"sent"'):
                    return json.loads(line)

        try:
            k = min(range(3), key=lambda i: fracs[i]) if len(set(fracs)) > 1 else 1
            ranges = [(s, e) for s, e, _ in spans(m, stage_pieces(m, path, k, 3))]
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache warm
            fetch_rates, plain_rates, setup = [], [], []
            for _ in range(rounds):
                cache = self.work / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                r = last_json(spawn(self.b, self.py("fetch", url, str(man), str(k), "3", str(n), str(cache)),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE))
                fetch_rates.append(r["transfer_bytes"] / r["transfer_s"])
                setup.append(r["seconds"] - r["transfer_s"])
                body = [r for r in ranges if r[0] >= m.header_bytes]  # the same bytes the fetch's transfer moves
                p = last_json(spawn(self.b, self.py("plain", self.a.addr, json.dumps(body), str(self.work / "plain")),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE))
                plain_rates.append(p["bytes"] / p["seconds"])
            fb, pb = max(fetch_rates), max(plain_rates)
            print(f"stage {k} of 3 ({r['total'] / 1e6:.1f} MB): fetch {fb / 1e6:.0f} MB/s vs plain TCP {pb / 1e6:.0f} MB/s"
                  f" -> {fb / pb:.2f}x (aim >= 0.8x; best of {rounds}: fetch "
                  f"{', '.join(f'{x / 1e6:.0f}' for x in fetch_rates)}, plain {', '.join(f'{x / 1e6:.0f}' for x in plain_rates)});"
                  f" before the transfer (TLS, manifest, header fetch + parse): {min(setup):.2f} s")
            # A link slow enough that the fetch is still running when it is killed at 50 %.
            want = sum(m.pieces[i].length for i in stage_pieces(m, path, k, 3))
            rate = max(8, min(2000, want * 8 // 4 // 1_000_000))  # about 4 s for the stage
            self.a.run(["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{rate}mbit",
                        "burst", "256kb", "latency", "50ms"])
            try:
                for trial in (1, 2):
                    self.kill_and_resume(url, man, m, path, k, n, stats, trial)
            finally:
                if self.rate:
                    self.a.run(["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", self.rate,
                                "burst", "256kb", "latency", "50ms"])
                else:
                    self.a.run(["tc", "qdisc", "del", "dev", "eth0", "root"])
        finally:
            server.terminate()
            server.wait(10)

    def rx(self) -> int:
        """Bytes host B's interface received (TLS and TCP overhead included)."""
        return int(self.b.run(["cat", "/sys/class/net/eth0/statistics/rx_bytes"]).strip())

    def fetch_proc(self, url: str, man: Path, k: int, n: int, cache: Path) -> subprocess.Popen:
        return spawn(self.b, self.py("fetch", url, str(man), str(k), "3", str(n), str(cache)),
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def kill_and_resume(self, url: str, man: Path, m: Manifest, path: Path, k: int, n: int, stats, trial: int) -> None:
        """Bytes that crossed into host B twice: (received before the kill + after the restart) minus
        what one uninterrupted fetch of the same stage receives, both measured on B's interface."""
        cache = self.work / "cache"
        want = sum(m.pieces[i].length for i in stage_pieces(m, path, k, 3))
        shutil.rmtree(cache, ignore_errors=True)
        rx0 = self.rx()
        last_json(self.fetch_proc(url, man, k, n, cache))
        clean = self.rx() - rx0
        shutil.rmtree(cache, ignore_errors=True)
        sent0, rx0 = stats()["sent"], self.rx()
        proc = self.fetch_proc(url, man, k, n, cache)
        assert proc.stdout is not None
        at = 0
        for line in proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a log line
            if "done" in doc and doc["done"] >= want // 2:
                at = doc["done"]
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(30)
        time.sleep(0.5)  # what was already on the wire still lands on B's interface
        first = self.rx() - rx0
        r = last_json(self.fetch_proc(url, man, k, n, cache))
        total = self.rx() - rx0
        sent = stats()["sent"] - sent0
        twice = total - clean
        print(f"kill at {at / want:.0%} (trial {trial}, link shaped to ~4 s for the stage): B received "
              f"{first / 1e6:.1f} MB before the kill, {(total - first) / 1e6:.1f} MB after (one clean fetch: "
              f"{clean / 1e6:.1f} MB); {twice / 1e6:.2f} MB twice = {twice / clean:.1%} (aim <= 5 %); the server "
              f"sent {sent / 1e6:.1f} MB for {want / 1e6:.1f} MB of ranges; resumed fetch {r['fetched'] / 1e6:.1f} MB")


# ---- straight from the source: a plain HTTP source, three stage hosts at once ----

CLK_TCK = os.sysconf("SC_CLK_TCK")
NO_SOURCE = "-"  # source-fetch's source_url argument for "no source_url: every piece from the model server"


def self_cpu() -> float:
    """CPU seconds this process has used so far: every thread, user + system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float:
    """CPU seconds another process has used so far (/proc/<pid>/stat: utime + stime, every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far, every core (/proc/stat; iowait counts as idle)."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (sum(v) - v[3] - v[4]) / CLK_TCK, sum(v) / CLK_TCK


def cores() -> str:
    usable = len(os.sched_getaffinity(0))
    return f"{os.cpu_count()} cores" + ("" if usable == os.cpu_count() else f" ({usable} usable by this process)")


def source_serve(path: Path, manifest_path: Path) -> None:
    """On loopback, in one process (the parent reads its CPU time per phase): the model server (the manifest, and
    every piece for a host told no source_url), the plain HTTP source, and an https source: a second instance of the
    model server's code (TLS as the model server does it: preadv + sendall, no sendfile) standing in for a URL such as
    https://huggingface.co/…, its pieces counted apart."""
    from tests.fixtures.http_source import HttpSource

    m = Manifest.decode(manifest_path.read_bytes())
    tables = {"server": FileTable(), "https": FileTable()}
    started = {}
    for name, files in tables.items():
        files.add(ServedFile(m.file_sha256, path, m.size, m.encode()))
        started[name] = start_server("127.0.0.1:0", files, control_tls.model_server_context(SECRET, ORCH))[0]
    src = HttpSource(path)
    print(json.dumps({"ready": True, "server": f"https://127.0.0.1:{started['server'].port}/v1/files/{m.file_sha256}",
                      "http": src.url(path.name),
                      "https": f"https://127.0.0.1:{started['https'].port}/v1/files/{m.file_sha256}"}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(json.dumps({"sent": True, "http": src.bytes_sent,
                              **{k: t.bytes_served.get(m.file_sha256, 0) for k, t in tables.items()}}), flush=True)
    src.close()
    for server in started.values():
        server.shutdown()


def source_fetch(url: str, source_url: str | None, m: Manifest, k: int, s: int, n_layers: int, cache: Path,
                 lanes: int) -> None:
    """One stage host: its stage's pieces from the source (or, source_url None, from the model server) over `lanes`
    connections, the ranges its connections asked for recorded, and its CPU time: the whole process's, and the
    thread time of its connections split into receiving (socket, TLS, HTTP: RangeClient.read_range outside the
    sink), SHA-256 (the hash objects PieceWriter makes, timed here by a stand-in for job.py's hashlib) and the rest
    of the sink (PieceWriter.write: pwrite into the cache file, bookkeeping)."""
    import hashlib
    import types

    from swactor.distribution import job
    from swactor.distribution.fetcher import RangeClient

    asked: list[tuple[int, int]] = []
    clients: list[Recording] = []
    hashed = [0.0]
    lock = threading.Lock()

    class TimedSha256:
        def __init__(self) -> None:
            self.h = hashlib.sha256()

        def update(self, data) -> None:
            t = time.thread_time()
            self.h.update(data)
            dt = time.thread_time() - t
            with lock:
                hashed[0] += dt

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    timed_hash = hasattr(job, "hashlib")
    if timed_hash:
        job.hashlib = types.SimpleNamespace(sha256=TimedSha256)  # type: ignore[attr-defined]

    class Recording(RangeClient):
        sink_cpu = read_cpu = 0.0  # this connection's thread: in the sink; in read_range outside the sink

        def read_range(self, start, end, sink) -> None:
            asked.append((start, end))

            def timed(chunk: memoryview) -> None:
                t = time.thread_time()
                try:
                    sink(chunk)
                finally:
                    self.sink_cpu += time.thread_time() - t

            t0, s0 = time.thread_time(), self.sink_cpu
            try:
                super().read_range(start, end, timed)
            finally:
                self.read_cpu += time.thread_time() - t0 - (self.sink_cpu - s0)

    def client(t: Target) -> Recording:
        c = Recording(t)
        clients.append(c)
        return c

    def split() -> tuple[float, float, float]:
        return sum(c.read_cpu for c in clients), sum(c.sink_cpu for c in clients), hashed[0]

    ctx = control_tls.model_client_context(SECRET, NODE + k)
    # The https source is the bench's own (source_serve): its certificate is the model server's, not one the default
    # trust store knows; a real https URL gets Target(url).
    tls_source = Target(source_url or "", ctx, control_tls.orchestrator_name(ORCH))
    pool = FetchPool(WeightsCache(cache), lambda u, name: Target(u, ctx, name), progress_interval_s=0.05,
                     client_factory=client, lanes=lanes,
                     source_target_for=lambda u: dataclasses.replace(tls_source, url=u) if u.startswith("https:")
                     else Target(u))
    req = FetchRequest(url, m.file_sha256, m.size, m.digest(), k * n_layers // s, (k + 1) * n_layers // s, n_layers,
                       control_tls.orchestrator_name(ORCH), source_url=source_url)
    mark: dict[str, float] = {}

    def started(_) -> None:  # the manifest and the header are in: the stage's pieces (the transfer) start
        mark["t"], mark["cpu"] = time.monotonic(), self_cpu()
        mark["read"], mark["sink"], mark["hash"] = split()

    t0, cpu0 = time.monotonic(), self_cpu()
    lease = asyncio.run(pool.acquire(req, started))
    end, cpu = time.monotonic(), self_cpu()
    read, sink, hash_ = split()
    union = reach = 0  # bytes asked for at least once
    for a, b in sorted(asked):
        if b > reach:
            union, reach = union + b - max(a, reach), b
    twice = sum(b - a for a, b in asked) - union
    print(json.dumps({"fetched": lease.bytes_fetched, "total": lease.bytes_total, "seconds": end - t0,
                      "received": pool.received_bytes, "asked_twice": twice,
                      "transfer_bytes": lease.bytes_fetched - m.header_bytes, "transfer_s": end - mark["t"],
                      "cpu_s": cpu - mark["cpu"], "cpu_all_s": cpu - cpu0, "read_cpu_s": read - mark["read"],
                      "sink_cpu_s": sink - mark["sink"], "hash_cpu_s": hash_ - mark["hash"] if timed_hash else None,
                      "connections": len(clients)}), flush=True)


def source_single(source_url: str, ranges: list[tuple[int, int]]) -> None:
    """The source's single-stream rate: one connection reading the ranges, bytes dropped."""
    from swactor.distribution.fetcher import RangeClient

    client = RangeClient(Target(source_url))
    total = 0

    def sink(chunk: memoryview) -> None:
        nonlocal total
        total += len(chunk)

    t0, cpu0 = time.monotonic(), self_cpu()
    for start, end in ranges:
        client.read_range(start, end, sink)
    print(json.dumps({"bytes": total, "seconds": time.monotonic() - t0, "cpu_s": self_cpu() - cpu0}), flush=True)
    client.close()


def disk_probe(work: Path, nbytes: int = 1 << 30) -> tuple[float, float]:
    """This disk as a fetch writes to it: pwrite 1 MiB at a time into a fresh sparse file, fdatasync every 8 MiB
    (the recorder's batches are at most 8 MiB). Returns (bytes/s, CPU seconds per GiB in pwrite: the copy into the
    page cache, which on this VM costs several times more when the pages are fresh to it)."""
    buf = bytes(1 << 20)
    path = work / "disk-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        in_pwrite = 0.0
        t0 = time.monotonic()
        for off in range(0, nbytes, len(buf)):
            c = time.thread_time()
            os.pwrite(fd, buf, off)
            in_pwrite += time.thread_time() - c
            if (off + len(buf)) % (8 << 20) == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        took = time.monotonic() - t0
    finally:
        os.close(fd)
        path.unlink()
    return nbytes / took, in_pwrite / (nbytes / GIB)


def warm_pages(work: Path, nbytes: int) -> float:
    """Write `nbytes` into a scratch file beside the caches and delete it (dirty pages dropped): the hosts' writes
    that follow land in page-cache pages this VM touched a moment ago. Pages it has not touched for a while
    (virtio-balloon free page reporting hands freed guest memory back to the hypervisor) cost several times
    more CPU on first touch, in pwrite's copy, and that cost comes and goes with what ran seconds before: without
    this the write share of a host's CPU varies 0.2-2.3 s/GiB from one phase to the next. A host that has run a
    while, its page cache full, takes its pages from reclaimed cache instead. Returns the scratch's pwrite CPU
    seconds per GiB (the cost it absorbed)."""
    buf = bytes(8 << 20)
    path = work / "warm-scratch"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    in_pwrite = 0.0
    try:
        for off in range(0, nbytes, len(buf)):
            c = time.thread_time()
            os.pwrite(fd, buf, off)
            in_pwrite += time.thread_time() - c
    finally:
        os.close(fd)
        path.unlink()
    return in_pwrite / max(nbytes / GIB, 1e-9)


GIB = 2**30
# where the three hosts' pieces come from: key (as source_serve counts it) -> (label, the server, how it serves)
ORIGINS = {"http": ("URL http", "the http source", "plain HTTP, sendfile"),
           "https": ("URL https", "the https source", "TLS, the model server's code"),
           "server": ("orchestrator", "the model server", "HTTPS, mutual TLS")}


def rate_of(r: dict) -> float:
    return r["transfer_bytes"] / r["transfer_s"]


def from_source(gib: float, rounds: int, lanes: int, warm: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="swdist-src-") as tmp:
        work = Path(tmp)
        # llama-7B's shape (Q4_0, untied: ~113 MB a block, ~147 MB of embeddings), blocks a multiple of 3
        layers = max(3, round((gib * 2**30 - 147e6) / 113e6 / 3) * 3)
        shape = Shape(layers=layers, dim=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32)
        t0 = time.monotonic()
        path = write_gguf(work / "big.gguf", shape, qtype="Q4_0", tied=False, sparse=True)
        t1 = time.monotonic()
        m = build_manifest(path, header_of(path))
        t2 = time.monotonic()
        print(f"synthetic sparse GGUF: {m.size / 2**30:.2f} GiB, {layers} blocks, written in {t1 - t0:.1f} s "
              f"({path.stat().st_blocks * 512 >> 20} MiB on disk); manifest {len(m.pieces)} pieces of <= "
              f"{m.piece_bytes >> 10} KiB in {t2 - t1:.1f} s")
        man = work / "manifest.json"
        man.write_bytes(m.encode())
        disk, disk_cpu = disk_probe(work)
        print(f"machine: {cores()}, shared by every process below (the source, the model server, the hosts); one "
              f"disk: {disk / 1e6:.0f} MB/s (1 GiB, pwrite 1 MiB at a time, fdatasync every 8 MiB; pwrite "
              f"{disk_cpu:.2f} CPU s/GiB)")
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache warm (holes: free)
        server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "source-serve", str(path), str(man)],
                                  text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert server.stdout is not None and server.stdin is not None
        try:
            where = wait_ready(server, "the source server")

            def stats() -> dict:
                return server_stats(server)

            py = [sys.executable, str(Path(__file__).resolve())]

            def phase(stages: list[int], source: str | None) -> dict:
                """These stages' hosts fetching at once, from the source (or the model server), caches empty."""
                for k in stages:
                    shutil.rmtree(work / f"host{k}", ignore_errors=True)
                os.sync()  # the last phase's writes are not this one's to wait for
                cold = warm_pages(work, int(sum(need[k] for k in stages) * 1.1)) if warm else None
                before, srv0, (busy0, all0) = stats(), proc_cpu(server.pid), machine_cpu()
                t0 = time.monotonic()
                hosts = [subprocess.Popen([*py, "source-fetch", where["server"], source or NO_SOURCE, str(man), str(k),
                                           "3", str(layers), str(work / f"host{k}"), str(lanes)], text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in stages]
                results = [last_json(h) for h in hosts]
                wall = time.monotonic() - t0
                after, srv1, (busy1, all1) = stats(), proc_cpu(server.pid), machine_cpu()
                for k in stages:
                    shutil.rmtree(work / f"host{k}", ignore_errors=True)
                return {"hosts": results, "wall": wall, "cold": cold, "server_cpu": srv1 - srv0,
                        "busy": (busy1 - busy0) / (all1 - all0), "sent": {k: after[k] - before[k] for k in ORIGINS}}

            need = [sum(m.pieces[i].length for i in stage_pieces(m, path, k, 3)) for k in range(3)]
            body = [(a, b) for a, b, _ in spans(m, stage_pieces(m, path, 1, 3)) if a >= m.header_bytes]
            single = last_json(subprocess.Popen([*py, "source-single", where["http"], json.dumps(body)], text=True,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            one = single["bytes"] / single["seconds"]
            print(f"source single stream (one connection, plain HTTP, stage 1's {single['bytes'] / 1e9:.2f} GB, bytes "
                  f"dropped: no TLS, no hashing, no writing): {one / 1e6:.0f} MB/s, the reader "
                  f"{single['cpu_s'] / (single['bytes'] / GIB):.2f} CPU s/GiB")
            print(f"\nPer host (its stage's pieces after the header; {lanes} connections, SHA-256 per piece, written in "
                  "place):\n  raw      = bytes / wall-clock seconds of its transfer: what happened here, on cores "
                  "shared with the other hosts and the servers;\n  CPU      = the fetching process's CPU seconds (every "
                  "thread) per GiB: its connections receiving (socket, TLS, HTTP), SHA-256, writing (pwrite into the "
                  "cache file), and the rest (the recorder's fdatasync and record, the event loop);\n  derived  = "
                  f"bytes / its CPU seconds, at most the single stream ({one / 1e6:.0f} MB/s): the rate were its CPU "
                  "work done on a core of its own, nothing else waiting (DERIVED, not measured; also not counting the "
                  "serving side's CPU, printed apart)."
                  + ("\nBefore each phase a scratch file of its size is written and deleted (warm_pages: the hosts "
                     "then write into guest pages as warm as a host that has run a while; --no-warm to skip)."
                     if warm else "\nNo warm-up (--no-warm): the hosts' pwrite CPU includes this VM's first touch "
                     "of pages it handed back to the hypervisor, and varies with what ran before."))

            def derived(r: dict) -> float:
                return min(one, r["transfer_bytes"] / max(r["cpu_s"], 1e-9))

            def host_line(r: dict) -> str:
                g = r["transfer_bytes"] / GIB
                rate = rate_of(r)
                hash_ = r["hash_cpu_s"]
                parts = [f"receive {r['read_cpu_s'] / g:.2f}"]
                if hash_ is None:
                    parts.append(f"SHA-256 + write {r['sink_cpu_s'] / g:.2f}")
                else:
                    parts += [f"SHA-256 {hash_ / g:.2f}", f"write {(r['sink_cpu_s'] - hash_) / g:.2f}"]
                parts.append(f"rest {(r['cpu_s'] - r['read_cpu_s'] - r['sink_cpu_s']) / g:.2f}")
                return (f"{r['total'] / 1e9:.2f} GB, raw {rate / 1e6:4.0f} MB/s ({rate / one:.2f}x the single stream) | "
                        f"CPU {r['cpu_s'] / g:.2f} s/GiB = {', '.join(parts)} | derived {derived(r) / 1e6:4.0f} MB/s "
                        f"({derived(r) / one:.2f}x) | asked twice {r['asked_twice']} B")

            def serving(p: dict, origin: str) -> str:
                sent = p["sent"][origin]
                others = ", ".join(f"{ORIGINS[k][1]} {n} B" for k, n in p["sent"].items() if k != origin)
                per = p["server_cpu"] / (sent / GIB) if sent else 0.0
                one_core = sent / p["server_cpu"] if p["server_cpu"] else 0.0
                warmed = "" if p["cold"] is None else f"; the warm-up's pwrite {p['cold']:.2f} CPU s/GiB"
                return (f"{ORIGINS[origin][1]} ({ORIGINS[origin][2]}) sent {sent / 1e9:.3f} GB of pieces, {per:.2f} "
                        f"CPU s/GiB (one core of it: {one_core / 1e6:.0f} MB/s), {others}; machine busy "
                        f"{p['busy']:.0%} of {os.cpu_count()} cores{warmed}")

            def url_of(origin: str) -> str | None:
                return None if origin == "server" else where[origin]

            print("\n== one host alone (stage 1)")
            alone = {}
            for origin, (name, _, _) in ORIGINS.items():
                p = alone[origin] = phase([1], url_of(origin))
                print(f"  {name:<12} {host_line(p['hosts'][0])}")
                print(f"  {'':<12} {serving(p, origin)}")
            a_orch = alone["server"]["hosts"][0]
            print("  " + "; ".join(f"{ORIGINS[o][0]} / orchestrator: raw {rate_of(alone[o]['hosts'][0]) / rate_of(a_orch):.2f}x, "
                                   f"derived {derived(alone[o]['hosts'][0]) / derived(a_orch):.2f}x" for o in ("http", "https")))

            runs: dict[str, list[dict]] = {origin: [] for origin in ORIGINS}
            for rnd in range(rounds):
                print(f"\n== three hosts at once (stages 0, 1, 2 of 3)"
                      f"{f', round {rnd + 1} of {rounds}' if rounds > 1 else ''}")
                for origin, (name, _, _) in ORIGINS.items():
                    p = phase([0, 1, 2], url_of(origin))
                    runs[origin].append(p)
                    for k, r in enumerate(p["hosts"]):
                        print(f"  {name:<12} host {k}: {host_line(r)}")
                    print(f"  {name:<12} all three: {sum(need) / 1e9:.2f} GB in {p['wall']:.1f} s "
                          f"({sum(need) / p['wall'] / 1e6:.0f} MB/s); {serving(p, origin)}")
            best = {origin: min(ps, key=lambda p: p["wall"]) for origin, ps in runs.items()}
            o = best["server"]
            twice = any(r["asked_twice"] for ps in runs.values() for p in ps for r in p["hosts"])
            print(f"\n== three hosts from the URL beside the same three from the orchestrator's model server"
                  f"{f' (each origin: the quickest of its {rounds} rounds, all three)' if rounds > 1 else ''}")
            for label, fn in (("raw", rate_of), ("derived", derived)):
                orr = [fn(r) for r in o["hosts"]]
                mean = sum(orr) / len(orr)  # the server's rate per host (which host got more of the shared cores: noise)
                print(f"  {label:<7} MB/s per host: orchestrator {' / '.join(f'{x / 1e6:.0f}' for x in orr)} "
                      f"(mean {mean / 1e6:.0f})")
                for origin in ("http", "https"):
                    ur = [fn(r) for r in best[origin]["hosts"]]
                    ratios = [x / mean for x in ur]
                    print(f"  {label:<7} MB/s per host: {ORIGINS[origin][0]:<9} {' / '.join(f'{x / 1e6:.0f}' for x in ur)}"
                          f" = {' / '.join(f'{x:.2f}' for x in ratios)}x the orchestrator's mean per host (aim >= 0.8x "
                          f"each: {'met' if min(ratios) >= 0.8 else 'not met'}; host by host "
                          f"{' / '.join(f'{a / b:.2f}' for a, b in zip(ur, orr, strict=True))}x), "
                          f"{' / '.join(f'{x / one:.2f}' for x in ur)}x the single stream")
            print("  all three together: " + ", ".join(
                f"{ORIGINS[k][0]} {sum(need) / p['wall'] / 1e6:.0f} MB/s" for k, p in best.items())
                + f"; a byte asked twice by any host: {'yes' if twice else 'none'}; piece bytes through the model server "
                  f"while the hosts fetched from a URL: {sum(p['sent']['server'] for k in ('http', 'https') for p in runs[k])}")
        finally:
            server.stdin.close()
            server.terminate()
            server.wait(10)


# ---- over a WAN link: a stage's fetch at a one-way delay and a rate cap (issue 22) ----

def wan(delay_ms: float, rate_mbit: float, rounds: int, lanes: int, stage: int) -> None:
    """Two hosts whose every packet to the other is delayed and rate-capped on arrival (localcluster/linkshaping.py,
    the local pool's shaped link: NFQUEUE delayer with a drop-tail buffer); one stage of SmolLM2 at S=3 fetched
    from a fresh cache, beside a plain TCP copy of the same bytes on one fresh connection."""
    from swactor.localcluster.linkconditions import LinkConditions
    from swactor.localcluster.linkshaping import LinkShaping, ShapedHost

    if not SMOLLM.exists():
        raise SystemExit(f"bench/distribution.py --wan: needs {SMOLLM}")
    links = LinkConditions(delay_ms=delay_ms, rate_mbit=rate_mbit)
    link_mb_s = rate_mbit / 8
    with tempfile.TemporaryDirectory(prefix="swdist-") as tmp, NetnsCluster(2, prefix="dist") as net:
        work = Path(tmp)
        a, b = net.hosts
        shaping = LinkShaping(links, [ShapedHost("A", a.ns, work / "A"), ShapedHost("B", b.ns, work / "B")])
        try:
            shaping.apply()
            m = build_manifest(SMOLLM, header_of(SMOLLM))
            man = work / "manifest.json"
            man.write_bytes(m.encode())
            h = header_of(SMOLLM)
            n = int(h.get(f"{h.get('general.architecture')}.block_count"))
            pieces = stage_pieces(m, SMOLLM, stage, 3)
            want = sum(m.pieces[i].length for i in pieces)
            ranges = [(x, y) for x, y, _ in spans(m, sorted(set(pieces) | set(range(m.header_pieces))))]
            print(f"link: {links.describe()} = {link_mb_s:.2f} MB/s; stage {stage} of 3 of SmolLM2: "
                  f"{want / 1e6:.1f} MB (the header's {m.header_bytes / 1e6:.2f} MB among them), manifest "
                  f"{len(m.encode()) / 1e3:.0f} kB, {lanes} lanes", flush=True)
            server = spawn(a, [sys.executable, str(Path(__file__).resolve()), "serve", str(SMOLLM), str(man)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert server.stdout is not None and server.stdin is not None
            wait_ready(server, "the model server")

            def stats() -> dict:
                return server_stats(server)

            url = f"https://{a.addr}:{PORT}/v1/files/{m.file_sha256}"
            py = [sys.executable, str(Path(__file__).resolve())]
            rows = []
            for r in range(rounds):
                cache = work / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                before = stats()
                f = last_json(spawn(b, [*py, "fetch", url, str(man), str(stage), "3", str(n), str(cache), str(lanes)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE))
                after = stats()
                p = last_json(spawn(b, [*py, "plain", a.addr, json.dumps(ranges), str(work / "plain")],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE))
                row = {"fetch_mb_s": f["fetched"] / 1e6 / f["seconds"], "fetch_s": f["seconds"],
                       "after_manifest_mb_s": f["fetched"] / 1e6 / (f["seconds"] - f["manifest_s"]),
                       "manifest_s": f["manifest_s"], "fetched": f["fetched"],
                       "handshakes": after["handshakes"] - before["handshakes"],
                       "asked": after["sent"] - before["sent"], "plain_mb_s": p["bytes"] / 1e6 / p["seconds"]}
                rows.append(row)
                tl = f["timeline"]
                per_half = [(b - a) / 1e6 / 0.5 for a, b in itertools.pairwise([0, *tl[4::5]])]
                print(f"  round {r + 1}: fetch {row['fetch_mb_s']:.2f} MB/s ({row['fetch_mb_s'] / link_mb_s:.1%} of the "
                      f"link; {row['fetched'] / 1e6:.1f} MB in {row['fetch_s']:.2f} s: the manifest {row['manifest_s']:.2f} "
                      f"s, then {row['after_manifest_mb_s']:.2f} MB/s); {row['handshakes']} TLS handshakes; the server "
                      f"sent {row['asked'] / 1e6:.1f} MB; plain TCP, one fresh connection, same bytes: "
                      f"{row['plain_mb_s']:.2f} MB/s ({row['plain_mb_s'] / link_mb_s:.0%})\n"
                      f"    MB/s received per 0.5 s: " + " ".join(f"{x:.1f}" for x in per_half), flush=True)
            med = statistics.median(x["fetch_mb_s"] for x in rows)
            pmed = statistics.median(x["plain_mb_s"] for x in rows)
            print(f"weights fetch over one-way {delay_ms:g} ms, {rate_mbit:g} Mbit/s ({link_mb_s:.2f} MB/s): median of "
                  f"{rounds} {med:.2f} MB/s = {med / link_mb_s:.1%} of the link (aim >= 80 %), {med / pmed:.2f}x the "
                  f"plain TCP copy ({pmed:.2f} MB/s = {pmed / link_mb_s:.0%}); every round: "
                  + ", ".join(f"{x['fetch_mb_s']:.2f}" for x in rows) + " MB/s")
            server.stdin.close()
            server.terminate()
            server.wait(10)
        finally:
            shaping.remove()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("source-serve", "source-fetch", "source-single"):
        cmd, args = sys.argv[1], sys.argv[2:]
        if cmd == "source-serve":
            source_serve(Path(args[0]), Path(args[1]))
        elif cmd == "source-fetch":
            m = Manifest.decode(Path(args[2]).read_bytes())
            source_fetch(args[0], None if args[1] == NO_SOURCE else args[1], m, int(args[3]), int(args[4]),
                         int(args[5]), Path(args[6]), int(args[7]))
        else:
            source_single(args[0], [tuple(r) for r in json.loads(args[1])])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] in ("serve", "fetch", "plain"):
        cmd, args = sys.argv[1], sys.argv[2:]
        if cmd == "serve":
            serve(Path(args[0]), Path(args[1]))
        elif cmd == "fetch":
            m = Manifest.decode(Path(args[1]).read_bytes())
            fetch(args[0], m, int(args[2]), int(args[3]), int(args[4]), Path(args[5]), *map(int, args[6:7]))
        else:
            plain(args[0], [tuple(r) for r in json.loads(args[1])], Path(args[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="", help="shape host A's egress with tbf (e.g. 1gbit); default: unshaped")
    ap.add_argument("--big-gib", type=float, default=3.6, help="size class of the synthetic model (llama-7B shape)")
    ap.add_argument("--no-big", action="store_true", help="skip the synthetic multi-GB model")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per measurement (default 3; --from-source: rounds of the three-host pair, default 1)")
    ap.add_argument("--from-source", action="store_true",
                    help="three stage hosts at once from a URL (http, https) beside from the model server "
                         "(loopback, no root)")
    ap.add_argument("--gib", type=float, default=4.0, help="--from-source: size of the synthetic model")
    ap.add_argument("--lanes", type=int, default=4,
                    help="--from-source, --wan: connections per host (FetchPool lanes; [worker].weights_connections "
                         "is 4)")
    ap.add_argument("--no-warm", action="store_true",
                    help="--from-source: no scratch write before each phase (the hosts write into cold guest pages)")
    ap.add_argument("--wan", action="store_true",
                    help="one stage of SmolLM2 over a shaped link (--delay-ms one way, --rate-mbit), beside plain TCP")
    ap.add_argument("--delay-ms", type=float, default=50.0, help="--wan: one-way delay between the two hosts")
    ap.add_argument("--rate-mbit", type=float, default=100.0, help="--wan: rate cap of each one-way path")
    ap.add_argument("--stage", type=int, default=0, help="--wan: which stage of S=3 (0: 54 MB, 1: 24 MB)")
    args = ap.parse_args()
    if args.wan:
        why = netns_unavailable_reason()
        if why:
            print(f"bench/distribution.py: needs network namespaces: {why}", file=sys.stderr)
            return 2
        print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}, {os.cpu_count()} CPUs")
        wan(args.delay_ms, args.rate_mbit, args.rounds or 3, args.lanes, args.stage)
        print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
        return 0
    if args.from_source:
        print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}, {os.cpu_count()} CPUs")
        from_source(args.gib, max(1, args.rounds or 1), args.lanes, not args.no_warm)
        print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
        return 0
    why = netns_unavailable_reason()
    if why:
        print(f"bench/distribution.py: needs network namespaces: {why}", file=sys.stderr)
        return 2
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}, {os.cpu_count()} CPUs")
    args.rounds = args.rounds or 3
    with tempfile.TemporaryDirectory(prefix="swdist-") as tmp, NetnsCluster(2, prefix="dist") as net:
        work = Path(tmp)
        if args.rate:
            net.hosts[0].run(["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", args.rate,
                              "burst", "256kb", "latency", "50ms"])
            print(f"host A egress shaped to {args.rate} (tbf)")
        bench = Bench(net, work, args.rate)
        if SMOLLM.exists():
            bench.model("SmolLM2-135M-Instruct Q4_1 (real)", SMOLLM, args.rounds)
        if not args.no_big:
            scale = max(0.1, args.big_gib / 3.6)
            shape = Shape(layers=32, dim=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32)
            if scale < 1:
                shape = Shape(layers=max(3, int(32 * scale)), dim=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32)
            t0 = time.monotonic()
            big = write_gguf(work / "big.gguf", shape, qtype="Q4_0", tied=False, sparse=True)
            print(f"\nsynthetic sparse GGUF: {big.stat().st_size / 2**30:.2f} GiB in {time.monotonic() - t0:.1f} s "
                  f"({big.stat().st_blocks * 512 >> 20} MiB on disk)")
            bench.model("synthetic llama-7B-shaped Q4_0 (sparse)", big, max(1, args.rounds - 1))
    print(f"\nload average after: {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
