# shellcheck shell=bash disable=SC2034  # RECORD, REC_*: read by the scripts that source this file
# The install record: what `bash install.sh host` put on this host, so that `bash install.sh
# uninstall` removes that and nothing else. Sourced by packaging/install-host.sh and
# packaging/uninstall-host.sh.
#
# One line per thing install made, KIND PATH:
#   prefix /opt/swactor                  the install root (--prefix)
#   made /opt/swactor                    install created the root: removed once emptied
#   tree /opt/swactor/venv               removed with all it holds (and tree .../docs)
#   file /opt/swactor/.swactor-install   the marker (below)
#   link /usr/local/bin/swactor          the CLI, removed while it points into the install root
#   unit /etc/systemd/system/swactor.target        one line per unit file
#   dropin /etc/systemd/system/swactor-orchestrator.service.d/swactor-draft-model.conf   install's own drop-in
#   dir /etc/swactor                     and /var/lib/swactor, /var/cache/swactor, /run/swactor
#   user swactor, group swactor          only when install created them
# and on a host without systemd (install.sh host --no-systemd), where the supervisor swactor-host
# runs the services from unit files in the install root instead:
#   tree /opt/swactor/units              the unit files the supervisor runs (no unit lines then)
#   link /usr/local/bin/swactor-host     the supervisor's command, removed while it points into the root
#   file /var/log/swactor-host.log       the supervisor's log, when install started it
#   dir /run/swactor-host                the supervisor's runtime dir (control socket, pid file)
# The same text is written to $RECORD and into the install root as its marker: a directory is
# swactor's install root only when it holds a marker naming it, so a mistyped or hostile --prefix
# (/opt, a copy, a link) is never taken for one. A line install does not write makes the whole
# record untrusted.

RECORD=/etc/swactor/installed
MARKER=.swactor-install
CLI_LINK=/usr/local/bin/swactor
UNIT_DIR=/etc/systemd/system
# What lets the orchestrator run its draft model ([orchestrator] draft_model; install-host.sh writes it).
DRAFT_DROPIN=$UNIT_DIR/swactor-orchestrator.service.d/swactor-draft-model.conf
SWACTOR_DIRS=(/etc/swactor /var/lib/swactor /var/cache/swactor /run/swactor)
# The supervisor of a host without systemd (swactor-host, services/swactor/host): its command on
# PATH, the log install starts it with, and its runtime dir (control socket, pid file).
HOST_LINK=/usr/local/bin/swactor-host
HOST_LOG=/var/log/swactor-host.log
HOST_RUN=/run/swactor-host

# Why P cannot be an install root whatever is on disk (nothing when it can): it is compared byte for
# byte with the record, so it must be absolute and normalized; it must be a directory of its own, not
# /, /opt or /home; and it goes into the systemd units as it is, where ExecStart= splits at spaces
# and expands $ and %, and Documentation= wants a URI.
prefix_shape_problem() {
    local p="$1" odd="${1//[A-Za-z0-9\/._+@-]/}"
    if [ -n "$odd" ]; then
        echo "holds characters a systemd unit cannot take as they are (${odd@Q}): use letters, digits and / . _ - + @"
    elif [[ "$p" != /* ]]; then
        echo "is not an absolute path"
    elif [ "$(realpath -ms -- "$p")" != "$p" ]; then
        echo "is not a normalized path (no //, /./, /../ or trailing /)"
    elif [[ "$p" != /*/* ]]; then
        echo "is a top-level directory: an install root is a directory of its own, such as /opt/swactor"
    fi
}

# install_record_lines [--no-systemd] PREFIX UNIT_FILE...: the lines of the record an install into
# PREFIX writes before it makes anything: what it is about to make, and what the previous record
# (REC_LINES) says an earlier install made (the install root, the user, a unit this install does not
# write, the supervisor's files of an install without systemd). With --no-systemd the unit files go
# to PREFIX/units, run by the supervisor, instead of UNIT_DIR.
install_record_lines() {
    local no_systemd=0 prefix unit line
    if [ "$1" = --no-systemd ]; then no_systemd=1; shift; fi
    prefix="$1"
    shift
    echo "prefix $prefix"
    if [ ! -e "$prefix" ] || record_has "made $prefix"; then echo "made $prefix"; fi
    printf '%s\n' "tree $prefix/venv" "tree $prefix/docs" "file $prefix/$MARKER" "link $CLI_LINK"
    for line in "tree $prefix/units" "link $HOST_LINK" "file $HOST_LOG" "dir $HOST_RUN"; do
        if [ "$no_systemd" -eq 1 ] || record_has "$line"; then echo "$line"; fi
    done
    if [ "$no_systemd" -eq 0 ]; then
        for unit in "$@"; do echo "unit $UNIT_DIR/$unit"; done
    fi
    record_lines unit | sed 's/^/unit /'
    record_lines dropin | sed 's/^/dropin /'
    printf 'dir %s\n' "${SWACTOR_DIRS[@]}"
    if ! getent group swactor >/dev/null || record_has "group swactor"; then echo "group swactor"; fi
    if ! getent passwd swactor >/dev/null || record_has "user swactor"; then echo "user swactor"; fi
}

# The record's text: a comment, then the lines on stdin, each once, in order.
record_text() {
    echo "# swactor install record, written by \`bash install.sh host\`: what it put on this host."
    echo "# \`bash install.sh uninstall\` removes what is listed here, and nothing else."
    awk '!seen[$0]++'
}

# The unit files there are now (an older install's record does not list them).
existing_unit_lines() {
    local f
    for f in "$UNIT_DIR"/swactor.target "$UNIT_DIR"/swactor-*.service; do
        [ ! -f "$f" ] || echo "unit $f"
    done
}

