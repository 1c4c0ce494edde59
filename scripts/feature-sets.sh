#!/usr/bin/env bash
# Checks that the shipped binaries get the same dependency features from
# `cargo build -p cloudweb-server -p cloudweb-agent -p cloudweb-cli` (the
# installer's build) as from `cargo build --workspace` (the test suite's,
# and what a developer runs): cargo unifies features over the packages it
# is asked to build, and one feature more on a dependency gives it and
# everything above it a second artifact, so the installer would rebuild
# both binaries after a full workspace build. Reads metadata only.
set -euo pipefail
cd "$(dirname "$0")/.."
tree() { cargo tree --locked -e normal,build -f '{p} [{f}]' --prefix none "$@" | sed 's/ (\*)$//; s/ (proc-macro)//' | sort -u; }
shipped=$(mktemp); workspace=$(mktemp)
trap 'rm -f "$shipped" "$workspace"' EXIT
tree -p cloudweb-server -p cloudweb-agent -p cloudweb-cli > "$shipped"
tree --workspace > "$workspace"
python3 - "$shipped" "$workspace" <<'PY'
import sys
def features(path):
    found = {}
    for line in open(path):
        line = line.strip()
        if line:
            name, _, rest = line.partition(' [')
            found[name] = set(f for f in rest.rstrip(']').split(',') if f)
    return found
shipped, workspace = features(sys.argv[1]), features(sys.argv[2])
differ = [(name, sorted(workspace[name] - shipped[name]), sorted(shipped[name] - workspace[name]))
          for name in sorted(shipped) if name in workspace and shipped[name] != workspace[name]]
for name, more, fewer in differ:
    print(f"feature-sets: {name}: the workspace build adds {more}, the shipped-binaries build adds {fewer}", file=sys.stderr)
if differ:
    print("feature-sets: give these features to the dependency in [workspace.dependencies] (or name it in the shipped crate) so both builds share artifacts", file=sys.stderr)
    sys.exit(1)
print(f"feature-sets: {len(shipped)} dependencies of the shipped binaries get the same features in both builds")
PY
