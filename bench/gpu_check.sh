#!/usr/bin/env bash
# GPU check: does the CUDA path give the CPU's tokens, and how fast, on a fresh GPU host with no network.
#
#   bash bench/gpu_check.sh prepare          here, with PyPI: fills .cache/gpu-check/ (~51 MiB) with the wheels the
#                                            check needs for Python $GPU_CHECK_PYVER (default 3.12) except those in
#                                            $GPU_CHECK_HAVE (default "numpy": the GPU image has it; set it empty for a
#                                            bare host), swactor's own wheel (gRPC stubs inside), a small model
#                                            (SmolLM2's first 6 blocks, 31 MiB) and the CPU run's results (cpu.json)
#   bash bench/gpu_check.sh [--device CUDA]  on the GPU host, .cache/gpu-check carried: unpacks the wheels into
#                                            /tmp/swactor-gpu-check (no pip needed), runs bench/worker.py and an S=2
#                                            local pool (bench/pipeline.py) on the device, prints tok/s and whether
#                                            the tokens equal the CPU run's
#   bash bench/gpu_check.sh --device CPU     the same on CPU (or GPU_CHECK_DEVICE=CPU): how the script is tested here
#   bash bench/gpu_check.sh exec CMD...      CMD in the repo root with the same set-up (wheels, libraries, a device
#                                            that runs; $PY is the Python), e.g. '"$PY" bench/pipeline.py --device CUDA'
#
# With the device tool: carry [".cache/gpu-check"], command `bash bench/gpu_check.sh`, timeout_s ~540; results land in
# $OUT (else bench/out/gpu_check). Other knobs: GPU_CHECK_PYTHON (default: the repo's .venv if there is one, else
# python3; a bare python3.12 here exercises the wheel path), GPU_CHECK_MODEL, GPU_CHECK_DIR.
# Exit: 0 tokens equal, 3 tokens unequal (a near-tie may flip on another device: see the printed step), else a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${GPU_CHECK_DIR:-$ROOT/.cache/gpu-check}"
DEVICE="${GPU_CHECK_DEVICE:-CUDA}"
PY="${GPU_CHECK_PYTHON:-python3}"
[ -n "${GPU_CHECK_PYTHON:-}" ] || [ ! -x "$ROOT/.venv/bin/python" ] || PY="$ROOT/.venv/bin/python"  # a dev checkout: its venv
MODE=run
while [ $# -gt 0 ]; do
    case "$1" in
        prepare) MODE=prepare ;;
        --device) DEVICE="$2"; shift ;;
        --device=*) DEVICE="${1#--device=}" ;;
        exec) MODE=exec; shift; break ;;
        *) echo "usage: bash bench/gpu_check.sh [--device CUDA|CPU] [prepare | exec CMD...]" >&2; exit 2 ;;
    esac
    shift
done
MODEL="${GPU_CHECK_MODEL:-$DIR/model.gguf}"
RES="${OUT:-$ROOT/bench/out/gpu_check}"

# What the carried swactor wheel was built from: a digest of the services' sources (generated stubs aside)
source_digest() { (cd "$ROOT" && find services -name '*.py' ! -name '*_pb2*.py' -print0 | LC_ALL=C sort -z | xargs -0 cat | sha256sum | cut -c1-16); }
say() { printf '[gpu_check] %s\n' "$*" >&2; }
die() { printf '[gpu_check] error: %s\n' "$*" >&2; exit 1; }

