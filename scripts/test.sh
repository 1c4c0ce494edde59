#!/usr/bin/env bash
# Runs the whole test suite: unit tests, the in-process server tests, and the
# end-to-end tests that start the real cloudweb-server and cloudweb-agent
# binaries (which need a running Docker Engine).
set -euo pipefail
cd "$(dirname "$0")/.."

# The end-to-end tests start the binaries, so build them first.
cargo build --workspace --bins --locked
# The local images the Docker tests run (built from host files, never pulled).
bash scripts/images.sh

if cargo nextest --version >/dev/null 2>&1; then
    # Each test gets its own process; the e2e tests mostly wait on children,
    # so a few more threads than cores keeps both cores busy.
    cargo nextest run --workspace --locked --test-threads 4 --no-fail-fast "$@"
else
    cargo test --workspace --locked --no-fail-fast "$@"
fi
