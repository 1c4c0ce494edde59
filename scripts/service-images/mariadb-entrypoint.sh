#!/bin/bash
# /usr/local/bin/docker-entrypoint.sh of cloudweb-test/mariadb:10 (built by
# scripts/service-images.sh from Debian's mariadb-server). It follows the
# official mariadb image's contract, so the product runs it as it runs
# mariadb:11. Each MARIADB_X may also be given as MYSQL_X, and as X_FILE
# (a file holding the value):
#   MARIADB_ROOT_PASSWORD               root's password, for root@localhost and
#                                       root@MARIADB_ROOT_HOST (default '%'); or
#   MARIADB_ALLOW_EMPTY_ROOT_PASSWORD   =1 (or yes): root without a password; or
#   MARIADB_RANDOM_ROOT_PASSWORD        =1: a random one, printed to the log
#   MARIADB_DATABASE                    a database created at initialization
#   MARIADB_USER, MARIADB_PASSWORD      a user@'%' with all rights on it
#   MARIADB_INITDB_SKIP_TZINFO          =1: no time zone tables
# The data directory is /var/lib/mysql; one without a mysql/ directory is
# initialized, one with it is used as it is. The server listens on port 3306
# of every IPv4 address (bind-address=0.0.0.0, skip-name-resolve).
set -Eeuo pipefail

# Prints MARIADB_NAME, else MYSQL_NAME, else the contents of their _FILE.
env_value() {
    local var
    for var in "MARIADB_$1" "MYSQL_$1"; do
        if [ -n "${!var:-}" ]; then
            printf '%s' "${!var}"
            return
        fi
        var="${var}_FILE"
        if [ -n "${!var:-}" ]; then
            printf '%s' "$(<"${!var}")"
            return
        fi
    done
}

# A value inside '...' or `...` of SQL.
sql_string() { local s=${1//\\/\\\\}; printf '%s' "${s//\'/\\\'}"; }
sql_name() { printf '%s' "${1//\`/\`\`}"; }
truthy() { case "$1" in 1 | yes | true) return 0 ;; *) return 1 ;; esac; }

if [ "${1:0:1}" = - ]; then
    set -- mariadbd "$@"
fi
case "$1" in
mariadbd | mysqld) ;;
*) exec "$@" ;;
esac
for arg in "$@"; do
    case "$arg" in
    -'?' | --help | --print-defaults | -V | --version) exec "$@" ;;
    esac
done

datadir=/var/lib/mysql
socket=/run/mysqld/mysqld.sock
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$datadir" /run/mysqld
    chmod 1777 /run/mysqld
    find "$datadir" /run/mysqld \! -user mysql -exec chown mysql:mysql '{}' +
    # The same script again as mysql; its exec leaves the server as PID 1.
    exec setpriv --reuid=mysql --regid=mysql --init-groups "$0" "$@"
fi

if [ ! -d "$datadir/mysql" ]; then
    root_password=$(env_value ROOT_PASSWORD)
    allow_empty_root_password=$(env_value ALLOW_EMPTY_ROOT_PASSWORD)
    random_root_password=$(env_value RANDOM_ROOT_PASSWORD)
    root_host=$(env_value ROOT_HOST)
    database=$(env_value DATABASE)
    user=$(env_value USER)
    password=$(env_value PASSWORD)
    initdb_skip_tzinfo=$(env_value INITDB_SKIP_TZINFO)
    if [ -z "$root_password" ] && ! truthy "$allow_empty_root_password" && ! truthy "$random_root_password"; then
        echo 'error: Database is uninitialized and password option is not specified' >&2
        echo '       You need to specify one of MARIADB_ROOT_PASSWORD, MARIADB_ALLOW_EMPTY_ROOT_PASSWORD and MARIADB_RANDOM_ROOT_PASSWORD' >&2
        exit 1
    fi
    if [ "$user" = root ]; then
        echo 'error: MARIADB_USER="root", MARIADB_USER and MARIADB_PASSWORD are for configuring a regular user and cannot be used for the root user' >&2
        exit 1
    fi
    if [ -n "$user" ] && [ -z "$password" ]; then
        echo "error: MARIADB_USER=$user specified, but missing MARIADB_PASSWORD" >&2
        exit 1
    fi
    if [ -z "$root_password" ] && truthy "$random_root_password"; then
        root_password=$(head -c 24 /dev/urandom | base64)
        echo "GENERATED ROOT PASSWORD: $root_password"
    fi
    root_host=${root_host:-%}

    echo 'Initializing database files'
    mariadb-install-db --datadir="$datadir" --rpm --auth-root-authentication-method=normal \
        --skip-test-db --skip-name-resolve --default-time-zone=SYSTEM --skip-log-bin \
        --expire-logs-days=0 "${@:2}" >/dev/null
    # A temporary server on the socket only, so nobody connects over TCP
    # before the users exist.
    "$@" --skip-networking --socket="$socket" --default-time-zone=SYSTEM --skip-log-bin \
        --wsrep_on=OFF --expire-logs-days=0 --skip-slave-start &
    pid=$!
    client=(mariadb --protocol=socket --socket="$socket" -uroot --database=mysql --binary-mode)
    for _ in $(seq 300); do
        if "${client[@]}" -e 'SELECT 1' >/dev/null 2>&1; then
            break
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo 'error: the temporary server did not start' >&2
            exit 1
        fi
        sleep 0.1
    done
    # Passwords reach the server in SQL on stdin, never on a command line.
    {
        echo 'SET @@SESSION.SQL_LOG_BIN=0;'
        if ! truthy "$initdb_skip_tzinfo"; then
            mariadb-tzinfo-to-sql --skip-write-binlog /usr/share/zoneinfo 2>/dev/null
        fi
        root_pw=$(sql_string "$root_password")
        echo "DROP USER IF EXISTS root@'127.0.0.1', root@'::1';"
        printf '%s\n' "EXECUTE IMMEDIATE CONCAT('DROP USER IF EXISTS root@\\'', @@hostname, '\\'');"
        echo "SET PASSWORD FOR 'root'@'localhost' = PASSWORD('$root_pw');"
        if [ "$root_host" != localhost ]; then
            host=$(sql_string "$root_host")
            echo "CREATE USER 'root'@'$host' IDENTIFIED BY '$root_pw';"
            echo "GRANT ALL ON *.* TO 'root'@'$host' WITH GRANT OPTION;"
            echo "GRANT PROXY ON ''@'%' TO 'root'@'$host' WITH GRANT OPTION;"
        fi
        if [ -n "$database" ]; then
            echo "CREATE DATABASE IF NOT EXISTS \`$(sql_name "$database")\`;"
        fi
        if [ -n "$user" ]; then
            user_sql=$(sql_string "$user")
            echo "CREATE USER '$user_sql'@'%' IDENTIFIED BY '$(sql_string "$password")';"
            if [ -n "$database" ]; then
                echo "GRANT ALL ON \`$(sql_name "$database")\`.* TO '$user_sql'@'%';"
            fi
        fi
    } | "${client[@]}"
    kill "$pid"
    wait "$pid"
    echo 'MariaDB init process done. Ready for start up.'
fi

exec "$@"
