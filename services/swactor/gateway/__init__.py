"""swactor-gateway: the pool's OpenAI-compatible HTTP API, a client of the orchestrator (docs/operations.md).

Its parts: `requests` (OpenAI bodies checked, as SubmitRunRequests), `answers` (one request's run: text deltas,
stop strings, its end), `shapes` (response objects), `app` (routes, token, streams), `pool_client` (the
orchestrator over its Unix socket), `config`, `main`.
"""
