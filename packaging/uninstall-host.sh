#!/usr/bin/env bash
# Remove what `bash install.sh host` installed on this host (called as `bash install.sh uninstall`):
# stops swactor.target and every swactor unit (on a host installed without systemd: the supervisor
# swactor-host and the services it runs) and checks that no process of the swactor user is left,
# then removes what the install record (/etc/swactor/installed) lists, and nothing else: the units
# and the target (or the supervisor's unit files in the install root, its log and its runtime dir),
# what install put in the install root (default /opt/swactor: the venv, the docs, its marker, and
# the root itself once empty when install created it), the CLI link (and swactor-host's), the
# config and the certificates, keys and tokens of the API and the gateway (/etc/swactor), the state
# (node id, edge identity, run store, ring ids: /var/lib/swactor), the caches (/var/cache/swactor),
# the runtime dir (/run/swactor) and the swactor user and group when install created them.
#
# Nothing is removed from a directory that is not proven swactor's: the install root must hold the
# marker install wrote there (.swactor-install, a copy of the record). A --prefix other than the
# record's, or one without the marker, is refused before anything changes. Without a record (lost, or
# removed by an earlier uninstall) the marker stands for it; what an earlier uninstall kept is found
# by swactor's own names (/etc/swactor, /var/lib/swactor).
#
# Kept unless asked, because they cannot be made again: the pool's cluster secret (every other host
# holds the same) and the model files (large to fetch again). Kept files become root's. Kept too,
# because install did not make them: the Debian packages it may have added (clang, python3-venv),
# files an operator put in the install root, and drop-in directories of the units (systemctl edit).
#
#   bash install.sh uninstall                                 # keeps the secret and the models
#   bash install.sh uninstall --purge-secret --purge-model    # nothing of swactor stays
#
# Options:
#   --purge-secret    also remove /etc/swactor/cluster.secret
#   --purge-model     also remove the models in /var/lib/swactor/models
#   --prefix DIR      the install root, when the install record is gone (it must hold the marker
#                     install wrote); with a record, it must be the record's
#   -h, --help        this text
set -euo pipefail

LOG_TAG=uninstall
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=packaging/cli.sh
. "$HERE/cli.sh"
# shellcheck source=packaging/record.sh
. "$HERE/record.sh"
ETC=/etc/swactor
STATE=/var/lib/swactor
SERVICE_USER=swactor
PURGE_SECRET=0
PURGE_MODEL=0
PREFIX_OPTION=""

# Pids of processes whose real or effective uid is $1 (from /proc: procps is not on minimal hosts).
user_pids() {
    local status uid
    for status in /proc/[0-9]*/status; do
        uid="$(awk '/^Uid:/ {print $2, $3}' "$status" 2>/dev/null)" || continue
        case " $uid " in *" $1 "*) status="${status%/status}"; echo "${status#/proc/}" ;; esac
    done
}
# systemd's own test (sd_booted): without it running (a chroot, an image build) there is nothing to
# stop or reload, and systemctl would fail trying.
systemd_running() { command -v systemctl >/dev/null && [ -d /run/systemd/system ]; }

while [ $# -gt 0 ]; do
    case "$1" in
        --purge-secret) PURGE_SECRET=1; shift ;;
        --purge-model) PURGE_MODEL=1; shift ;;
        --prefix) need_value "a directory" "$@"; PREFIX_OPTION="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) die_usage "unknown option ${1@Q} (bash install.sh uninstall --help)" ;;
        *) die_usage "unexpected argument ${1@Q} (bash install.sh uninstall --help)" ;;
    esac
done
if [ -n "$PREFIX_OPTION" ]; then
    problem="$(prefix_shape_problem "$PREFIX_OPTION")"
    [ -z "$problem" ] || die_usage "--prefix ${PREFIX_OPTION@Q} $problem"
fi
[ "$(id -u)" -eq 0 ] || die "run as root: it removes systemd units and a system user"

# What to remove, decided before anything changes: the record's list, its install root proven by the
# marker there; without a record, the marker's copy of it; without either, only what bears swactor's
# name (what an earlier uninstall kept).
REC_LEGACY=0
if [ -e "$RECORD" ]; then
    record_read "$RECORD" || die "the install record $RECORD $REC_PROBLEM; nothing removed"
    [ -z "$PREFIX_OPTION" ] || [ "$PREFIX_OPTION" = "$REC_PREFIX" ] \
        || die "--prefix ${PREFIX_OPTION@Q} is not the install root $REC_PREFIX that the install record $RECORD names; nothing removed"
    PREFIX="$REC_PREFIX"
    root_is="the install root ${PREFIX@Q} of $RECORD"
    problem="$(prefix_proof_problem "$PREFIX" "$RECORD")"
else
    PREFIX="${PREFIX_OPTION:-/opt/swactor}"
    root_is="${PREFIX_OPTION:+--prefix }${PREFIX@Q}"
    if [ -n "$PREFIX_OPTION" ] && [ ! -e "$PREFIX" ]; then
        problem="does not exist"
    else
        problem="$(prefix_proof_problem "$PREFIX")"
    fi
    if [ -z "$problem" ] && [ -e "$PREFIX" ]; then
        record_read "$PREFIX/$MARKER" || problem="holds a $MARKER that $REC_PROBLEM"
    elif [ -z "$problem" ]; then
        mapfile -t REC_LINES < <(printf '%s\n' "link $CLI_LINK" "${SWACTOR_DIRS[@]/#/dir }"; existing_unit_lines)
        REC_PREFIX="$PREFIX"
    fi
