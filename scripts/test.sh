#!/usr/bin/env bash
# Runs the whole test suite: unit tests, the in-process server tests, and the
# end-to-end tests that start the real cloudweb-server and cloudweb-agent
# binaries (which need a running Docker Engine), then the installer's smoke
# test.
set -euo pipefail
cd "$(dirname "$0")/.."

# The end-to-end tests start the binaries, so build them first.
cargo build --workspace --bins --locked
# The local images the Docker tests run (built from host files, never pulled).
bash scripts/images.sh

# The fault suite (crates/e2e/tests/faults.rs) writes one line per case
# here; the runner hides a passing test's output, so it is printed at the end.
CLOUDWEB_FAULT_SUMMARY=$(mktemp)
export CLOUDWEB_FAULT_SUMMARY
trap 'rm -f "$CLOUDWEB_FAULT_SUMMARY"' EXIT

status=0
if cargo nextest --version >/dev/null 2>&1; then
    # Each test gets its own process; the e2e tests mostly wait on children,
    # so a few more threads than cores keeps both cores busy.
    cargo nextest run --workspace --locked --test-threads 4 --no-fail-fast "$@" || status=$?
else
    cargo test --workspace --locked --no-fail-fast "$@" || status=$?
fi

# The installer's smoke test (scripts/smoke-install.sh): a whole install
# under a temporary root with its own ports, the example app over HTTPS,
# and an uninstall that leaves nothing. Only in a full run (no test filter
# given); it needs root, like the installer.
if [ $# -eq 0 ]; then
    if [ "${CLOUDWEB_SKIP_SMOKE:-0}" = 1 ]; then
        echo "test: CLOUDWEB_SKIP_SMOKE=1: the installer smoke test was NOT run" >&2
    elif [ "$(id -u)" = 0 ]; then
        bash scripts/smoke-install.sh target/debug || status=$?
    elif sudo -n true 2>/dev/null; then
        sudo -n bash scripts/smoke-install.sh target/debug || status=$?
    else
        echo "test: the installer smoke test needs root (sudo ./scripts/test.sh, or CLOUDWEB_SKIP_SMOKE=1 to leave it out)" >&2
        status=1
    fi
fi

if [ -s "$CLOUDWEB_FAULT_SUMMARY" ]; then
    echo "fault suite summary:"
    cat "$CLOUDWEB_FAULT_SUMMARY"
fi
exit "$status"
