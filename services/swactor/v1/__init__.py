"""Generated gRPC stubs (build output of packaging/gen_protos.py)."""
