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
if [ -s "$CLOUDWEB_FAULT_SUMMARY" ]; then
    echo "fault suite summary:"
    cat "$CLOUDWEB_FAULT_SUMMARY"
fi
exit "$status"
