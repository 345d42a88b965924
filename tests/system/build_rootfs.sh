#!/usr/bin/env bash
# Build (once) the minimal Debian bookworm rootfs the system tests boot with systemd-nspawn, and
# print its path. Cached under .cache/rootfs/; re-running is a no-op while the package list is the
# same. A build is made in NAME.partial and renamed only when complete, so a killed build never
# leaves a half-built rootfs behind that a later run would boot.
#
#   bash tests/system/build_rootfs.sh [CACHE_DIR]        # default: <repo>/.cache/rootfs
#
# The Debian packages swactor's installer needs (clang for tinygrad's CPU device, python3-venv)
# are preinstalled here, because the test containers have no network. The mirror is the one this
# machine's apt uses (first deb.debian.org-style "…/debian" URI in /etc/apt/sources.list*),
# overridable with SWACTOR_DEBIAN_MIRROR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${1:-$ROOT/.cache/rootfs}"
SUITE=bookworm
NAME="$SUITE-base"
INCLUDE="systemd,systemd-sysv,dbus,python3,python3-venv,clang,iproute2"
STAMP=".swactor-rootfs"

say() { printf '[rootfs] %s\n' "$*" >&2; }
die() { printf '[rootfs] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap needs it)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"

mirror() {
    if [ -n "${SWACTOR_DEBIAN_MIRROR:-}" ]; then echo "$SWACTOR_DEBIAN_MIRROR"; return; fi
    local uri
    uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v '^[[:space:]]*#' | grep -oE '(https?)://[^ ]+/debian/?( |$)' | grep -v -- '-security' | head -n1 | tr -d ' ' || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}

want="suite=$SUITE include=$INCLUDE"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$CACHE/$NAME/$STAMP" ] && [ "$(cat "$CACHE/$NAME/$STAMP")" = "$want" ]; then
    echo "$CACHE/$NAME"; exit 0
fi
rm -rf "$CACHE/$NAME.partial" "$CACHE/$NAME.old"
MIRROR="$(mirror)"
say "debootstrap $SUITE from $MIRROR into $CACHE/$NAME (about a minute, ~800 MB)"
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$CACHE/$NAME.partial" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || die "debootstrap failed: see $CACHE/debootstrap.log (tail: $(tail -n 3 "$CACHE/debootstrap.log" | tr '\n' ' '))"
chroot "$CACHE/$NAME.partial" apt-get clean
# The containers boot offline: apt's timers would only fail there.
chroot "$CACHE/$NAME.partial" systemctl mask -q apt-daily.timer apt-daily-upgrade.timer
echo "$want" > "$CACHE/$NAME.partial/$STAMP"
[ ! -e "$CACHE/$NAME" ] || mv "$CACHE/$NAME" "$CACHE/$NAME.old"
mv "$CACHE/$NAME.partial" "$CACHE/$NAME"
rm -rf "$CACHE/$NAME.old"
echo "$CACHE/$NAME"