prepare() {
    local venv="$ROOT/.venv/bin/python" pyver="${GPU_CHECK_PYVER:-3.12}" have="${GPU_CHECK_HAVE-numpy}"
    [ -x "$venv" ] || die "prepare needs the dev venv (bash install.sh dev)"
    rm -rf "$DIR/wheels" && mkdir -p "$DIR/wheels"
    say "swactor wheel (with the generated gRPC stubs) and the ring-rs wheel"
    local stray=1; [ -e "$ROOT/build" ] && stray=0  # setuptools leaves build/ in the tree: remove it unless it was there
    "$venv" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR/wheels" "$ROOT"
    [ "$stray" = 0 ] || rm -rf "$ROOT/build"
    cp "$ROOT"/dist/ring/swactor_ring-*.whl "$DIR/wheels/" || die "no ring-rs wheel in dist/ring (bash install.sh dev)"
    # swactor's runtime dependencies, closed over, at the versions this venv runs
    local pins
    pins="$("$venv" - "$have" "$pyver" <<'PY'
import sys
from importlib import metadata
from packaging.requirements import Requirement
skip, env, seen, todo = {s.lower() for s in sys.argv[1].replace(",", " ").split()}, {"python_version": sys.argv[2], "extra": ""}, {}, ["swactor"]
while todo:
    for spec in metadata.requires(todo.pop()) or []:
        req = Requirement(spec)
        dep = req.name.lower().replace("_", "-")
        if (req.marker is None or req.marker.evaluate(env)) and dep not in seen and dep not in skip:
            try:  # the version this venv runs, else (a dependency only the target's Python needs) the newest that fits
                seen[dep] = f"{dep}=={metadata.version(dep)}"
                todo.append(dep)
            except metadata.PackageNotFoundError:
                seen[dep] = f"{dep}{req.specifier}"
print("\n".join(sorted(seen.values())))
PY
)"
    local plat=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64
                --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64)
    for pin in $pins; do
        "$venv" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp "${plat[@]}" \
            -d "$DIR/wheels" "$pin" 2>/dev/null \
          || "$venv" -m pip wheel -q --no-deps -w "$DIR/wheels" "$pin" \
          || die "no wheel for $pin"  # a source-only package: built here (pure Python ones only)
    done
    echo "$pyver" > "$DIR/wheels/PYTHON_VERSION"
    source_digest > "$DIR/wheels/SOURCE"
    say "small model"
    (cd "$ROOT" && "$venv" -c "import sys; from tests.fixtures.gguf_fixtures import build_small; build_small(sys.argv[1])" "$DIR/model.gguf.new")
    mv "$DIR/model.gguf.new" "$MODEL"
    say "the CPU run the device is compared with"
    GPU_CHECK_PYTHON="$venv" GPU_CHECK_DEVICE=CPU OUT="$DIR/cpu" bash "$ROOT/bench/gpu_check.sh"
    cp "$DIR/cpu/gpu_check.json" "$DIR/cpu.json" && rm -rf "$DIR/cpu"
    say "$DIR: $(du -sh "$DIR" | cut -f1) (the device tool carries at most 64 MiB with the repo)"
}

