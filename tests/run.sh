#!/usr/bin/env bash
# The whole test suite: lint, Rust tests, Python tests. `make test` runs it after setup.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== ruff"
.venv/bin/ruff check services tests bench packaging
echo "== cargo clippy"
(cd ring-rs && cargo clippy --all-targets -q -- -D warnings && cargo clippy --all-targets --features python -q -- -D warnings)
echo "== cargo test"
(cd ring-rs && cargo test -q 2>&1)
echo "== loom model of the launcher's dispatch protocol (ring-rs/src/launch/model.rs)"
(cd ring-rs && RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -q --release --lib launch::model 2>&1)
# Two pytest-xdist workers (SWACTOR_TEST_WORKERS, 1: one process): most tests wait on subprocesses and sockets, so two
# share the cores; tests/conftest.py keeps each module on one worker and every pool-building test in one group (its scheduler). The
# tests marked `serial` time things a busy neighbour would distort: they run after, alone.
workers="${SWACTOR_TEST_WORKERS:-2}"
if [ "$workers" -le 1 ]; then
    echo "== pytest"
    exec .venv/bin/python -m pytest -q -ra "$@"
fi
echo "== pytest, $workers workers (all but the serial tests)"
first=0
# numpy's BLAS single-threaded in each worker: the float64 references' matmuls gain nothing from a second thread here,
# and OpenBLAS's threads spin waiting for a core the other worker holds (measured: twice the time beside a busy core)
OPENBLAS_NUM_THREADS=1 .venv/bin/python -m pytest -q -ra -n "$workers" -m "not serial" "$@" || first=$?
echo "== pytest, the serial tests alone"
second=0
.venv/bin/python -m pytest -q -ra -m serial "$@" || second=$?
# 5: nothing collected (a selection with no serial test, or only serial ones) is not a failure while the other ran
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then exit 5; fi
for status in "$first" "$second"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
