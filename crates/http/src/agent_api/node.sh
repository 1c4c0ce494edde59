#!/bin/sh
# cloud-web node installer, served by the control plane at /node.sh.
#
#   join:       curl -fsSL --insecure --pinnedpubkey PIN URL/node.sh | sudo sh -s -- --join URL --token T --ca-sha256 H [--ingress] [--name N] [--endpoint HOST:PORT]
#   update:     curl -fsSL --insecure --pinnedpubkey PIN URL/node.sh | sudo sh
#   uninstall:  curl -fsSL --insecure --pinnedpubkey PIN URL/node.sh | sudo sh -s -- --uninstall --yes [--force]
#
# The node joins the cluster's WireGuard mesh (interface cw0, UDP port
# 51820; kernel WireGuard when the kernel has it, userspace wireguard-go
# otherwise): --endpoint is the public host:port other
# nodes reach this one at (leave it out behind NAT); --no-mesh runs without
# it (a cluster of one host only). CLOUDWEB_MESH_INTERFACE and
# CLOUDWEB_MESH_PORT override the interface name and port.
#
# It checks the host and the downloaded agent before it changes anything.
# The agent pins the cluster CA by fingerprint before the token leaves this
# host. Updating keeps the node's identity and spends no token.
set -eu

AGENT_URL='@AGENT_URL@'
AGENT_SHA256='@AGENT_SHA256@'
# The control plane's listener key; the binary is fetched from it alone.
PIN='@PIN@'
BIN=/usr/local/bin/cloudweb-agent
DATA=/var/lib/cloudweb-agent
UNIT=/etc/systemd/system/cloudweb-agent.service

die() { echo "node.sh: $*" >&2; exit 1; }

join='' token='' ca='' ingress='' name='' uninstall='' yes='' force='' endpoint='' mesh=1
MESH_INTERFACE=${CLOUDWEB_MESH_INTERFACE:-cw0}
MESH_PORT=${CLOUDWEB_MESH_PORT:-51820}
while [ $# -gt 0 ]; do
    case "$1" in
        --join) [ $# -ge 2 ] || die "--join needs a value"; join=$2; shift 2 ;;
        --token) [ $# -ge 2 ] || die "--token needs a value"; token=$2; shift 2 ;;
        --ca-sha256) [ $# -ge 2 ] || die "--ca-sha256 needs a value"; ca=$2; shift 2 ;;
        --name) [ $# -ge 2 ] || die "--name needs a value"; name=$2; shift 2 ;;
        --endpoint) [ $# -ge 2 ] || die "--endpoint needs a value"; endpoint=$2; shift 2 ;;
        --no-mesh) mesh=''; shift ;;
        --ingress) ingress=1; shift ;;
        --uninstall) uninstall=1; shift ;;
        --yes) yes=1; shift ;;
        --force) force=1; shift ;;
        *) die "unknown option: $1" ;;
    esac
done

case "$MESH_INTERFACE" in
    ''|-*|.*|*[!A-Za-z0-9_.-]*) die "CLOUDWEB_MESH_INTERFACE must be 1 to 15 characters of A-Z a-z 0-9 _ . -" ;;
esac
[ "${#MESH_INTERFACE}" -le 15 ] || die "CLOUDWEB_MESH_INTERFACE must be at most 15 characters"
case "$MESH_PORT" in
    ''|*[!0-9]*) die "CLOUDWEB_MESH_PORT must be a port number" ;;
esac
{ [ "$MESH_PORT" -ge 1 ] && [ "$MESH_PORT" -le 65535 ]; } || die "CLOUDWEB_MESH_PORT must be a port number"

# The mesh needs WireGuard; checked before anything is changed. The agent
# (--mesh-mode auto) uses kernel WireGuard when the kernel has it and
# userspace wireguard-go otherwise, and logs which.
if [ -n "$mesh" ] && [ -z "$uninstall" ]; then
    if [ -d /sys/module/wireguard ] || modinfo wireguard >/dev/null 2>&1; then
        :
    elif command -v wireguard-go >/dev/null 2>&1; then
        [ -c /dev/net/tun ] || die "wireguard-go needs /dev/net/tun, which this host lacks (load the tun module: modprobe tun); nothing was changed"
    else
        die "neither kernel WireGuard nor wireguard-go is available; install wireguard-go (Debian/Ubuntu: apt-get install wireguard-go), then run this again (nothing was changed)"
    fi
fi
[ "$(id -u)" = 0 ] || die "run as root (sudo sh)"
{ command -v systemctl >/dev/null && [ -d /run/systemd/system ]; } || die "systemd is required"

# restic: the agent backs up this node's volumes and databases with it.
# Without it the node works, and its backups fail saying restic is missing.
if [ -z "$uninstall" ] && ! command -v restic >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "node.sh: installing restic (backups)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq restic >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq restic >/dev/null 2>&1; } \
            || echo "node.sh: could not install restic; this node's backups fail until it is installed" >&2
    else
        echo "node.sh: restic is not installed; this node's backups fail until it is (Debian/Ubuntu: apt-get install restic)" >&2
    fi
