#!/usr/bin/env bash
# Builds the local images the managed-database tests run, without pulling
# anything from a registry (test machines have none to pull from):
#
#   cloudweb-test/postgres:15   PostgreSQL 15    production: postgres:16
#   cloudweb-test/postgres:17   PostgreSQL 17    (major version upgrades)
#   cloudweb-test/redis:7       Redis 7.0        production: redis:7, valkey/valkey:8
#   cloudweb-test/mariadb:10    MariaDB 10.11    production: mariadb:11
#
# The first three are Debian bookworm's own packages in one mmdebstrap
# rootfs, imported once as cloudweb-test/services-rootfs:bookworm (the
# three share its layer); PostgreSQL 17 is trixie's, in a rootfs of its
# own (cloudweb-test/services-rootfs:trixie); plus an entrypoint each (scripts/service-images/*-entrypoint.sh)
# that honours the same environment contract as the official image: the
# same variables, data paths, ports, commands and first-start initialization.
# The product does not know it runs a test image; tests only give it these
# names instead of the official ones.
#
#   service-images.sh           build what is missing or out of date
#   service-images.sh --check   also run the self-test (it runs after a build)
#   service-images.sh --force   rebuild the rootfs and the images
#
# The rootfs tarball is cached in CLOUDWEB_SERVICE_IMAGES_CACHE (default
# /var/cache/cloudweb-test-images), so a rebuild after `docker rmi` is quick;
# building it (a changed package list or hook, or --force) takes a minute or
# two, root, and the Debian mirror (CLOUDWEB_DEBIAN_MIRROR instead of
# deb.debian.org). Each image is labelled with a hash of this script, the
# files in scripts/service-images/ and the rootfs image, so changing any of
# them rebuilds it. A lock serializes parallel runs.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
self=scripts/service-images.sh

force=0 check=0
for arg in "$@"; do
    case "$arg" in
    --force) force=1 ;;
    --check) check=1 ;;
    *) echo "usage: $0 [--check] [--force]" >&2 && exit 2 ;;
    esac
done

postgres_image=cloudweb-test/postgres:15
postgres17_image=cloudweb-test/postgres:17
redis_image=cloudweb-test/redis:7
mariadb_image=cloudweb-test/mariadb:10
rootfs_image=cloudweb-test/services-rootfs:bookworm
rootfs17_image=cloudweb-test/services-rootfs:trixie
rootfs_label=cloudweb.rootfs.key
sha_label=cloudweb.service-images.sha256
files=scripts/service-images
default_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cache=${CLOUDWEB_SERVICE_IMAGES_CACHE:-/var/cache/cloudweb-test-images}

exec 9>"${CLOUDWEB_SERVICE_IMAGES_LOCK:-/tmp/cloudweb-service-images.lock}"
flock 9

