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

    .venv/bin/python bench/distribution.py --from-source [--gib 4]

Straight from the source (no root, loopback): a sparse synthetic llama-shaped GGUF of about `--gib` GiB served
by a plain HTTP server (tests/fixtures/http_source.py, Range by sendfile) in its own process, the manifest by the
model server; first one plain single-stream read of a stage's ranges (no hashing, no writing: the source's rate), one
stage host alone, then three stage hosts (three processes, three FetchPools, three caches) fetching their stages of S=3 from the
source at once. Printed: each host's rate beside the single-stream rate (aim >= 0.8x each), and whether any host
asked for a byte twice (aim: none) or the model server sent any piece (aim: none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
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
            print(json.dumps({"sent": files.bytes_served.get(m.file_sha256, 0), "plain": plain_sent[0]}), flush=True)
    server.shutdown()


# ---- host B: a stage's fetch, and the plain copy ----

def fetch(url: str, m: Manifest, k: int, s: int, n_layers: int, cache: Path) -> None:
    ctx = control_tls.model_client_context(SECRET, NODE)
    pool = FetchPool(WeightsCache(cache), lambda u, name: Target(u, ctx, name), progress_interval_s=0.05)
    req = FetchRequest(url, m.file_sha256, m.size, m.digest(), k * n_layers // s, (k + 1) * n_layers // s, n_layers,
                       control_tls.orchestrator_name(ORCH))

    def progress(p) -> None:
        print(json.dumps({"done": p.bytes_done, "total": p.bytes_total}), flush=True)

    started: list[float] = []
    t0 = time.monotonic()
    lease = asyncio.run(pool.acquire(req, lambda s: started.append(time.monotonic()), progress))
    end = time.monotonic()
    header = m.header_bytes
    # transfer: from the moment the stage's pieces are known (manifest, header fetched and parsed) to the end
    print(json.dumps({"fetched": lease.bytes_fetched, "total": lease.bytes_total, "seconds": end - t0,
                      "transfer_bytes": lease.bytes_fetched - header, "transfer_s": end - started[0]}), flush=True)


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

def source_serve(path: Path, manifest_path: Path) -> None:
    """The model server (the manifest only, as for a URL source) and the plain HTTP source, on loopback."""
    from tests.fixtures.http_source import HttpSource

    m = Manifest.decode(manifest_path.read_bytes())
    files = FileTable()
    files.add(ServedFile(m.file_sha256, path, m.size, m.encode()))
    server, _ = start_server("127.0.0.1:0", files, control_tls.model_server_context(SECRET, ORCH))
    src = HttpSource(path)
    print(json.dumps({"ready": True, "server": f"https://127.0.0.1:{server.port}/v1/files/{m.file_sha256}",
                      "source": src.url(path.name)}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(json.dumps({"server_sent": files.bytes_served.get(m.file_sha256, 0), "source_sent": src.bytes_sent}),
                  flush=True)
    src.close()
    server.shutdown()


def source_fetch(url: str, source_url: str, m: Manifest, k: int, s: int, n_layers: int, cache: Path) -> None:
    """One stage host: its stage's pieces from the source, the ranges its connections asked for recorded."""
    from swactor.distribution.fetcher import RangeClient

    asked: list[tuple[int, int]] = []

    class Recording(RangeClient):
        def read_range(self, start, end, sink) -> None:
            asked.append((start, end))
            super().read_range(start, end, sink)

    ctx = control_tls.model_client_context(SECRET, NODE + k)
    pool = FetchPool(WeightsCache(cache), lambda u, name: Target(u, ctx, name), progress_interval_s=0.05,
                     client_factory=lambda t: Recording(t))
    req = FetchRequest(url, m.file_sha256, m.size, m.digest(), k * n_layers // s, (k + 1) * n_layers // s, n_layers,
                       control_tls.orchestrator_name(ORCH), source_url=source_url)
    started: list[float] = []
    t0 = time.monotonic()
    lease = asyncio.run(pool.acquire(req, lambda _: started.append(time.monotonic())))
    end = time.monotonic()
    union = reach = 0  # bytes asked for at least once
    for a, b in sorted(asked):
        if b > reach:
            union, reach = union + b - max(a, reach), b
    twice = sum(b - a for a, b in asked) - union
    print(json.dumps({"fetched": lease.bytes_fetched, "total": lease.bytes_total, "seconds": end - t0,
                      "received": pool.received_bytes, "asked_twice": twice,
                      "transfer_bytes": lease.bytes_fetched - m.header_bytes, "transfer_s": end - started[0]}),
          flush=True)


def source_single(source_url: str, ranges: list[tuple[int, int]]) -> None:
    """The source's single-stream rate: one connection reading the ranges, bytes dropped."""
    from swactor.distribution.fetcher import RangeClient

    client = RangeClient(Target(source_url))
    total = 0

    def sink(chunk: memoryview) -> None:
        nonlocal total
        total += len(chunk)

    t0 = time.monotonic()
    for start, end in ranges:
        client.read_range(start, end, sink)
    print(json.dumps({"bytes": total, "seconds": time.monotonic() - t0}), flush=True)
    client.close()


def from_source(gib: float) -> None:
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
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache warm (holes: free)
        server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "source-serve", str(path), str(man)],
                                  text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert server.stdout is not None and server.stdin is not None
        try:
            while not (line := server.stdout.readline()).startswith('{"ready"'):
                if not line:
                    raise SystemExit("bench: the source server did not start")
            where = json.loads(line)

            def stats() -> dict:
                server.stdin.write("stats\n")
                server.stdin.flush()
                while True:
                    line = server.stdout.readline()
                    if line.startswith('{"server_sent"'):
                        return json.loads(line)

            py = [sys.executable, str(Path(__file__).resolve())]
            need = [sum(m.pieces[i].length for i in stage_pieces(m, path, k, 3)) for k in range(3)]
            body = [(a, b) for a, b, _ in spans(m, stage_pieces(m, path, 1, 3)) if a >= m.header_bytes]
            single = last_json(subprocess.Popen([*py, "source-single", where["source"], json.dumps(body)], text=True,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            one = single["bytes"] / single["seconds"]
            print(f"source single stream (one connection, stage 1's {single['bytes'] / 1e9:.2f} GB, bytes dropped): "
                  f"{one / 1e6:.0f} MB/s")
            alone = last_json(subprocess.Popen([*py, "source-fetch", where["server"], where["source"], str(man), "1",
                                                "3", str(layers), str(work / "alone")], text=True,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            rate = alone["transfer_bytes"] / alone["transfer_s"]
            print(f"one host alone (stage 1, its fetch: 4 connections, SHA-256 per piece, written in place): "
                  f"{rate / 1e6:.0f} MB/s = {rate / one:.2f}x the single stream")
            shutil.rmtree(work / "alone")
            before = stats()
            t3 = time.monotonic()
            hosts = [subprocess.Popen([*py, "source-fetch", where["server"], where["source"], str(man), str(k), "3",
                                       str(layers), str(work / f"host{k}")], text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for k in range(3)]
            results = [last_json(h) for h in hosts]
            wall = time.monotonic() - t3
            after = stats()
            for k, r in enumerate(results):
                rate = r["transfer_bytes"] / r["transfer_s"]
                print(f"host {k} (stage {k} of 3, {r['total'] / 1e9:.2f} GB, {r['total'] / m.size:.2f} of the file): "
                      f"{rate / 1e6:.0f} MB/s = {rate / one:.2f}x the single stream (aim >= 0.8x); "
                      f"asked twice {r['asked_twice']} B, received {r['received'] / 1e6:.1f} MB for "
                      f"{r['fetched'] / 1e6:.1f} MB of pieces")
            sent = after["source_sent"] - before["source_sent"]
            print(f"three hosts at once: {sum(need) / 1e9:.2f} GB of stage pieces in {wall:.1f} s "
                  f"({sum(need) / wall / 1e6:.0f} MB/s together); the source sent {sent / 1e9:.3f} GB, the model server "
                  f"{after['server_sent'] - before['server_sent']} B of pieces; any byte fetched twice by one host: "
                  f"{'yes' if any(r['asked_twice'] for r in results) else 'no'}")
        finally:
            server.stdin.close()
            server.terminate()
            server.wait(10)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("source-serve", "source-fetch", "source-single"):
        cmd, args = sys.argv[1], sys.argv[2:]
        if cmd == "source-serve":
            source_serve(Path(args[0]), Path(args[1]))
        elif cmd == "source-fetch":
            m = Manifest.decode(Path(args[2]).read_bytes())
            source_fetch(args[0], args[1], m, int(args[3]), int(args[4]), int(args[5]), Path(args[6]))
        else:
            source_single(args[0], [tuple(r) for r in json.loads(args[1])])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] in ("serve", "fetch", "plain"):
        cmd, args = sys.argv[1], sys.argv[2:]
        if cmd == "serve":
            serve(Path(args[0]), Path(args[1]))
        elif cmd == "fetch":
            m = Manifest.decode(Path(args[1]).read_bytes())
            fetch(args[0], m, int(args[2]), int(args[3]), int(args[4]), Path(args[5]))
        else:
            plain(args[0], [tuple(r) for r in json.loads(args[1])], Path(args[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="", help="shape host A's egress with tbf (e.g. 1gbit); default: unshaped")
    ap.add_argument("--big-gib", type=float, default=3.6, help="size class of the synthetic model (llama-7B shape)")
    ap.add_argument("--no-big", action="store_true", help="skip the synthetic multi-GB model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--from-source", action="store_true",
                    help="three stage hosts fetching from a plain HTTP source at once (loopback, no root)")
    ap.add_argument("--gib", type=float, default=4.0, help="--from-source: size of the synthetic model")
    args = ap.parse_args()
    if args.from_source:
        print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}, {os.cpu_count()} CPUs")
        from_source(args.gib)
        print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
        return 0
    why = netns_unavailable_reason()
    if why:
        print(f"bench/distribution.py: needs network namespaces: {why}", file=sys.stderr)
        return 2
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}, {os.cpu_count()} CPUs")
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
