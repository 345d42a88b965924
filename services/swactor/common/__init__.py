"""What every swactor service shares: config, ids, structured events, gRPC and systemd glue."""