work=$(mktemp -d)
containers=()
cleanup() {
    if [ "${#containers[@]}" -gt 0 ]; then
        docker rm -f "${containers[@]}" >/dev/null 2>&1 || true
    fi
    # The data directories belong to the containers' users: empty them from
    # a container, so this works for a caller who is not root too.
    if [ -d "$work/data" ]; then
        docker run --rm --entrypoint rm -v "$work/data:/data" "$rootfs_image" \
            -rf /data/postgres15 /data/postgres17 /data/redis /data/mariadb >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "service-images: $*" >&2 && exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
seconds_since() { # START_MS: the time since then, as 1.234s
    local ms=$(($(now_ms) - $1))
    printf '%d.%03ds' $((ms / 1000)) $((ms % 1000))
}

# Debian's packages, without manuals and translations, and the hook.
excludes=(
    '--dpkgopt=path-exclude=/usr/share/man/*'
    '--dpkgopt=path-exclude=/usr/share/doc/*'
    '--dpkgopt=path-exclude=/usr/share/locale/*'
)
# shellcheck disable=SC2054 # --include takes a comma-separated list
mmdebstrap_args=(
    --variant=apt
    --include=postgresql-15,redis-server,mariadb-server
    "${excludes[@]}"
    --customize-hook="$(<"$files/customize-rootfs.sh")"
)
mmdebstrap17_args=(
    --variant=apt
    --include=postgresql-17
    "${excludes[@]}"
    --customize-hook="$(<"$files/customize-rootfs-postgres17.sh")"
)
# mmdebstrap's default is deb.debian.org with the suite's -updates and
# -security.
mirrors=(${CLOUDWEB_DEBIAN_MIRROR:+"$CLOUDWEB_DEBIAN_MIRROR"})

label_of() { # IMAGE LABEL
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}
image_id() { docker image inspect --format '{{ .Id }}' "$1" 2>/dev/null || true; }

# IMAGE SUITE MMDEBSTRAP_ARGS...: the rootfs of SUITE, imported as IMAGE
# (from the cached tarball when its key matches).
build_rootfs_image() {
    local image=$1 suite=$2
    shift 2
    local key tarball
    key=$(printf '%s\0' "$@" "${mirrors[@]}" | sha256sum | cut -c1-16)
    tarball="$cache/rootfs-$suite-$key.tar"
    if [ "$force" = 0 ] && [ "$(label_of "$image" "$rootfs_label")" = "$key" ]; then
        return
    fi
    if [ "$force" = 1 ] || [ ! -s "$tarball" ]; then
        command -v mmdebstrap >/dev/null || fail "mmdebstrap is missing (apt-get install mmdebstrap; scripts/deps.sh does)"
        mkdir -p "$cache"
        rm -f "$cache"/partial-*.tar # left by an interrupted build
        local start partial="$cache/partial-$$.tar"
        start=$(now_ms)
        if ! mmdebstrap --quiet --format=tar "$@" "$suite" "$partial" "${mirrors[@]}" </dev/null; then
            rm -f "$partial"
            fail "mmdebstrap of $suite failed"
        fi
        mv "$partial" "$tarball"
        find "$cache" -maxdepth 1 -name "rootfs-$suite-*.tar" ! -path "$tarball" -delete
        echo "service-images: built the $suite rootfs in $(seconds_since "$start") ($(du -h "$tarball" | cut -f1))"
    fi
    local start previous
    start=$(now_ms)
    previous=$(image_id "$image")
    docker import --change "LABEL $rootfs_label=$key" --change "ENV PATH=$default_path" \
        --change 'CMD ["bash"]' "$tarball" "$image" >/dev/null
    if [ -n "$previous" ] && [ "$previous" != "$(image_id "$image")" ]; then
        old_images+=("$previous")
    fi
    echo "service-images: imported $image in $(seconds_since "$start")"
}

# IMAGE ROOTFS ENTRYPOINT STOP_SIGNAL CHANGE...: the ROOTFS image with
# ENTRYPOINT as /usr/local/bin/docker-entrypoint.sh and the Dockerfile-style
# CHANGEs.
# A container committed with them: one step, where `docker build` takes
# seconds per instruction, and `docker import` cannot set a stop signal.
build_service_image() {
    local image=$1 rootfs=$2 entrypoint=$3 stop_signal=$4 sha
    shift 4
    sha=$( (cat "$self" "$files"/*.sh && image_id "$rootfs") | sha256sum | cut -d' ' -f1)
    if [ "$force" = 0 ] && [ "$(label_of "$image" "$sha_label")" = "$sha" ]; then
        return
    fi
    local start previous container change changes=()
    start=$(now_ms)
    previous=$(image_id "$image")
    for change in "$@" 'ENTRYPOINT ["docker-entrypoint.sh"]' "LABEL $sha_label=$sha"; do
        changes+=(--change "$change")
    done
    mkdir -p "$work/entrypoint"
    install -m 0755 "$entrypoint" "$work/entrypoint/docker-entrypoint.sh"
    container=$(docker create ${stop_signal:+--stop-signal "$stop_signal"} "$rootfs")
    containers+=("$container")
    docker cp "$work/entrypoint/docker-entrypoint.sh" "$container:/usr/local/bin/docker-entrypoint.sh"
    docker commit "${changes[@]}" "$container" "$image" >/dev/null
    docker rm "$container" >/dev/null
    if [ -n "$previous" ] && [ "$previous" != "$(image_id "$image")" ]; then
        old_images+=("$previous")
    fi
    built=1
    echo "service-images: built $image in $(seconds_since "$start")"
}

old_images=()
built=0
build_rootfs_image "$rootfs_image" bookworm "${mmdebstrap_args[@]}"
build_rootfs_image "$rootfs17_image" trixie "${mmdebstrap17_args[@]}"
build_service_image "$postgres_image" "$rootfs_image" "$files/postgres-entrypoint.sh" SIGINT \
    "ENV PATH=/usr/lib/postgresql/15/bin:$default_path" 'ENV LANG=en_US.utf8' \
    'ENV PGDATA=/var/lib/postgresql/data' 'EXPOSE 5432' 'CMD ["postgres"]'
build_service_image "$postgres17_image" "$rootfs17_image" "$files/postgres-entrypoint.sh" SIGINT \
    "ENV PATH=/usr/lib/postgresql/17/bin:$default_path" 'ENV LANG=en_US.utf8' \
    'ENV PGDATA=/var/lib/postgresql/data' 'EXPOSE 5432' 'CMD ["postgres"]'
build_service_image "$redis_image" "$rootfs_image" "$files/redis-entrypoint.sh" '' \
    'WORKDIR /data' 'EXPOSE 6379' 'CMD ["redis-server"]'
build_service_image "$mariadb_image" "$rootfs_image" "$files/mariadb-entrypoint.sh" '' \
    'ENV LANG=C.UTF-8' 'EXPOSE 3306' 'CMD ["mariadbd"]'
# Drop what the rebuilt images replaced, the service images before the
# rootfs they are built on. One a container still uses stays, which is fine.
for ((i = ${#old_images[@]} - 1; i >= 0; i--)); do
    docker image rm "${old_images[i]}" >/dev/null 2>&1 || true
done
if [ "$built" = 0 ] && [ "$check" = 0 ]; then
    exit 0
fi

# The self-test: each image started as the product starts the official one,
# on a bind-mounted empty directory (run 1: initialization), then stopped
# and started again in a new container on the same directory (run 2). Each
# prints how long after `docker run` it accepted connections.
mkdir -p "$work/data/postgres15" "$work/data/postgres17" "$work/data/redis" "$work/data/mariadb"
prefix="cloudweb-service-check-$$"

start_container() { # NAME DOCKER_RUN_ARGS...
    containers+=("$1")
    docker run -d --name "$@" >/dev/null
}
# NAME START_MS COMMAND...: waits until COMMAND succeeds.
wait_ready() {
    local name=$1 start=$2 deadline=$((SECONDS + 120))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ "$(docker inspect --format '{{ .State.Running }}' "$name")" != true ] || [ "$SECONDS" -gt "$deadline" ]; then
            docker logs "$name" >&2 || true
            fail "$name did not become ready"
        fi
        sleep 0.1
    done
    echo "service-images: ${name#"$prefix-"} ready in $(seconds_since "$start")"
}
expect() { # WHAT EXPECTED ACTUAL
    [ "$2" = "$3" ] || fail "$1: expected '$2', got '$3'"
}
# WHAT MESSAGE COMMAND...: COMMAND must fail, saying MESSAGE.
refused() {
    local what=$1 message=$2 output
    shift 2
    if output=$("$@" 2>&1); then
        fail "$what succeeded"
    fi
    grep -q -- "$message" <<<"$output" || fail "$what failed without '$message': $output"
}
# Stops NAME as the product does, expecting a clean exit within the timeout.
stop_cleanly() {
    local start took
    start=$(now_ms)
    docker stop "$1" >/dev/null
    took=$(seconds_since "$start")
    expect "$1 exit code after docker stop" 0 "$(docker inspect --format '{{ .State.ExitCode }}' "$1")"
    echo "service-images: ${1#"$prefix-"} stopped cleanly in $took"
}

check_postgres() { # IMAGE MAJOR
    local image=$1 major=$2 dir="$work/data/postgres$2" url="postgresql://u:p@127.0.0.1:5432/d" start name
    pg() { docker exec "$name" psql -X -tA "$@"; }
    for run in 1 2; do
        name="$prefix-postgres$major-$run"
        start=$(now_ms)
        # The second run's password must be ignored: the data is used as is.
        start_container "$name" -e POSTGRES_PASSWORD="$([ "$run" = 1 ] && echo p || echo ignored)" \
            -e POSTGRES_USER=u -e POSTGRES_DB=d -v "$dir:/var/lib/postgresql/data" "$image"
        wait_ready "$name" "$start" docker exec "$name" pg_isready -q -h 127.0.0.1 -p 5432
        expect "postgres select 1" 1 "$(pg "$url" -c 'select 1')"
        expect "postgres major version" "$major" "$(pg "$url" -c 'show server_version' | cut -d. -f1)"
        refused "postgres with a wrong password" 'password authentication failed' \
            pg "postgresql://u:wrong@127.0.0.1:5432/d" -c 'select 1'
        expect "postgres PID 1" postgres "$(docker exec "$name" cat /proc/1/comm)"
        if [ "$run" = 1 ]; then
            expect "postgres encoding" UTF8 "$(pg "$url" -c 'show server_encoding')"
            pg "$url" -c 'create table kept (x int); insert into kept values (42)' >/dev/null
            stop_cleanly "$name"
        else
            expect "postgres data after a new container" 42 "$(pg "$url" -c 'select x from kept')"
        fi
    done
}

check_redis() {
    local dir="$work/data/redis" start name ip
    cli() { docker exec "$name" redis-cli --no-auth-warning -h 127.0.0.1 "$@"; }
    # CONTAINER HOST [ARGS]: whether redis-cli in CONTAINER gets PONG from HOST.
    pongs() { [ "$(docker exec "$1" redis-cli --no-auth-warning -h "$2" "${@:3}" ping 2>&1)" = PONG ]; }
    for run in 1 2; do
        name="$prefix-redis-$run"
        start=$(now_ms)
        start_container "$name" -v "$dir:/data" "$redis_image" redis-server --requirepass pw \
            --appendonly yes --dir /data --bind 0.0.0.0 --protected-mode no
        wait_ready "$name" "$start" pongs "$name" 127.0.0.1 -a pw
        expect "redis without the password" "NOAUTH Authentication required." "$(cli ping 2>&1)"
        expect "redis PID 1" redis-server "$(docker exec "$name" cat /proc/1/comm)"
        if [ "$run" = 1 ]; then
            expect "redis set" OK "$(cli -a pw set kept 42)"
            stop_cleanly "$name"
        else
            expect "redis data after a new container" 42 "$(cli -a pw get kept)"
        fi
    done
    # The default command: protected mode off, as in the official image, so
    # another container reaches it without a password.
    name="$prefix-redis-default"
    start=$(now_ms)
    start_container "$name" "$redis_image"
    ip=$(docker inspect --format '{{ .NetworkSettings.IPAddress }}' "$name")
    wait_ready "$name" "$start" pongs "$prefix-redis-2" "$ip"
}

check_mariadb() {
    local dir="$work/data/mariadb" start name
    sql() { # USER PASSWORD SQL
        docker exec -e MYSQL_PWD="$2" "$name" mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u "$1" -N -B d -e "$3"
    }
    for run in 1 2; do
        name="$prefix-mariadb-$run"
        start=$(now_ms)
        # MYSQL_* aliases for two of the four; the second run's must be ignored.
        start_container "$name" -e MARIADB_ROOT_PASSWORD="root$run" -e MYSQL_DATABASE=d \
            -e MARIADB_USER=u -e MYSQL_PASSWORD="$([ "$run" = 1 ] && echo p || echo ignored)" \
            -v "$dir:/var/lib/mysql" "$mariadb_image"
        wait_ready "$name" "$start" docker exec -e MYSQL_PWD=p "$name" mariadb-admin \
            --protocol=tcp -h 127.0.0.1 -u u ping
        expect "mariadb select 1" 1 "$(sql u p 'select 1')"
        expect "mariadb root over TCP" 1 "$(sql root root1 'select 1')"
        refused "mariadb with a wrong password" 'Access denied' sql u wrong 'select 1'
        expect "mariadb PID 1" mariadbd "$(docker exec "$name" cat /proc/1/comm)"
        if [ "$run" = 1 ]; then
            sql u p 'create table kept (x int); insert into kept values (42)'
            stop_cleanly "$name"
        else
            expect "mariadb data after a new container" 42 "$(sql u p 'select x from kept')"
        fi
    done
}

check_postgres "$postgres_image" 15
check_postgres "$postgres17_image" 17
check_redis
check_mariadb
echo "service-images: $postgres_image, $postgres17_image, $redis_image and $mariadb_image pass their checks"
