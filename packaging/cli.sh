# shellcheck shell=bash
# What install.sh and the packaging/*-host.sh scripts share: their messages and how they read a
# command line. Sourced by each after it sets LOG_TAG, the tag of its messages ("install host").
#
# Exit status: 2 for a command line that cannot be what the operator meant (nothing was looked at or
# changed yet), 1 for an operation refused or failed.

say() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }
die_usage() { printf '[%s] error: %s\n' "$LOG_TAG" "$*" >&2; exit 2; }
# The script's header comment, from its second line to `set -euo`, without the comment marks.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# need_value WHAT OPTION [VALUE ...]: stop unless OPTION is followed by its value. A value that looks
# like an option is the operator's slip, never the value: with `--prefix --help`, "--help" would
# otherwise become the directory an uninstall removes. A control character (a newline, a tab) is
# refused too: no path, address or name the scripts take holds one, and their messages and the
# config they write stay one value per line.
#   --prefix) need_value "a directory" "$@"; PREFIX="$2"; shift 2 ;;
need_value() {
    [ $# -ge 3 ] || die_usage "$2 needs $1"
    [ -n "$3" ] || die_usage "$2 needs $1, got an empty value"
    [[ "$3" != -* ]] || die_usage "$2 needs $1, got the option ${3@Q}"
    [[ "$3" != *[[:cntrl:]]* ]] || die_usage "$2 ${3@Q} holds a control character"
}
