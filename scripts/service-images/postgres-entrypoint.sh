#!/bin/bash
# /usr/local/bin/docker-entrypoint.sh of cloudweb-test/postgres:15 (built by
# scripts/service-images.sh from Debian's postgresql-15). It follows the
# official postgres image's contract, so the product runs it as it runs
# postgres:16:
#   POSTGRES_PASSWORD          the superuser's password; required unless
#                              POSTGRES_HOST_AUTH_METHOD=trust
#   POSTGRES_USER              the superuser's name (default postgres)
#   POSTGRES_DB                a database created at initialization (default
#                              POSTGRES_USER)
#   POSTGRES_HOST_AUTH_METHOD  pg_hba.conf method for TCP (default scram-sha-256)
#   POSTGRES_INITDB_ARGS       extra initdb arguments (split at blanks)
#   PGDATA                     the data directory (default /var/lib/postgresql/data)
# Each *_FILE variant (POSTGRES_PASSWORD_FILE...) names a file holding the value.
# A PGDATA without PG_VERSION is initialized; one with it is used as it is.
set -Eeuo pipefail

# NAME_FILE, when set, is a file holding NAME's value.
file_env() {
    local name=$1 file_var="$1_FILE"
    if [ -n "${!file_var:-}" ]; then
        printf -v "$name" '%s' "$(<"${!file_var}")"
        export "${name?}"
    fi
}

# `docker run IMAGE -c shared_buffers=256MB`: options for the server.
if [ "${1:0:1}" = - ]; then
    set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
    exec "$@"
fi
export PGDATA=${PGDATA:-/var/lib/postgresql/data}

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chmod 00700 "$PGDATA"
    chown postgres:postgres /var/run/postgresql
    chmod 03775 /var/run/postgresql
    find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
    # The same script again as postgres; its exec leaves the server as PID 1.
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    file_env POSTGRES_PASSWORD
    file_env POSTGRES_USER
    file_env POSTGRES_DB
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
    password=${POSTGRES_PASSWORD:-}
    if [ -z "$password" ] && [ "$auth" != trust ]; then
        echo 'Error: Database is uninitialized and superuser password is not specified.' >&2
        echo '       Set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust).' >&2
        exit 1
    fi
    read -r -a extra_args <<<"${POSTGRES_INITDB_ARGS:-}"
    init_args=(--username="$user" --auth-local=trust --auth-host="$auth" -D "$PGDATA")
    if [ -n "$password" ]; then
        # The password reaches initdb on stdin, never on a command line.
        initdb "${init_args[@]}" --pwfile=/dev/stdin "${extra_args[@]}" <<<"$password"
    else
        initdb "${init_args[@]}" "${extra_args[@]}" </dev/null
    fi
    printf '\nhost all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"
    printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        # A temporary server on the unix socket only, so nobody connects
        # over TCP before the database exists.
        pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
        psql -v ON_ERROR_STOP=1 --no-password --no-psqlrc --username="$user" \
            --dbname=postgres --set=db="$db" <<<'CREATE DATABASE :"db";'
        pg_ctl -D "$PGDATA" -m fast -w stop
    fi
    echo 'PostgreSQL init process complete; ready for start up.'
fi

exec "$@"