use_wheels() {
    # Unpack the carried wheels into a site dir on PYTHONPATH: no pip or index needed on the host.
    local want have site
    want="$(cat "$DIR/wheels/PYTHON_VERSION")"
    have="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    [ "$want" = "$have" ] || die "the wheels in $DIR are for Python $want, $PY is $have (prepare with GPU_CHECK_PYVER=$have)"
    site="/tmp/swactor-gpu-check/site-$(cat "$DIR"/wheels/*.whl | sha256sum | cut -c1-12)"
    if [ ! -d "$site" ]; then
        say "unpacking $(ls "$DIR"/wheels/*.whl | wc -l) wheels into $site"
        "$PY" - "$site.part" "$DIR"/wheels/*.whl <<'PY'
import pathlib, shutil, sys, zipfile
site = pathlib.Path(sys.argv[1])
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
for data in site.glob("*.data"):  # a wheel's purelib/platlib files belong in the site dir itself
    for sub in ("purelib", "platlib"):
        if (data / sub).is_dir():
            shutil.copytree(data / sub, site, dirs_exist_ok=True)
PY
        mv "$site.part" "$site"
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}

setup() {  # the carried wheels on PYTHONPATH, the device's libraries found, tinygrad running on $DEVICE
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || die "$PY is not Python >= 3.11"
    if [ -f "$DIR/wheels/PYTHON_VERSION" ] && ! "$PY" -c "import swactor.v1.orchestrator_pb2" 2>/dev/null; then
        # The services run from the wheel, not from this tree: a wheel of other sources measures other code. A warning,
        # not an error: on the GPU host of 2026-12-04 the digests differed for a wheel built from this very tree
        # (cause not found: the device time was spent), and a refusal there would cost a lease.
        local built here; built="$(cat "$DIR/wheels/SOURCE" 2>/dev/null || echo none)"; here="$(source_digest)"
        [ "$built" = "$here" ] || say "WARNING: the swactor wheel in $DIR may be built from other sources than services/ here" \
            "(digests $built, $here): the run measures the wheel's code (bash bench/gpu_check.sh prepare)"
        use_wheels
    fi
    missing="$("$PY" - <<'PY'
import importlib.util
def has(m: str) -> bool:
    try:
        return importlib.util.find_spec(m) is not None
    except ModuleNotFoundError:
        return False
mods = ["numpy", "tinygrad", "gguf", "grpc", "google.protobuf", "aioquic", "structlog", "kinship", "cryptography",
        "swactor_ring", "swactor.v1.orchestrator_pb2"]
print(" ".join(m for m in mods if not has(m)))
PY
)"
    [ -z "$missing" ] || die "missing Python modules: $missing (bash bench/gpu_check.sh prepare; for numpy: GPU_CHECK_HAVE= ...)"
    [ -f "$MODEL" ] || die "no model at $MODEL (bash bench/gpu_check.sh prepare, or GPU_CHECK_MODEL=PATH)"
    mkdir -p "$RES"
    if [ "$DEVICE" != CPU ]; then
        # tinygrad looks for libcuda / libnvrtc in LD_LIBRARY_PATH and a few fixed dirs (not ldconfig's cache); it
        # compiles kernels with NVRTC when it finds libnvrtc, else emits PTX for the driver to load
        local dirs lib
        dirs="/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib"
        dirs="$dirs $(ldconfig -p 2>/dev/null | awk '/libcuda\.so|libnvrtc\.so/ {print $NF}' | xargs -r -n1 dirname | sort -u | tr '\n' ' ')"
        dirs="$dirs $("$PY" -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib")))' 2>/dev/null)"
        for lib in $dirs; do
            if compgen -G "$lib/libcuda.so*" >/dev/null || compgen -G "$lib/libnvrtc.so*" >/dev/null; then
                export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            fi
        done
        say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2; fi
    fi
    "$PY" -c "from tinygrad import Device, Tensor; d = Device['$DEVICE']; assert Tensor([1.0, 2.0], device='$DEVICE').sum().item() == 3.0
print(f'[gpu_check] device {d.device}, renderer {type(d.renderer).__name__}')" >&2 || die "tinygrad cannot run on $DEVICE"
}

run() {
    setup
    say "single stage: bench/worker.py --device $DEVICE"
    (cd "$ROOT" && PYTHONUNBUFFERED=1 "$PY" bench/worker.py --device "$DEVICE" --model "$MODEL" --llama-python /nonexistent --json) \
        2>&1 | tee "$RES/worker.log" || die "bench/worker.py failed (log: $RES/worker.log)"
    grep "^{\"tinygrad\"" "$RES/worker.log" | tail -1 > "$RES/worker.json"
    say "S=2 local pool: bench/pipeline.py --stages 2 --device $DEVICE"
    (cd "$ROOT" && PYTHONUNBUFFERED=1 "$PY" bench/pipeline.py --stages 2 --max-tokens 24 --device "$DEVICE" --model "$MODEL" \
        --loopback --png "" --json "$RES/pipeline.json") > "$RES/pipeline.log" 2>&1 || { tail -40 "$RES/pipeline.log" >&2; die "S=2 pool failed"; }
    grep -E "^S=2|^single process" "$RES/pipeline.log" >&2
    "$PY" - "$RES" "$DIR/cpu.json" "$DEVICE" <<'PY'
import json, pathlib, sys
res, cpu_path, device = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
w = json.loads((res / "worker.json").read_text())["tinygrad"]
p = json.loads((res / "pipeline.json").read_text())["pipeline"]["2"]
pipe_tokens = p["tokens"]
out = {"device": device, "worker": {k: w[k] for k in ("decode_tok_s", "prefill_tok_s", "cold_start_s", "load_s", "tokens")},
       "pool_s2": {"decode_tok_s": p["decode_tok_s"], "ttft_s": p["ttft_s"], "tokens_match_single": p["matches_single"],
                   "tokens": pipe_tokens}}
cpu = json.loads(cpu_path.read_text()) if cpu_path.exists() else None
def same(name: str, ours: list[int], theirs: list[int] | None) -> bool:
    if theirs is None:
        print(f"  {name}: no CPU run recorded ({cpu_path}: bash bench/gpu_check.sh prepare)")
        return True
    diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if diff is None and len(ours) == len(theirs):
        print(f"  {name}: tokens ({len(ours)}) EQUAL to the CPU run")
        return True
    print(f"  {name}: tokens UNEQUAL to the CPU run from step {diff}: {ours[diff:diff + 4]} vs {theirs[diff:diff + 4]}")
    return False
print(f"gpu_check on {device}: single stage decode {w['decode_tok_s']:.1f} tok/s, prefill {w['prefill_tok_s']:.1f} tok/s "
      f"(chunk 32), cold start {w['cold_start_s']:.2f} s; S=2 pool decode {p['decode_tok_s']:.1f} tok/s, TTFT {p['ttft_s']:.2f} s")
ok = same("single stage (bench/worker.py)", w["tokens"], cpu and cpu["worker"]["tokens"])
ok &= same("S=2 pool (bench/pipeline.py)", pipe_tokens, cpu and cpu["pool_s2"]["tokens"])
ok &= p["matches_single"] is True
print(f"  S=2 pool tokens {'equal' if p['matches_single'] else 'UNEQUAL'} to one process's on {device}")
out["equal_to_cpu"] = ok
(res / "gpu_check.json").write_text(json.dumps(out, indent=1) + "\n")
sys.exit(0 if ok else 3)
PY
}

case "$MODE" in
    prepare) prepare ;;
    exec) setup; cd "$ROOT"; [ $# -gt 0 ] || die "exec: no command"; PY="$PY" exec "$@" ;;
    *) run ;;
esac
