#!/bin/sh
# /usr/local/bin/docker-entrypoint.sh of cloudweb-test/redis:7 (built by
# scripts/service-images.sh from Debian's redis-server). It follows the
# official redis image's entrypoint: a first argument that is an option
# (-x, --x) or a *.conf file means `redis-server ARGS...`; redis-server runs
# as the redis user with the working directory (/data) chowned to it; any
# other command runs as it is. No /etc/redis config is read: the server gets
# only its arguments (the compiled defaults: port 6379, dir ./, every address).
# valkey-server and valkey-cli are the same programs, as the valkey/valkey
# image's commands.
set -eu

if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi

server=$1
case "$server" in
redis-server | valkey-server) ;;
*) exec "$@" ;;
esac

if [ "$(id -u)" = 0 ]; then
    find . \! -user redis -exec chown redis '{}' +
    exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi

# The official image's redis-server is built with protected mode off by
# default; Debian's is not. `--protected-mode no` goes before the caller's
# arguments (after a config file, which redis wants first), so a value they
# give still wins. Not before the options redis wants alone (--version...).
shift
case "${1:-}" in
-v | --version | -h | --help | --test-memory | --check-system) set -- "$server" "$@" ;;
-*| '') set -- "$server" --protected-mode no "$@" ;;
*)
    conf=$1
    shift
    set -- "$server" "$conf" --protected-mode no "$@"
    ;;
esac

# Like the official image: private files unless the caller chose a umask.
if [ "$(umask)" = 0022 ]; then
    umask 0077
fi
exec "$@"