fi

if [ -n "$uninstall" ]; then
    [ -n "$yes" ] || die "uninstalling removes this node from the cluster; add --yes"
    # Stop the agent first, so no deploy in flight recreates a container
    # after `leave` removed this node's containers.
    was_active=''
    if systemctl is-active --quiet cloudweb-agent 2>/dev/null; then was_active=1; fi
    systemctl stop cloudweb-agent 2>/dev/null || true
    if [ -f "$DATA/node.json" ]; then
        # With --force, `leave` removes this node's containers and exits 0
        # even when the control plane cannot be reached (it says so).
        if [ -n "$force" ]; then set -- leave --force; else set -- leave; fi
        if ! "$BIN" --data-dir "$DATA" "$@"; then
            # Nothing was removed: leave the node as it was.
            [ -z "$was_active" ] || systemctl start cloudweb-agent 2>/dev/null || true
            die "leaving the cluster failed (see above); nothing was uninstalled"
        fi
    fi
    systemctl disable --now cloudweb-agent 2>/dev/null || true
    # The mesh interface goes with its wireguard-go when the agent stops;
    # one left by a crash is removed here (the name the unit used).
    interface=$(sed -n 's/.*--mesh-interface \([A-Za-z0-9_.-]*\).*/\1/p' "$UNIT" 2>/dev/null | head -n 1)
    interface=${interface:-$MESH_INTERFACE}
    if ip link show dev "$interface" >/dev/null 2>&1; then
        ip link delete dev "$interface" && echo "node.sh: removed the mesh interface $interface"
    fi
    # The forwarding rule the agent adds while this host relays between
    # nodes behind NAT (`leave` removes it too; this covers a crash).
    if [ -n "$interface" ] && command -v iptables >/dev/null; then
        for chain in DOCKER-USER FORWARD; do
            while iptables -w -C "$chain" -i "$interface" -o "$interface" -j ACCEPT 2>/dev/null; do
                iptables -w -D "$chain" -i "$interface" -o "$interface" -j ACCEPT || break
                echo "node.sh: removed the mesh relay's rule from $chain"
            done
        done
    fi
    rm -f "$UNIT" "$BIN"
    rm -rf "$DATA"
    systemctl daemon-reload
    echo "node.sh: the cloud-web agent was removed (other containers were not touched)"
    exit 0
fi

{ command -v docker >/dev/null && docker info >/dev/null 2>&1; } || die "a running Docker Engine is required"
command -v curl >/dev/null || die "curl is required"
command -v sha256sum >/dev/null || die "sha256sum is required"
[ "$AGENT_SHA256" != "unavailable" ] || die "this control plane has no agent binary to offer (start it with --agent-binary)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --insecure --pinnedpubkey "$PIN" -o "$tmp/cloudweb-agent" "$AGENT_URL" || die "cannot download the agent from $AGENT_URL"
echo "$AGENT_SHA256  $tmp/cloudweb-agent" | sha256sum -c --status \
    || die "the downloaded agent does not match its checksum; nothing was installed"
chmod 0755 "$tmp/cloudweb-agent"

if [ -n "$join" ]; then
    { [ -n "$token" ] && [ -n "$ca" ]; } || die "--join needs --token and --ca-sha256"
    [ ! -f "$DATA/node.json" ] || die "this host already joined a cluster; uninstall first"
    set -- --data-dir "$DATA" join --server "$join" --ca-sha256 "$ca"
    [ -z "$ingress" ] || set -- "$@" --ingress
    [ -z "$name" ] || set -- "$@" --name "$name"
    [ -z "$endpoint" ] || set -- "$@" --endpoint "$endpoint"
    CLOUDWEB_JOIN_TOKEN=$token "$tmp/cloudweb-agent" "$@"
else
    [ -f "$DATA/node.json" ] || die "this host has not joined a cluster; pass --join, --token and --ca-sha256"
fi

install -m 0755 "$tmp/cloudweb-agent" "$BIN"
run_flags=''
[ -z "$mesh" ] || run_flags="--mesh-mode auto --mesh-interface $MESH_INTERFACE --mesh-listen-port $MESH_PORT"
cat > "$UNIT" <<UNIT
[Unit]
Description=cloud-web node agent
After=network-online.target docker.service
Wants=network-online.target

[Service]
ExecStart=$BIN --data-dir $DATA run $run_flags
Restart=always
RestartSec=2
# 78: the agent's node was removed from the cluster; 77: its certificate
# expired (re-join with a new token); restarting cannot help either.
RestartPreventExitStatus=78 77

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable cloudweb-agent >/dev/null
systemctl restart cloudweb-agent
echo "node.sh: the cloud-web agent is running (node $("$BIN" --data-dir "$DATA" node-id))"