# record_read FILE: the record's lines into REC_LINES and its install root into REC_PREFIX; status 1
# with the reason in REC_PROBLEM when it is not a record install writes. A record of an older
# install.sh (one line PREFIX=DIR, no marker made) reads as the list of what that version made,
# which did not include the install root itself.
record_read() {
    local line
    REC_LINES=() REC_PREFIX="" REC_PROBLEM="" REC_LEGACY=0
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            ""|"#"*) ;;
            "prefix "*) REC_PREFIX="${line#prefix }"; REC_LINES+=("$line") ;;
            PREFIX=*) REC_PREFIX="${line#PREFIX=}"; REC_LEGACY=1 ;;
            *) REC_LINES+=("$line") ;;
        esac
    done < "$1"
    if [ -z "$REC_PREFIX" ]; then
        REC_PROBLEM="names no install root"; return 1
    fi
    local problem; problem="$(prefix_shape_problem "$REC_PREFIX")"
    if [ -n "$problem" ]; then
        REC_PROBLEM="names the install root ${REC_PREFIX@Q}, which $problem"; return 1
    fi
    if [ "$REC_LEGACY" -eq 1 ]; then
        mapfile -t REC_LINES < <(printf '%s\n' "prefix $REC_PREFIX" "tree $REC_PREFIX/venv" "tree $REC_PREFIX/docs" \
            "link $CLI_LINK" "${SWACTOR_DIRS[@]/#/dir }" "user swactor" "group swactor"; existing_unit_lines)
        return 0
    fi
    for line in "${REC_LINES[@]}"; do
        case "$line" in
            "prefix $REC_PREFIX"|"made $REC_PREFIX"|"tree $REC_PREFIX/venv"|"tree $REC_PREFIX/docs") ;;
            "file $REC_PREFIX/$MARKER"|"link $CLI_LINK"|"user swactor"|"group swactor"|"unit $UNIT_DIR/swactor.target") ;;
            "dir /etc/swactor"|"dir /var/lib/swactor"|"dir /var/cache/swactor"|"dir /run/swactor") ;;
            "tree $REC_PREFIX/units"|"link $HOST_LINK"|"file $HOST_LOG"|"dir $HOST_RUN"|"dropin $DRAFT_DROPIN") ;;
            *)
                if ! [[ "$line" =~ ^unit\ $UNIT_DIR/swactor-[a-z]+\.service$ ]]; then
                    REC_PROBLEM="has a line install.sh host does not write: ${line@Q}"; return 1
                fi
                ;;
        esac
    done
}

# record_has LINE: whether the record (REC_LINES) holds LINE.
record_has() {
    local line
    for line in "${REC_LINES[@]}"; do [ "$line" != "$1" ] || return 0; done
    return 1
}

# record_lines KIND: the paths of the record's lines of that kind, one per line.
record_lines() {
    local line
    for line in "${REC_LINES[@]}"; do
        [ "${line%% *}" != "$1" ] || echo "${line#* }"
    done
}

# prefix_proof_problem P [RECORD_FILE]: why P cannot be taken for swactor's install root (nothing when
# it can). It can when there is no such directory (nothing to remove there), when its marker is the
# record itself (RECORD_FILE) or, without a record, a marker naming P; a record of an older
# install.sh, which made no marker, stands for a root holding the venv it made.
prefix_proof_problem() {
    local p="$1" record="${2:-}"
    if [ ! -e "$p" ] && [ ! -L "$p" ]; then
        return 0
    fi
    if [ -L "$p" ] || [ ! -d "$p" ]; then
        echo "is not a directory (a link or a file)"
    elif [ -f "$p/$MARKER" ] && [ ! -L "$p/$MARKER" ]; then
        if [ -n "$record" ]; then
            cmp -s "$record" "$p/$MARKER" \
                || echo "holds a $MARKER that differs from $record (an interrupted install? run it again)"
        elif ! grep -qxF "prefix $p" "$p/$MARKER"; then
            echo "holds a $MARKER of another install root (a copy?)"
        fi
    elif [ "${REC_LEGACY:-0}" -eq 1 ] && [ -x "$p/venv/bin/swactor" ]; then
        return 0
    else
        echo "holds no $MARKER, so nothing shows that install.sh host made it"
    fi
}

# ---- the supervisor of a host without systemd (swactor-host run) ----

# supervisor_pid: the pid of the supervisor running now (as this PID namespace numbers it), from its
# pid file, when that names a live swactor-host; status 1 when none runs. A stale pid file (a killed
# supervisor) may name another process by now: its command line tells.
supervisor_pid() {
    local pid
    pid="$(cat "$HOST_RUN/pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q 'swactor-host' || return 1
    echo "$pid"
}

# stop_supervisor PREFIX: stop the running supervisor and every service it runs, and wait until it
# has exited. `swactor-host stop` asks it over its control socket and answers once every unit is
# down; where no supervisor answers there, SIGTERM does the same (it stops the units in reverse order,
# each within its TimeoutStopSec=, together a few minutes at most); SIGKILL only after that. Gone is
# what supervisor_pid says: a zombie (its parent not reaping it) shows no command line.
stop_supervisor() {
    local pid
    pid="$(supervisor_pid)" || return 0
    if ! { [ -x "$1/venv/bin/swactor-host" ] && timeout 330 "$1/venv/bin/swactor-host" stop >/dev/null 2>&1; }; then
        kill -TERM "$pid" 2>/dev/null || return 0
    fi
    for _ in $(seq 3000); do supervisor_pid >/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}
