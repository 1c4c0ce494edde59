#!/usr/bin/env bash
# Builds cloudweb-server and cloudweb-agent of the previous release (the
# last line of RELEASES) from this repository's own history, and prints the
# directory holding them. The binaries are cached by commit in
# ${CLOUDWEB_COMPAT_CACHE:-$HOME/.cache/cloudweb-compat}/<commit>/bin, so
# only the first run on a machine pays for the build.
#
# The source is exported with `git archive` (no worktree bookkeeping left
# in this clone) and built with this clone's CARGO_TARGET_DIR: the
# dependencies the two releases share (the same Cargo.lock versions) are
# compiled once. The build leaves the previous release's binaries in
# target/debug, so build this tree AFTER this script (scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

line=$(grep -v '^#' RELEASES | awk 'NF' | tail -n 1)
version=$(awk '{print $1}' <<<"$line")
commit=$(awk '{print $2}' <<<"$line")
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ && "$commit" =~ ^[0-9a-f]{40}$ ]]; then
    echo "compat-build: the last line of RELEASES is not '<version> <40-hex commit>': $line" >&2
    exit 1
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "compat-build: commit $commit (release $version) is not in this clone's history; fetch it (git fetch --unshallow)" >&2
    exit 1
fi

cache=${CLOUDWEB_COMPAT_CACHE:-$HOME/.cache/cloudweb-compat}/$commit
bin=$cache/bin
if [ -x "$bin/cloudweb-server" ] && [ -x "$bin/cloudweb-agent" ] \
    && "$bin/cloudweb-agent" --version 2>/dev/null | grep -qx "cloudweb-agent $version"; then
    echo "compat-build: release $version ($commit) from the cache $bin" >&2
    echo "$bin"
    exit 0
fi

mkdir -p "$cache"
src=$cache/src
rm -rf "$src" "$bin"
mkdir -p "$src"
git archive --format=tar "$commit" | tar -x -C "$src"
target=${CARGO_TARGET_DIR:-$root/target}
start=$(date +%s)
echo "compat-build: building release $version ($commit) in $src with target dir $target" >&2
(cd "$src" && CARGO_TARGET_DIR=$target cargo build --workspace --bins --locked) >&2
mkdir -p "$bin.tmp"
cp "$target/debug/cloudweb-server" "$target/debug/cloudweb-agent" "$bin.tmp/"
mv "$bin.tmp" "$bin"
rm -rf "$src"
echo "compat-build: release $version built in $(( $(date +%s) - start )) s" >&2
"$bin/cloudweb-agent" --version | grep -qx "cloudweb-agent $version" || {
    echo "compat-build: $bin/cloudweb-agent does not report version $version" >&2
    exit 1
}
echo "$bin"
