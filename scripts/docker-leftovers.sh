#!/usr/bin/env bash
# What a full test run may not leave in the host's Docker (issue 31): the
# registry CA directories under /etc/docker/certs.d, the images and the
# containers, one line each, sorted.
#
#   docker-leftovers.sh list > before    # before the tests
#   docker-leftovers.sh compare before   # after them: exit 1, printing
#                                        # what changed, when a count did
#
# CLOUDWEB_DOCKER_CERTS_DIR and CLOUDWEB_DOCKER (the docker program) may
# point elsewhere (the script's own test uses both).
set -euo pipefail

certs=${CLOUDWEB_DOCKER_CERTS_DIR:-/etc/docker/certs.d}
docker=${CLOUDWEB_DOCKER:-docker}

list() {
    {
        if [ -d "$certs" ]; then
            find "$certs" -mindepth 1 -maxdepth 1 -printf 'certs.d entry %f\n'
        fi
        "$docker" images --no-trunc --format 'image {{.Repository}}:{{.Tag}} {{.ID}}'
        "$docker" ps -a --no-trunc --format 'container {{.Names}} ({{.Image}})'
    } | LC_ALL=C sort
}

case "${1:-}" in
    list)
        list
        ;;
    compare)
        # Only what the run added fails it: a kind whose count grew, or an
        # entry whose name (an image's repository:tag, a container's name)
        # was not there before. What the run removed (a test cluster that
        # also cleared an older run's leftovers under a reused port) and an
        # image rebuilt under the same name are not leftovers.
        before_file=${2:?usage: docker-leftovers.sh compare BEFORE_FILE}
        after=$(list)
        before=$(cat "$before_file")
        names() { sed -E 's/^(image [^ ]+) .*/\1/; s/^(container [^ ]+) .*/\1/' | LC_ALL=C sort -u; }
        status=0
        for kind in "certs.d entry" image container; do
            before_count=$(printf '%s\n' "$before" | grep -c "^$kind " || true)
            after_count=$(printf '%s\n' "$after" | grep -c "^$kind " || true)
            if [ "$after_count" -gt "$before_count" ]; then
                echo "leftovers: the run changed the number of ${kind}s in the host's Docker: $before_count before, $after_count after" >&2
                status=1
            fi
        done
        new_names=$(LC_ALL=C comm -13 <(printf '%s\n' "$before" | names) <(printf '%s\n' "$after" | names) | grep -v '^$' || true)
        if [ -n "$new_names" ]; then
            echo "leftovers: the run left entries that were not there before:" >&2
            status=1
        fi
        if [ "$status" != 0 ]; then
            echo "leftovers: new since the run began (another run on this Docker Engine at the same time also shows here):" >&2
            LC_ALL=C comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed 's/^/  + /' >&2
            echo "leftovers: gone since the run began:" >&2
            LC_ALL=C comm -23 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed 's/^/  - /' >&2
        fi
        exit "$status"
        ;;
    *)
        echo "usage: docker-leftovers.sh list | compare BEFORE_FILE" >&2
        exit 2
        ;;
esac
