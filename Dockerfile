# syntax=docker/dockerfile:1
# A swactor host as a container image: the services run under the supervisor `swactor-host run`
# (services/swactor/host), the image's entrypoint and the container's main process (PID 1), not
# under systemd. The image is made by the same steps as the root file system the system test
# tests/system/test_supervised_host.py runs as such a container: Debian bookworm with the packages
# below, this checkout in /root/swactor, and `install.sh host --no-systemd --no-start` with the host's
# options (no Docker engine runs where the tests run: that test is what checks these contents and
# this entrypoint).
#
#   docker build -t swactor-host \
#     --secret id=cluster.secret,src=./cluster.secret \
#     --build-arg INSTALL_ARGS="--advertise-ip 203.0.113.7 --public-port edge=41234 --seed 198.51.100.2:7946 --secret-file /run/secrets/cluster.secret" .
#   docker run -d --name swactor --network host --stop-timeout 120 --ulimit memlock=-1 swactor-host
#   docker exec swactor swactor-host status        # what `systemctl status 'swactor-*'` shows on a systemd host
#   docker stop swactor                            # SIGTERM: every service stops, in reverse order
#
# INSTALL_ARGS: the options of `bash install.sh host` (bash install.sh host --help) that make this
# host: --advertise-ip (required: the address other hosts reach it at), --public-port behind NAT,
# --seed and --secret-file to join a pool (the secret comes in as a build secret, mounted at
# /run/secrets/cluster.secret for the install step only; the install copies it to
# /etc/swactor/cluster.secret, so the image holds the pool's secret: keep it private), --orchestrator
# for the pool's first host. The build fetches the Python packages from PyPI; without it, make a
# wheelhouse in the context first (`bash packaging/wheelhouse.sh wheelhouse`, ./wheelhouse) and add
# `--wheelhouse /root/swactor/wheelhouse` (the test installs this way, offline).
# The ring-rs wheel comes from dist/ring (make it with `bash install.sh dev` or
# packaging/wheelhouse.sh): the image has no Rust toolchain to build it.
#
# Run it with the host's network (--network host, or the ports below published as --advertise-ip and
# --public-port say), a stop timeout that covers the services' stop timeouts (the orchestrator's
# teardown takes up to 45 s; docker's default is 10 s) and an unlimited memlock limit (the arena and
# the worker pin their rings: LimitMEMLOCK=infinity in their units).
FROM debian:bookworm-slim

# What the system test's root file system (tests/system/build_rootfs.sh) has: python3 and its venv
# for the install, clang for tinygrad's CPU kernels, iproute2; ca-certificates for pip over HTTPS.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv clang iproute2 ca-certificates \
    && rm -rf /var/lib/apt/lists/*

COPY . /root/swactor

ARG INSTALL_ARGS=""
# --no-systemd: no systemd runs in a build (it would be detected too); --no-start: the supervisor is
# the entrypoint below, started with the container. The secret mount is optional: a pool's first
# host (--orchestrator, no --secret-file) makes its own.
# hadolint ignore=SC2086
RUN --mount=type=secret,id=cluster.secret,required=false \
    bash /root/swactor/install.sh host --no-systemd --no-start $INSTALL_ARGS

# Membership (UDP probes, TCP push-pull), the QUIC edge, the stage control; with --orchestrator also
# the model server (TCP 7442) and whatever --api/--gateway name.
EXPOSE 7946/udp 7946/tcp 7400/udp 7441/tcp

# docker stop: SIGTERM to the supervisor, which stops every unit in reverse order (each unit's
# KillSignal=, then SIGKILL after its TimeoutStopSec=) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/swactor/venv/bin/swactor-host", "run"]