fi
[ -z "$problem" ] || die "$root_is $problem; nothing removed"
[ "$REC_PREFIX" = "$PREFIX" ] || die "$root_is holds the $MARKER of $REC_PREFIX; nothing removed"
kept=()

# A host installed without systemd: its supervisor stops every service it runs, in reverse order.
if record_has "tree $PREFIX/units"; then
    if pid="$(supervisor_pid)"; then
        [ "$pid" -ne 1 ] || die "swactor-host is this container's main process (PID 1): stopping it would end the container (and this uninstall); stop the container instead; nothing removed"
        say "stopping the supervisor swactor-host (pid $pid) and its services"
        stop_supervisor "$PREFIX"
    fi
fi

say "stopping swactor.target and its services"
units=()
while read -r file; do
    [ ! -e "$file" ] || units+=("${file##*/}")
done < <(record_lines unit)
if [ ${#units[@]} -gt 0 ] && systemd_running; then
    systemctl stop "${units[@]}" || true
fi
if [ ${#units[@]} -gt 0 ] && command -v systemctl >/dev/null; then
    systemctl disable -q "${units[@]}" 2>/dev/null || true  # also offline: it removes the [Install] links
fi

# Nothing of the service user may outlive the uninstall (a process started outside the units).
if uid="$(id -u "$SERVICE_USER" 2>/dev/null)"; then
    for signal in TERM KILL; do
        pids="$(user_pids "$uid" | paste -sd ' ')"
        [ -n "$pids" ] || break
        say "ending the $SERVICE_USER processes left outside the units (SIG$signal): $pids"
        # shellcheck disable=SC2086  # one pid per word
        kill "-$signal" $pids 2>/dev/null || true
        for _ in $(seq 50); do [ -n "$(user_pids "$uid")" ] || break; sleep 0.1; done
    done
    left="$(user_pids "$uid" | paste -sd ' ')"
    [ -z "$left" ] || die "processes of $SERVICE_USER still running (pids $left), nothing removed yet"
fi

say "removing the units, the CLI link and the code in $PREFIX"
while read -r dropin; do  # install's own, before the drop-in directories left are reported as the operator's
    rm -f "$dropin"
    rmdir "$(dirname "$dropin")" 2>/dev/null || true
done < <(record_lines dropin)
for unit in "${units[@]}"; do
    rm -f "$UNIT_DIR/$unit"
    [ ! -d "$UNIT_DIR/$unit.d" ] || kept+=("$UNIT_DIR/$unit.d/ (drop-ins)")
done
if systemd_running; then
    systemctl daemon-reload
    systemctl reset-failed 'swactor*' 2>/dev/null || true
fi
if record_has "link $CLI_LINK" && [ "$(readlink "$CLI_LINK" 2>/dev/null || true)" = "$PREFIX/venv/bin/swactor" ]; then
    rm -f "$CLI_LINK"
fi
if record_has "link $HOST_LINK" && [ "$(readlink "$HOST_LINK" 2>/dev/null || true)" = "$PREFIX/venv/bin/swactor-host" ]; then
    rm -f "$HOST_LINK"
fi
while read -r tree; do rm -rf "$tree"; done < <(record_lines tree)
while read -r file; do rm -f "$file"; done < <(record_lines file)
if record_has "made $PREFIX"; then
    rmdir "$PREFIX" 2>/dev/null || [ ! -e "$PREFIX" ] || kept+=("$PREFIX/ (files install did not put there)")
elif [ -d "$PREFIX" ]; then
    kept+=("$PREFIX/ (the record does not say install made it)")
fi

if record_has "user $SERVICE_USER" && getent passwd "$SERVICE_USER" >/dev/null; then
    say "removing the system user $SERVICE_USER"
    userdel "$SERVICE_USER"
fi
if record_has "group swactor" && getent group swactor >/dev/null; then
    groupdel swactor
fi

# The config last: it holds the record, which a second run needs if this one stops half-way.
say "removing state, caches, runtime files and config"
for dir in /var/cache/swactor /run/swactor "$HOST_RUN"; do
    ! record_has "dir $dir" || rm -rf "$dir"
done
if record_has "dir $STATE"; then
    if [ "$PURGE_MODEL" -eq 0 ] && [ -d "$STATE/models" ] && [ -n "$(ls -A "$STATE/models")" ]; then
        find "$STATE" -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +
        find "$STATE/models" -name '*.part' -delete
        chown -R root:root "$STATE" && chmod 0755 "$STATE" "$STATE/models"
        kept+=("$STATE/models/")
    else
        rm -rf "$STATE"
    fi
fi
if record_has "dir $ETC"; then
    if [ "$PURGE_SECRET" -eq 0 ] && [ -e "$ETC/cluster.secret" ]; then
        find "$ETC" -mindepth 1 -maxdepth 1 ! -name cluster.secret -exec rm -rf {} +
        chown root:root "$ETC" "$ETC/cluster.secret" && chmod 0700 "$ETC" && chmod 0600 "$ETC/cluster.secret"
        kept+=("$ETC/cluster.secret")
    else
        rm -rf "$ETC"
    fi
fi

if [ ${#kept[@]} -gt 0 ]; then
    say "done; kept: ${kept[*]} (the secret and the models go with --purge-secret / --purge-model)"
else
    say "done; nothing of swactor is left"
fi
