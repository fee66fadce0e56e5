#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests, never a system-wide one.
#
#   Scripts/postgres-test-cluster.sh start DIR   initdb a cluster in DIR (owned by postgres, mode 0700), unix
#                                                socket in DIR, a free port, no TCP listener, fsync on; start it;
#                                                create the role and database `lattice`; print the URL on stdout.
#   Scripts/postgres-test-cluster.sh stop DIR    stop it (fast shutdown) and remove DIR.
#   Scripts/postgres-test-cluster.sh url DIR     print the URL of a running cluster.
#
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user; otherwise as
# the calling user. Both commands are idempotent: starting a running cluster prints its URL, stopping a
# missing one does nothing. A failed start stops what it started and removes DIR.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
command=${1:-}
dir=${2:-}
if [ -z "$command" ] || [ -z "$dir" ]; then
    echo "usage: $0 start|stop|url DIR" >&2
    exit 2
fi
case "$dir" in
    /*) ;;
    *) dir="$(pwd)/$dir" ;;
esac

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

url() {
    local port
    port=$(cat "$dir/port")
    echo "postgresql:///lattice?host=$dir&port=$port&user=lattice"
}

running() {
    [ -f "$dir/data/postmaster.pid" ] && as_owner "$PG_BIN/pg_ctl" -D "$dir/data" status >/dev/null 2>&1
}

free_port() {
    # A port nothing listens on (TCP or a unix socket of ours), between 20000 and 60000.
    local port
    for _ in $(seq 1 50); do
        port=$((20000 + RANDOM % 40000))
        if ! ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && [ ! -e "$dir/.s.PGSQL.$port" ]; then
            echo "$port"
            return 0
        fi
    done
    echo "no free port found" >&2
    return 1
}

stop() {
    if [ -d "$dir/data" ] && running; then
        as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
}

start() {
    if [ -d "$dir/data" ] && [ -f "$dir/port" ] && running; then
        url
        return 0
    fi
    [ -x "$PG_BIN/initdb" ] || { echo "PostgreSQL server binaries not found in $PG_BIN (install postgresql-15)" >&2; exit 1; }
    rm -rf "$dir"
    mkdir -p "$dir"
    trap 'stop; exit 1' ERR
    if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"; fi
    chmod 0700 "$dir"
    as_owner "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C >"$dir/initdb.log" 2>&1
    local port
    port=$(free_port)
    echo "$port" >"$dir/port"
    cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
port = $port
unix_socket_directories = '$dir'
fsync = on
synchronous_commit = on
max_connections = 400
shared_buffers = 64MB
CONF
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    as_owner "$PG_BIN/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
        -c "CREATE ROLE lattice LOGIN CREATEDB SUPERUSER" -c "CREATE DATABASE lattice OWNER lattice" >/dev/null
    trap - ERR
    url
}

case "$command" in
    start) start ;;
    stop) stop ;;
    url) url ;;
    *) echo "usage: $0 start|stop|url DIR" >&2; exit 2 ;;
esac
