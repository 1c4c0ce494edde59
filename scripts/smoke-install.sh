#!/usr/bin/env bash
# Smoke test of scripts/install.sh, as CI runs it: installs cloud-web under a
# temporary root with its own ports (so it cannot clash with other tests or
# an installation on this host), twice (a second run must work too), checks
# that the example app answers over HTTPS through Caddy with a certificate
# of Caddy's internal CA and that the second run deployed nothing new,
# uninstalls, and checks that nothing is left: no process naming the
# install's directories, no container of its node, no listener on its
# ports, no directory, and (when no other agent runs on this host) no
# build network or firewall rule of its bridge. Then installs once more
# with --no-ingress: the node reports no ingress, nothing answers on the
# HTTP(S) ports, the installer prints no example URL; and uninstalls.
#
#   sudo scripts/smoke-install.sh [BIN_DIR]
#
# BIN_DIR holds prebuilt cloudweb-server and cloudweb-agent (default
# target/debug, which scripts/test.sh builds). Needs root and Docker.
# The whole run is bounded (CLOUDWEB_SMOKE_TIMEOUT seconds, default 600).
set -euo pipefail
shopt -s inherit_errexit
script=$(realpath "$0")
cd "$(dirname "$script")/.."

say() { echo "smoke-install: $*"; }
fail() { echo "smoke-install: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (the installer does)"
bin_dir=$(realpath "${1:-target/debug}")
[ -x "$bin_dir/cloudweb-server" ] && [ -x "$bin_dir/cloudweb-agent" ] || fail "no binaries in $bin_dir (cargo build --bins)"

# Re-run under a time limit; the inner run does the work.
if [ -z "${CLOUDWEB_SMOKE_INNER:-}" ]; then
    CLOUDWEB_SMOKE_INNER=1 exec timeout --kill-after=30 "${CLOUDWEB_SMOKE_TIMEOUT:-600}" bash "$script" "$@"
fi

root=$(mktemp -d /tmp/cloudweb-smoke.XXXXXX)
# Ports the kernel hands out now; the window until the services bind them
# is short.
read -r api_port agent_port registry_port http_port https_port git_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
app="hello-$(printf '%04x' $((RANDOM % 65536)))"
# The mesh is on (the installer's default), on an interface and UDP port of
# this run's own, so it cannot clash with cw0 or another run.
mesh_interface="cws$(printf '%04x' $((RANDOM % 65536)))"
mesh_port=$(python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
export CLOUDWEB_ROOT=$root CLOUDWEB_PREBUILT=$bin_dir CLOUDWEB_NO_SYSTEMD=1 \
    CLOUDWEB_API_PORT=$api_port CLOUDWEB_AGENT_PORT=$agent_port CLOUDWEB_REGISTRY_PORT=$registry_port \
    CLOUDWEB_HTTP_PORT=$http_port CLOUDWEB_HTTPS_PORT=$https_port CLOUDWEB_GIT_PORT=$git_port \
    CLOUDWEB_LISTEN_ADDRESS=127.0.0.1 CLOUDWEB_HOST_ADDRESS=127.0.0.1 CLOUDWEB_EXAMPLE_APP=$app \
    CLOUDWEB_MESH_INTERFACE=$mesh_interface CLOUDWEB_MESH_PORT=$mesh_port CLOUDWEB_MESH=auto
ports=("$api_port" "$agent_port" "$registry_port" "$http_port" "$https_port" "$git_port")
agent_dir=$root/var/lib/cloudweb-agent
node_id=''
uninstalled=false

dump_logs() {
    local log
    for log in "$root"/var/log/cloudweb/*.log; do
        [ -f "$log" ] || continue
        echo "--- $log (last 40 lines)" >&2
        tail -n 40 "$log" >&2
    done
}

# The replicas phase's second host and database (see the end).
root2=''
pg=''
as_second() { # runs a command with the second install's environment
    CLOUDWEB_ROOT=$root2 CLOUDWEB_API_PORT=$api_port2 CLOUDWEB_AGENT_PORT=$agent_port2 CLOUDWEB_REGISTRY_PORT=$registry_port2 \
        CLOUDWEB_HTTP_PORT=$http_port2 CLOUDWEB_HTTPS_PORT=$https_port2 CLOUDWEB_GIT_PORT=$git_port2 CLOUDWEB_MESH=off \
        CLOUDWEB_NODE_NAME=second-host "$@"
}

# Whatever happens, nothing of this run may stay behind.
on_exit() {
    local status=$?
    if [ "$status" != 0 ]; then
        dump_logs
        if [ -n "$root2" ]; then root=$root2 dump_logs; fi
    fi
    if [ -n "$root2" ]; then
        as_second bash scripts/install.sh --uninstall >/dev/null 2>&1 || true
        rm -rf "$root2"
    fi
    if ! $uninstalled; then
        CLOUDWEB_MESH=${first_mesh:-$CLOUDWEB_MESH} bash scripts/install.sh --uninstall >/dev/null 2>&1 || true
    fi
    if [ -n "$pg" ]; then
        runuser -u postgres -- "$pgbin/pg_ctl" -D "$pg/data" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$pg"
    fi
    rm -rf "$root"
    exit "$status"
}
trap on_exit EXIT
# A timeout's SIGTERM must still clean up.
trap 'exit 143' TERM INT

say "the installer refuses an unknown option"
if bash scripts/install.sh --bogus >/dev/null 2>&1; then fail "install.sh --bogus succeeded"; fi

# The uninstall's removal of the build network and its bridge's firewall
# rules, against stand-ins for docker, iptables and pgrep (the real ones
# are shared with whatever else runs on this host): the network goes, then
# exactly the rules naming cw-build0 (not cw-build00), by argv.
say "the uninstall removes the build network and only its bridge's rules"
stubs=$(mktemp -d "$root/stubs.XXXXXX")
cat > "$stubs/iptables" <<'STUB'
#!/bin/bash
echo "iptables $*" >> "$STUB_LOG"
if [ "$2" = -S ]; then
    case "$3" in
        INPUT) printf -- '-P INPUT ACCEPT\n-A INPUT -i cw-build0 -j DROP\n-A INPUT -i cw-build00 -j DROP\n' ;;
        DOCKER-USER) printf -- '-N DOCKER-USER\n-A DOCKER-USER -d 10.0.0.0/8 -i cw-build0 -j DROP\n-A DOCKER-USER -j RETURN\n' ;;
        FORWARD) printf -- '-P FORWARD DROP\n' ;;
    esac
fi
STUB
cat > "$stubs/docker" <<'STUB'
#!/bin/bash
echo "docker $*" >> "$STUB_LOG"
case "$*" in *--format*) echo build-network ;; esac
STUB
printf '#!/bin/bash\nexit 1\n' > "$stubs/pgrep"
chmod +x "$stubs"/*
STUB_LOG=$stubs/log PATH=$stubs:$PATH bash -c 'set -euo pipefail
    source <(sed -n "/^build_network=cloudweb-build/,/^}/p" scripts/install.sh)
    remove_build_network' >/dev/null || fail "remove_build_network failed"
expected='docker network rm cloudweb-build
iptables -w -D INPUT -i cw-build0 -j DROP
iptables -w -D DOCKER-USER -d 10.0.0.0/8 -i cw-build0 -j DROP'
actual=$(grep -E '^(docker network rm|iptables -w -D)' "$stubs/log")
[ "$actual" = "$expected" ] || fail "the uninstall removed: $actual"
# With another agent running, nothing is touched.
printf '#!/bin/bash\nexit 0\n' > "$stubs/pgrep"
: > "$stubs/log"
STUB_LOG=$stubs/log PATH=$stubs:$PATH bash -c 'set -euo pipefail
    source <(sed -n "/^build_network=cloudweb-build/,/^}/p" scripts/install.sh)
    remove_build_network' >/dev/null || fail "remove_build_network failed"
! grep -qE '^(docker network rm|iptables -w -D)' "$stubs/log" || fail "the uninstall removed shared things while another agent runs"

# The installer's API calls keep the admin token out of curl's argv
# (readable by every user in /proc/*/cmdline) and hand it over as a header
# file.
say "the installer reads no JSON itself (the binaries print what it needs)"
! grep -nE 'json\.load|python3 -c .*json|jq ' scripts/install.sh crates/http/src/agent_api/node.sh || fail "JSON parsed in a shell script"

say "the admin token is not in curl's argv"
cat > "$stubs/curl" <<'STUB'
#!/bin/bash
echo "argv: $*" >> "$STUB_LOG"
previous=''
for arg in "$@"; do
    if [ "$previous" = -H ] && [ "${arg:0:1}" = @ ]; then echo "header: $(cat "${arg:1}")" >> "$STUB_LOG"; fi
    previous=$arg
done
STUB
chmod +x "$stubs/curl"
echo "smoke-secret-token" > "$stubs/admin-token"
: > "$stubs/log"
STUB_LOG=$stubs/log PATH=$stubs:$PATH admin_token_file=$stubs/admin-token api=http://127.0.0.1:1 bash -c 'set -euo pipefail
    source <(grep -E "^auth_header\(\)" scripts/install.sh; sed -n "/^api_send() {/,/^}/p" scripts/install.sh)
    declare -F api_send >/dev/null
    api_send DELETE /api/apps/x' || fail "api_send failed"
grep -q '^header: Authorization: Bearer smoke-secret-token$' "$stubs/log" || fail "no Authorization header file: $(cat "$stubs/log")"
! grep '^argv:' "$stubs/log" | grep -q smoke-secret-token || fail "the admin token is in curl's argv: $(cat "$stubs/log")"
rm -rf "$stubs"

say "installing under $root (API $api_port, agents $agent_port, HTTPS $https_port)"
bash scripts/install.sh > "$root.install-1.log" 2>&1 || { cat "$root.install-1.log" >&2; rm -f "$root.install-1.log"; fail "the first install"; }
rm -f "$root.install-1.log"
node_id=$("$bin_dir/cloudweb-agent" --data-dir "$agent_dir" node-id)
say "installed; node $node_id"

# The user API as the installer calls it (the token through a pipe).
api_get() {
    curl -fsS --max-time 10 -H @<(printf 'Authorization: Bearer %s\n' "$(<"$root/var/lib/cloudweb/admin-token")") \
        "http://127.0.0.1:$api_port$1"
}
# The ids of the example's deployments (the app is recreated when the
# installer deploys it again, so a count would not tell).
deployments() { api_get "/api/apps/$app/deployments" | python3 -c 'import json, sys; print(" ".join(d["id"] for d in json.load(sys.stdin)["deployments"]))'; }
before=$(deployments)
[ -n "$before" ] || fail "the first install deployed no example"

say "installing again over it"
output=$(bash scripts/install.sh 2>&1) || { echo "$output" >&2; fail "the second install"; }
after=$(deployments)
[ "$after" = "$before" ] || { echo "$output" >&2; fail "the second install deployed the example again (deployments $before before, $after after)"; }
grep -q "$app is already running; not deploying it again" <<<"$output" || { echo "$output" >&2; fail "the second install did not say the example runs"; }
grep -q "example app:  https://$app.localhost:$https_port/" <<<"$output" || { echo "$output" >&2; fail "the installer did not print the example's URL"; }
grep -q "Deploy your own" <<<"$output" || fail "the installer did not say how to deploy an app"
[ "$("$bin_dir/cloudweb-agent" --data-dir "$agent_dir" node-id)" = "$node_id" ] || fail "the second run changed the node's identity"

# The single-node footprint (issue 21 item 1): every process of this
# install, by resident memory. Printed, not judged: these are debug
# binaries (cloudweb-bench has the release figures and their targets).
footprint=$(ps -eo rss=,args= | awk -v root="$root" -v wg="$mesh_interface" '
    $2 !~ /awk$/ && (index($0, root) || ($2 ~ /wireguard-go$/ && index($0, wg))) {
        kib += $1; n = split($2, path, "/"); each = each sprintf(" %s %.1f", path[n], $1 / 1024) }
    END { printf "%.1f MiB (MiB each:%s)", kib / 1024, each }')
say "single-node footprint (control plane, registry, agent, Caddy, wireguard-go): $footprint"

say "the binaries are installed without debug info, which is kept beside them"
installed=$root/usr/local/bin
for binary in cloudweb-server cloudweb-agent cloudweb; do
    ! readelf -S "$installed/$binary" | grep -q '\.debug_line' || fail "$binary was installed with its debug info"
    readelf -S "$installed/.debug/$binary.debug" | grep -q '\.debug_line' || fail "no debug info kept in $installed/.debug/$binary.debug"
    readelf --string-dump=.gnu_debuglink "$installed/$binary" | grep -q "$binary.debug" || fail "$binary does not link to its debug file"
done

# Mesh-only services: the registry listens on the mesh address alone, and
# the example's instance port is published there, never on 0.0.0.0.
say "the registry and the instance listen only on the mesh address"
ip -4 -o address show dev "$mesh_interface" | grep -q 'inet 10\.77\.0\.1/16' || fail "$mesh_interface does not hold 10.77.0.1/16: $(ip -o address show dev "$mesh_interface" 2>&1)"
listeners=$(ss -Htln "sport = :$registry_port" | awk '{print $4}')
[ "$listeners" = "10.77.0.1:$registry_port" ] || fail "the registry listens on: $listeners"
instance_ports=$(docker ps --filter "label=cloudweb.node=$node_id" --filter "label=cloudweb.app=$app" --format '{{.Ports}}')
[ -n "$instance_ports" ] || fail "no instance of $app found"
grep -qE '^10\.77\.0\.1:[0-9]+->' <<<"$instance_ports" || fail "the instance is published on: $instance_ports"
! grep -qE '0\.0\.0\.0|\[::\]' <<<"$instance_ports" || fail "the instance is published on every interface: $instance_ports"

say "fetching https://$app.localhost:$https_port/ through Caddy"
caddy_root=$agent_dir/caddy/data/caddy/pki/authorities/local/root.crt
[ -f "$caddy_root" ] || fail "no Caddy internal CA at $caddy_root"
page=$(curl -fsS --max-time 10 --cacert "$caddy_root" --resolve "$app.localhost:$https_port:127.0.0.1" \
    "https://$app.localhost:$https_port/") || fail "HTTPS request to the example app"
grep -q 'Hello from cloud-web' <<<"$page" || fail "unexpected page: $page"
redirect=$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' --resolve "$app.localhost:$http_port:127.0.0.1" \
    "http://$app.localhost:$http_port/")
[ "$redirect" = 308 ] || [ "$redirect" = 301 ] || [ "$redirect" = 302 ] || fail "plain HTTP answered $redirect, not a redirect"
say "the cloudweb CLI is installed and logged in for root"
cli_apps=$(XDG_CONFIG_HOME="$root/root/.config" "$root/usr/local/bin/cloudweb" apps) || fail "the installed CLI does not list the apps"
grep -q "$app" <<<"$cli_apps" || fail "the installed CLI lists no $app: $cli_apps"

# Uninstalls and checks that nothing of the install is left.
uninstall_and_check() {
    local output leftovers='' proc cmdline containers port remaining
    output=$(bash scripts/install.sh --uninstall 2>&1) || { echo "$output" >&2; fail "the uninstall"; }
    uninstalled=true
    for proc in /proc/[0-9]*; do
        cmdline=$(tr '\0' ' ' 2>/dev/null < "$proc/cmdline") || continue
        case "$cmdline" in *"$root/"*) leftovers="$leftovers ${proc#/proc/}:$cmdline" ;; esac
    done
    [ -z "$leftovers" ] || fail "processes left running:$leftovers"
    containers=$(docker ps -a --filter "label=cloudweb.node=$node_id" --format '{{.Names}}')
    [ -z "$containers" ] || fail "containers left: $containers"
    for port in "${ports[@]}"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            fail "something still listens on port $port"
        fi
    done
    remaining=$(find "$root" -mindepth 1 -not -type d 2>/dev/null | head -5)
    [ -z "$remaining" ] || fail "files left: $remaining"
    [ ! -e "/etc/docker/certs.d/10.77.0.1:$registry_port" ] || fail "the registry CA was left in /etc/docker/certs.d"
    ! ip link show dev "$mesh_interface" >/dev/null 2>&1 || fail "the mesh interface $mesh_interface was left"
    # The build network and its bridge's firewall rules are shared by every
    # agent on the host: the uninstall keeps them while another one runs
    # (as during a parallel test run) and says so.
    if grep -q "another cloudweb-agent runs on this host" <<<"$output"; then
        say "note: other agents run here, so the build network check was skipped"
    else
        ! docker network inspect cloudweb-build >/dev/null 2>&1 || { echo "$output" >&2; fail "the cloudweb-build network was left"; }
        if command -v iptables >/dev/null; then
            ! iptables -w -S 2>/dev/null | grep -qE -- "-i cw-build0( |$)" || { echo "$output" >&2; fail "firewall rules of cw-build0 were left"; }
        fi
    fi
}

say "uninstalling"
uninstall_and_check
say "ok: installed twice, served $app over HTTPS, uninstalled without leftovers"

say "installing with --no-ingress"
uninstalled=false
output=$(bash scripts/install.sh --no-ingress 2>&1) || { echo "$output" >&2; fail "the --no-ingress install"; }
node_id=$("$bin_dir/cloudweb-agent" --data-dir "$agent_dir" node-id)
ingress=$(api_get "/api/nodes/$node_id" | python3 -c 'import json, sys; print(json.load(sys.stdin)["ingress"])')
[ "$ingress" = False ] || fail "with --no-ingress, node $node_id reports ingress: $ingress"
! grep -q "https://$app.localhost" <<<"$output" || { echo "$output" >&2; fail "with --no-ingress the installer printed the example's URL"; }
grep -q "example app:  not deployed" <<<"$output" || { echo "$output" >&2; fail "with --no-ingress the installer did not say the example is not deployed"; }
[ -z "$(deployments 2>/dev/null || true)" ] || fail "with --no-ingress the example was deployed"
for port in "$http_port" "$https_port"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        fail "with --no-ingress something listens on the ingress port $port"
    fi
done
uninstall_and_check
say "ok: --no-ingress install has no ingress and no example, uninstalled without leftovers"

# Two control-plane replicas on one PostgreSQL database (issue 24): the
# first install keeps its state there (--database-url), a second one under
# another root, given the first's master key and admin token, adds a
# replica and a node (--join-control-plane). Without the mesh: two mesh
# nodes on one host would share 10.77.0.0/16.
say "two control-plane replicas on PostgreSQL (--database-url, --join-control-plane)"
pgbin=''
for candidate in /usr/lib/postgresql/*/bin; do
    [ -x "$candidate/initdb" ] || continue
    if [ -z "$pgbin" ] || [ "$(printf '%s\n%s\n' "$pgbin" "$candidate" | sort -V | tail -n 1)" = "$candidate" ]; then pgbin=$candidate; fi
done
[ -n "$pgbin" ] || fail "PostgreSQL's server programs are not installed (scripts/deps.sh)"
pg=$(mktemp -d /tmp/cloudweb-smoke-pg.XXXXXX)
chown postgres "$pg"
runuser -u postgres -- "$pgbin/initdb" -D "$pg/data" --auth=trust --username=postgres --encoding=UTF8 --locale=C --no-sync >/dev/null \
    || fail "initdb"
runuser -u postgres -- "$pgbin/pg_ctl" -D "$pg/data" -o "-k $pg -c listen_addresses=" -l "$pg/server.log" -w start >/dev/null \
    || fail "PostgreSQL did not start: $(cat "$pg/server.log")"
runuser -u postgres -- "$pgbin/createdb" -h "$pg" -U postgres cloudweb || fail "createdb"
db_url="postgres://postgres@localhost/cloudweb?host=$pg"
read -r api_port2 agent_port2 registry_port2 http_port2 https_port2 git_port2 < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
first_mesh=off
uninstalled=false
output=$(CLOUDWEB_MESH=off bash scripts/install.sh --no-ingress --database-url "$db_url" 2>&1) || { echo "$output" >&2; fail "the install on PostgreSQL"; }
server_cmdline=$(tr '\0' ' ' < "/proc/$(cat "$root/run/cloudweb/cloudweb-server.pid")/cmdline") || fail "cannot read the control plane's command line"
grep -q -- "serve" <<<"$server_cmdline" || fail "not the control plane's command line: $server_cmdline"
! grep -qF -- "$db_url" <<<"$server_cmdline" || fail "the database URL is on the control plane's command line"
[ "$(stat -c %a "$root/var/lib/cloudweb/database.env")" = 600 ] || fail "database.env is not mode 0600"
root2=$(mktemp -d /tmp/cloudweb-smoke2.XXXXXX)
say "refusals: --join-control-plane without --database-url, or without the master key"
output=$(as_second bash scripts/install.sh --join-control-plane "https://127.0.0.1:$agent_port" 2>&1) && fail "--join-control-plane without --database-url was accepted"
grep -q "needs --database-url" <<<"$output" || { echo "$output" >&2; fail "the refusal does not say --database-url is needed"; }
output=$(as_second bash scripts/install.sh --no-ingress --database-url "$db_url" --join-control-plane "https://127.0.0.1:$agent_port" 2>&1) \
    && fail "--join-control-plane without the master key was accepted"
grep -q "copy master.key" <<<"$output" || { echo "$output" >&2; fail "the refusal does not say to copy the master key"; }
install -d -m 0700 "$root2/var/lib/cloudweb"
for file in master.key admin-token; do
    install -m 0600 "$root/var/lib/cloudweb/$file" "$root2/var/lib/cloudweb/$file"
done
say "adding a replica under $root2 (API $api_port2, agents $agent_port2)"
output=$(as_second bash scripts/install.sh --no-ingress --database-url "$db_url" --join-control-plane "https://127.0.0.1:$agent_port" 2>&1) \
    || { echo "$output" >&2; fail "the replica's install"; }
grep -q "cloud-web runs a control-plane replica here" <<<"$output" || { echo "$output" >&2; fail "the replica's install did not say what it made"; }
planes=$(XDG_CONFIG_HOME="$root2/root/.config" "$root2/usr/local/bin/cloudweb" --json nodes control-planes) || fail "the replica's CLI cannot list the replicas"
python3 - "$planes" "https://127.0.0.1:$agent_port" "https://127.0.0.1:$agent_port2" <<'PY' || fail "the replicas listed: $planes"
import json, sys
planes = json.loads(sys.argv[1])
urls = {r["url"]: r for r in planes["replicas"]}
assert planes["database"] == "postgres", planes
assert set(urls) == {sys.argv[2], sys.argv[3]}, urls
assert urls[sys.argv[2]]["leader"] and not urls[sys.argv[3]]["leader"], urls
assert urls[sys.argv[3]]["this_replica"] and all(r["state"] == "live" for r in urls.values()), urls
PY
nodes=$(api_get /api/nodes | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["nodes"]))')
[ "$nodes" = 2 ] || fail "the cluster has $nodes nodes, not 2 (one per host)"
say "uninstalling both"
as_second bash scripts/install.sh --uninstall >/dev/null 2>&1 || fail "the replica's uninstall"
rm -rf "$root2"
root2=''
CLOUDWEB_MESH=off bash scripts/install.sh --uninstall >/dev/null 2>&1 || fail "the first install's uninstall"
uninstalled=true
say "ok: a replica added with --join-control-plane on the same PostgreSQL, both listed, one leads"
