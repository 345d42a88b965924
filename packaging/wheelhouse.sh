#!/usr/bin/env bash
# Build a wheelhouse: every Python package `install.sh host` needs, as wheels in one folder, so a
# host without internet access installs with `bash install.sh host --wheelhouse DIR ...`.
# Idempotent: re-running is a no-op (no network) while pyproject's dependencies and the ring-rs
# wheel are unchanged.
#
#   bash packaging/wheelhouse.sh [DIR]          # default: <repo>/.cache/wheelhouse
#
# Run it with the same Python minor version and platform as the hosts (WHEELHOUSE_PYTHON, default
# the repo's .venv, i.e. CPython 3.11 on linux x86_64 for Debian bookworm hosts). The ring-rs wheel
# comes from dist/ring (built here with maturin when missing, as `install.sh dev` does).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.cache/wheelhouse}"
PY="${WHEELHOUSE_PYTHON:-$ROOT/.venv/bin/python}"
STAMP="$DIR/.swactor-wheelhouse"

say() { printf '[wheelhouse] %s\n' "$*" >&2; }
die() { printf '[wheelhouse] error: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || die "no Python at $PY: run \`bash install.sh dev\` or set WHEELHOUSE_PYTHON"
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9

if ! ls "$ROOT"/dist/ring/swactor_ring-*.whl >/dev/null 2>&1; then
    say "building the ring-rs wheel into dist/ring"
    command -v cargo >/dev/null || die "no ring-rs wheel in dist/ring and no cargo to build one"
    maturin="$(dirname "$PY")/maturin"
    [ -x "$maturin" ] || die "no maturin next to $PY (pip install maturin)"
    (cd "$ROOT/ring-rs" && VIRTUAL_ENV="$(dirname "$(dirname "$PY")")" "$maturin" build -q --release --out "$ROOT/dist/ring")
fi
ring=("$ROOT"/dist/ring/swactor_ring-*.whl)
[ ${#ring[@]} -eq 1 ] || die "expected one ring-rs wheel in dist/ring, found ${#ring[@]}: ${ring[*]}"

# What install-host.sh installs: pip itself, the build backend for the swactor source tree,
# grpcio-tools (the installer generates the gRPC stubs), the project's runtime dependencies and its cuda extra (NVRTC,
# which install-host.sh adds on a GPU host).
reqs="$("$PY" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
build = project["build-system"]["requires"]
print("\n".join(["pip", "wheel", "grpcio-tools>=1.60", *build, *project["project"]["dependencies"],
                 *project["project"]["optional-dependencies"]["cuda"]]))
PY
)"
want="$("$PY" -c 'import sys; print(sys.implementation.cache_tag)') $(sha256sum "${ring[0]}" | cut -c1-16) $(echo "$reqs" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then echo "$DIR"; exit 0; fi

rm -f "$STAMP" "$DIR"/swactor_ring-*.whl
say "pip wheel $(echo "$reqs" | wc -l) requirements into $DIR"
echo "$reqs" > "$DIR/requirements.txt"
"$PY" -m pip wheel -q --disable-pip-version-check -w "$DIR" -r "$DIR/requirements.txt" \
    || die "pip wheel failed (needs PyPI, or PIP_INDEX_URL for a mirror)"
cp "${ring[0]}" "$DIR/"
echo "$want" > "$STAMP"
echo "$DIR"
