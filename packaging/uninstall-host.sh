#!/usr/bin/env bash
# Remove what `bash install.sh host` installed on this host (called as `bash install.sh uninstall`):
# stops swactor.target and every swactor unit and checks that no process of the swactor user is
# left, then removes the units and the target, the code ($PREFIX, default /opt/swactor), the CLI
# link, the config and the API's certificate, key and token (/etc/swactor), the state (node id,
# edge identity, run store, ring ids: /var/lib/swactor), the caches (/var/cache/swactor), the
# runtime dir (/run/swactor) and the swactor user and group.
#
# Kept unless asked, because they cannot be made again: the pool's cluster secret (every other host
# holds the same) and the model files (large to fetch again). Kept files become root's. The Debian
# packages the installer may have added (clang, python3-venv) stay: other software may use them.
#
#   bash install.sh uninstall                                 # keeps the secret and the models
#   bash install.sh uninstall --purge-secret --purge-model    # nothing of swactor stays
#
# Options:
#   --purge-secret    also remove /etc/swactor/cluster.secret
#   --purge-model     also remove the models in /var/lib/swactor/models
#   --prefix DIR      where the code is, when the install record (/etc/swactor/installed) is gone
#   -h, --help        this text
set -euo pipefail

ETC=/etc/swactor
STATE=/var/lib/swactor
CACHE=/var/cache/swactor
RUN=/run/swactor
SERVICE_USER=swactor
PURGE_SECRET=0
PURGE_MODEL=0
PREFIX=""

say() { printf '[uninstall] %s\n' "$*" >&2; }
die() { printf '[uninstall] error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
# Pids of processes whose real or effective uid is $1 (from /proc: procps is not on minimal hosts).
user_pids() {
    local status uid
    for status in /proc/[0-9]*/status; do
        uid="$(awk '/^Uid:/ {print $2, $3}' "$status" 2>/dev/null)" || continue
        case " $uid " in *" $1 "*) status="${status%/status}"; echo "${status#/proc/}" ;; esac
    done
}

while [ $# -gt 0 ]; do
    case "$1" in
        --purge-secret) PURGE_SECRET=1; shift ;;
        --purge-model) PURGE_MODEL=1; shift ;;
        --prefix) PREFIX="${2:?--prefix needs a directory}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (bash install.sh uninstall --help)" ;;
    esac
done
[ "$(id -u)" -eq 0 ] || die "run as root: it removes systemd units and a system user"
if [ -z "$PREFIX" ]; then
    PREFIX=/opt/swactor
    # shellcheck disable=SC1091  # written by install-host.sh: PREFIX=...
    [ -r "$ETC/installed" ] && PREFIX="$(. "$ETC/installed" && echo "$PREFIX")"
fi
case "$PREFIX" in /|/usr|/usr/*|/etc|/var|"") die "--prefix '$PREFIX' is not a swactor install root" ;; esac

say "stopping swactor.target and its services"
units=()
for f in /etc/systemd/system/swactor.target /etc/systemd/system/swactor-*.service; do
    [ -e "$f" ] && units+=("$(basename "$f")")
done
if command -v systemctl >/dev/null && [ ${#units[@]} -gt 0 ]; then
    systemctl stop "${units[@]}" || true
    systemctl disable -q "${units[@]}" 2>/dev/null || true
fi

# Nothing of the service user may outlive the uninstall (a process started outside the units).
if uid="$(id -u "$SERVICE_USER" 2>/dev/null)"; then
    for signal in TERM KILL; do
        pids="$(user_pids "$uid")"
        [ -n "$pids" ] || break
        say "ending the $SERVICE_USER processes left outside the units (SIG$signal): $(echo $pids)"
        # shellcheck disable=SC2086  # one pid per word
        kill "-$signal" $pids 2>/dev/null || true
        for _ in $(seq 50); do [ -n "$(user_pids "$uid")" ] || break; sleep 0.1; done
    done
    left="$(user_pids "$uid")"
    [ -z "$left" ] || die "processes of $SERVICE_USER still running (pids $(echo $left)), nothing removed yet"
fi

say "removing the units, the code and the CLI link"
for unit in "${units[@]}"; do
    rm -rf "/etc/systemd/system/$unit" "/etc/systemd/system/$unit.d"
done
if command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl reset-failed 'swactor*' 2>/dev/null || true
fi
[ "$(readlink /usr/local/bin/swactor 2>/dev/null || true)" = "$PREFIX/venv/bin/swactor" ] && rm -f /usr/local/bin/swactor
rm -rf "$PREFIX"

say "removing config, state, caches and runtime files"
kept=()
if [ "$PURGE_SECRET" -eq 0 ] && [ -e "$ETC/cluster.secret" ]; then
    find "$ETC" -mindepth 1 -maxdepth 1 ! -name cluster.secret -exec rm -rf {} +
    chown root:root "$ETC" "$ETC/cluster.secret" && chmod 0700 "$ETC" && chmod 0600 "$ETC/cluster.secret"
    kept+=("$ETC/cluster.secret")
else
    rm -rf "$ETC"
fi
if [ "$PURGE_MODEL" -eq 0 ] && [ -d "$STATE/models" ] && [ -n "$(ls -A "$STATE/models")" ]; then
    find "$STATE" -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +
    find "$STATE/models" -name '*.part' -delete
    chown -R root:root "$STATE" && chmod 0755 "$STATE" "$STATE/models"
    kept+=("$STATE/models/")
else
    rm -rf "$STATE"
fi
rm -rf "$CACHE" "$RUN"

if getent passwd "$SERVICE_USER" >/dev/null; then
    say "removing the system user $SERVICE_USER"
    userdel "$SERVICE_USER"
fi
if getent group swactor >/dev/null; then
    groupdel swactor
fi

if [ ${#kept[@]} -gt 0 ]; then
    say "done; kept (remove with --purge-secret / --purge-model): ${kept[*]}"
else
    say "done; nothing of swactor is left"
fi
