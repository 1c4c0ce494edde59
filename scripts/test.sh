#!/usr/bin/env bash
# Runs the whole test suite: unit tests, the in-process server tests, and the
# end-to-end tests that start the real cloudweb-server and cloudweb-agent
# binaries (which need a running Docker Engine), then the installer's smoke
# test. It also builds the book in docs/ (scripts/docs.sh) and fails on a
# broken link in it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The structure check (issue 19): every crate depends only on lower layers
# of crates/layers/layers.toml, and no crate has an import circle between
# its modules. It reads text only, so it runs first and fails fast.
cargo run -q --locked -p cloudweb-layers
# The shipped binaries get the same dependency features from the
# installer's `cargo build -p` as from a workspace build (issue 21 item 3).
bash scripts/feature-sets.sh

# The compatibility suite (crates/e2e/tests/e2e/compat.rs) runs the previous
# release's server and agent against this tree's. They are built first
# (cached by commit; see scripts/compat-build.sh) because their build
# shares this target dir and leaves its binaries in target/debug, which the
# next build replaces with this tree's.
if [ -z "${CLOUDWEB_PREVIOUS_BIN_DIR:-}" ]; then
    CLOUDWEB_PREVIOUS_BIN_DIR=$(bash scripts/compat-build.sh)
fi
export CLOUDWEB_PREVIOUS_BIN_DIR

# The end-to-end tests start the binaries, so build them first.
cargo build --workspace --bins --locked
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
if ! target/debug/cloudweb-agent --version | grep -qx "cloudweb-agent $version"; then
    echo "test: target/debug/cloudweb-agent is not version $version after the build" >&2
    exit 1
fi
# The local images the Docker tests run (built from host files, never pulled).
bash scripts/images.sh
# The managed databases' test images (Debian's packages; scripts/service-images.sh).
bash scripts/service-images.sh

# The fault suite (crates/e2e/tests/e2e/faults.rs) writes one line per case
# here; the runner hides a passing test's output, so it is printed at the end.
CLOUDWEB_FAULT_SUMMARY=$(mktemp)
export CLOUDWEB_FAULT_SUMMARY
# The same for the security suite (crates/e2e/tests/e2e/security.rs).
CLOUDWEB_SECURITY_SUMMARY=$(mktemp)
export CLOUDWEB_SECURITY_SUMMARY
# The same for the compatibility matrix that ran.
CLOUDWEB_COMPAT_SUMMARY=$(mktemp)
export CLOUDWEB_COMPAT_SUMMARY
# In a full run: what the host's Docker holds now (certs.d entries, images,
# containers), which it must hold again at the end (scripts/docker-leftovers.sh).
docker_before=$(mktemp)
trap 'rm -f "$CLOUDWEB_FAULT_SUMMARY" "$CLOUDWEB_SECURITY_SUMMARY" "$CLOUDWEB_COMPAT_SUMMARY" "$docker_before"' EXIT
if [ $# -eq 0 ]; then
    bash scripts/docker-leftovers.sh list > "$docker_before"
fi

status=0
# The book (docs/): the command-line and API reference generated from these
# binaries, `mdbook build`, and the internal link check. A failure fails
# the run, after the tests have run too.
bash scripts/docs.sh || status=$?

if cargo nextest --version >/dev/null 2>&1; then
    # Each test gets its own process; the e2e tests mostly wait on children,
    # so a few more threads than cores keeps both cores busy.
    cargo nextest run --workspace --locked --test-threads 4 --no-fail-fast "$@" || status=$?
else
    cargo test --workspace --locked --no-fail-fast "$@" || status=$?
fi

# The same control plane on PostgreSQL (issue 24): the store's own tests ran
# on both engines above; here the protocol conformance suite and the
# nodes, accounts, hardening and deploy-order tests run again with every control plane's
# state in a database of a real PostgreSQL server that each test process
# starts (crates/e2e/src/state_db.rs). Only in a full run.
if [ $# -eq 0 ] && cargo nextest --version >/dev/null 2>&1; then
    # --workspace, as above, so the build is the one above (`-p` alone
    # would resolve features for that package and build again).
    CLOUDWEB_TEST_DATABASE=postgres cargo nextest run --workspace --locked --test-threads 4 --no-fail-fast \
        -E 'package(cloudweb-e2e) & (test(/^conformance::/) | test(/^nodes::/) | test(/^accounts::/) | test(/^server_hardening::/) | test(/^deploy_order::/))' || status=$?
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

# The leftover check, after everything in a full run (the smoke test too):
# tests and their clusters remove what they add.
if [ $# -eq 0 ]; then
    bash scripts/docker-leftovers.sh compare "$docker_before" || status=1
fi

if [ -s "$CLOUDWEB_COMPAT_SUMMARY" ]; then
    echo "compatibility matrix (previous release from $CLOUDWEB_PREVIOUS_BIN_DIR):"
    sort "$CLOUDWEB_COMPAT_SUMMARY"
fi
if [ -s "$CLOUDWEB_FAULT_SUMMARY" ]; then
    echo "fault suite summary:"
    cat "$CLOUDWEB_FAULT_SUMMARY"
fi
if [ -s "$CLOUDWEB_SECURITY_SUMMARY" ]; then
    echo "security suite summary:"
    sort "$CLOUDWEB_SECURITY_SUMMARY"
fi
exit "$status"
