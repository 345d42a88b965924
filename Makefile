# The two commands a newcomer needs: `make demo` and `make test` (see README.md).
PY := .venv/bin/python

.PHONY: setup demo test lint protos model bench

setup:
	bash install.sh dev

demo: setup
	.venv/bin/swactor demo

test: setup
	bash tests/run.sh

lint:
	.venv/bin/ruff check services tests bench packaging
	cd ring-rs && cargo clippy --all-targets -q -- -D warnings && cargo clippy --all-targets --features python -q -- -D warnings

protos:
	$(PY) packaging/gen_protos.py

model:
	bash install.sh model
