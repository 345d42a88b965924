"""System tests: real systemd hosts in nspawn containers (see test_install_host.py)."""
