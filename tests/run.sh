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
echo "== pytest"
.venv/bin/python -m pytest -q -ra "$@"
