"""The Orchestrator gRPC API: what a caller reaches and how a request is checked and answered.

  service      the thin gRPC servicer: every method delegates to runs.manager; SubmitRun's lenient deserializer
  validation   SubmitRun checks that need no model: byte limit before parsing, UTF-8 by field, NaN/inf, ranges
  errors       RequestError: a gRPC status code and a message naming what was wrong
  api_access   the optional TCP API: TLS and a bearer token on every call
  server       the API's gRPC servers: the Unix socket's, and the TCP one (TLS, bearer token) when configured
"""
