#!/usr/bin/env bash
# A real Kubernetes control plane for the test suite: etcd (Debian `etcd-server`) plus
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl v1.20.2 built from
# Debian bookworm's `kubernetes` source package (its tarball vendors every Go dependency,
# so the build needs no network beyond the Debian archive).
#
#   control-plane.sh build [CMD..]  build, or reuse from $FLOWSERVE_K8S_CACHE/<key>/bin (default
#                                   the four below; `build kubelet` adds the kubelet, real-node.sh)
#   control-plane.sh bindir         print the cached binary directory (exit 1 if not built)
#   control-plane.sh start DIR      PKI + tokens + kubeconfigs in DIR, start everything on
#                                   127.0.0.1 (ports from $K8S_*_PORT or free ones), wait
#                                   for readiness; writes DIR/env (sourceable) and DIR/*.pid
#   control-plane.sh stop DIR       stop what `start DIR` started, by PID
#
# Cache key: the Debian source version and the Go version, e.g.
#   ~/.cache/flowserve/k8s/kubernetes-1.20.5+really1.20.2-go1.19.8/bin
set -euo pipefail

K8S_VERSION=v1.20.2
DEB_SRC_VERSION=1.20.5+really1.20.2
CACHE_ROOT=${FLOWSERVE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flowserve/k8s}
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
HERE=$(cd "$(dirname "$0")" && pwd)

log() { echo "[control-plane $(date -u +%T)] $*" >&2; }

go_version() { go env GOVERSION 2>/dev/null || echo nogo; }
cache_dir() { echo "$CACHE_ROOT/kubernetes-$DEB_SRC_VERSION-$(go_version)"; }

have_bins() {
  local d=$1/bin c
  for c in "${WANT[@]}"; do [ -x "$d/$c" ] || return 1; done
  command -v etcd >/dev/null
}

install_debs() {
  if ! command -v go >/dev/null || ! command -v etcd >/dev/null; then
    log "apt-get install golang-go etcd-server"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends golang-go etcd-server
  fi
}

cmd_bindir() {
  WANT=("${COMPONENTS[@]}")
  local d; d=$(cache_dir)
  have_bins "$d" || { echo "control plane not built (expected binaries in $d/bin)" >&2; return 1; }
  echo "$d/bin"
}

cmd_build() {
  WANT=("$@"); [ ${#WANT[@]} -gt 0 ] || WANT=("${COMPONENTS[@]}")
  install_debs
  local d; d=$(cache_dir)
  if have_bins "$d"; then log "reusing $d/bin"; echo "$d/bin"; return; fi
  BUILD_DIR=$(mktemp -d "${TMPDIR:-/tmp}/k8s-build.XXXXXX")
  trap 'rm -rf "$BUILD_DIR"' EXIT
  local w=$BUILD_DIR
  mkdir -p "$w/apt/parts" "$w/apt/lists/partial" "$w/gopath/src/k8s.io" "$w/out"
  # a private deb-src list: the system's sources stay untouched
  cat > "$w/apt/parts/src.sources" <<'S'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
S
  local A=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$w/apt/parts" -o "Dir::State::Lists=$w/apt/lists")
  log "apt-get source kubernetes=$DEB_SRC_VERSION*"
  apt-get "${A[@]}" update -q >&2
  (cd "$w" && apt-get "${A[@]}" source --download-only "kubernetes" >&2)
  mkdir -p "$w/src"
  tar -xzf "$w/kubernetes_${DEB_SRC_VERSION}.orig.tar.gz" -C "$w/src"
  ln -sfn "$w/src/kubernetes-${K8S_VERSION#v}" "$w/gopath/src/k8s.io/kubernetes"
  (
    cd "$w/gopath/src/k8s.io/kubernetes"
    export GOPATH=$w/gopath GOCACHE=${FLOWSERVE_K8S_GOCACHE:-$w/gocache} GO111MODULE=off CGO_ENABLED=0 GOPROXY=off GOFLAGS=
    log "openapi-gen (the one generated file the tarball lacks)"
    nice -n 10 go build -o "$w/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
    "$w/openapi-gen" -i "$(paste -sd, "$HERE/openapi-packages.txt")" -p k8s.io/kubernetes/pkg/generated/openapi \
      -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$w/violations.report"
    local V=k8s.io/kubernetes/vendor/k8s.io
    local LDF="-s -w -X $V/component-base/version.gitVersion=$K8S_VERSION -X $V/component-base/version.gitMajor=1 -X $V/component-base/version.gitMinor=20 -X $V/component-base/version.gitTreeState=clean -X $V/client-go/pkg/version.gitVersion=$K8S_VERSION -X $V/client-go/pkg/version.gitMajor=1 -X $V/client-go/pkg/version.gitMinor=20"
    log "go build ${WANT[*]} (about 6 minutes on 2 cores, cold)"
    local pkgs=(); for c in "${WANT[@]}"; do pkgs+=("./cmd/$c"); done
    nice -n 10 go build -ldflags "$LDF" -o "$w/out/" "${pkgs[@]}"
  )
  mkdir -p "$d/bin"; local c
  for c in "${WANT[@]}"; do mv -f "$w/out/$c" "$d/bin/$c.tmp" && mv -f "$d/bin/$c.tmp" "$d/bin/$c"; done
  log "built into $d/bin"
  echo "$d/bin"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_for WHAT SECONDS CMD...: poll CMD every 0.2 s until it succeeds, at most SECONDS
wait_for() {
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then log "$what not ready after ${secs}s"; return 1; fi
    sleep 0.2
  done
}

kubeconfig() {  # kubeconfig FILE USER TOKEN
  cat > "$1" <<K
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$D/pki/ca.crt"}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: $2
  context: {cluster: local, user: $2}
current-context: $2
K
}

pki() {
  local P=$D/pki; mkdir -p "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=flowserve-test-ca \
    -keyout "$P/ca.key" -out "$P/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$P/apiserver.key" -out "$P/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc\n' > "$P/san.ext"
  openssl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 30 \
    -extfile "$P/san.ext" -out "$P/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
  tok() { openssl rand -hex 16; }
  ADMIN_TOKEN=$(tok); CM_TOKEN=$(tok); SCH_TOKEN=$(tok); DEV_TOKEN=$(tok); OUTSIDER_TOKEN=$(tok)
  {
    echo "$ADMIN_TOKEN,admin,1,\"system:masters\""
    echo "$CM_TOKEN,system:kube-controller-manager,2"
    echo "$SCH_TOKEN,system:kube-scheduler,3"
    echo "$DEV_TOKEN,developer,4,\"developers\""
    echo "$OUTSIDER_TOKEN,outsider,5"
  } > "$P/tokens.csv"
  chmod 600 "$P"/*.key "$P/tokens.csv"
  kubeconfig "$D/admin.kubeconfig" admin "$ADMIN_TOKEN"
  kubeconfig "$D/cm.kubeconfig" system:kube-controller-manager "$CM_TOKEN"
  kubeconfig "$D/sch.kubeconfig" system:kube-scheduler "$SCH_TOKEN"
  kubeconfig "$D/developer.kubeconfig" developer "$DEV_TOKEN"
  kubeconfig "$D/outsider.kubeconfig" outsider "$OUTSIDER_TOKEN"
}

spawn() {  # spawn NAME CMD...: start in the background, log to D/NAME.log, PID in D/NAME.pid
  local n=$1; shift
  "$@" > "$D/$n.log" 2>&1 &
  echo $! > "$D/$n.pid"
}

alive() { kill -0 "$(cat "$D/$1.pid")" 2>/dev/null || { log "$1 exited; last lines of $D/$1.log:"; tail -20 "$D/$1.log" >&2; return 1; }; }

cmd_start() {
  D=${1:?usage: control-plane.sh start DIR}; mkdir -p "$D"; D=$(cd "$D" && pwd)
  local B; B=$(cmd_bindir)
  API_PORT=${K8S_API_PORT:-$(free_port)}; ETCD_PORT=${K8S_ETCD_PORT:-$(free_port)}; PEER_PORT=${K8S_ETCD_PEER_PORT:-$(free_port)}
  pki
  local t0=$SECONDS
  spawn etcd etcd --name flowserve-test --data-dir "$D/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
    --initial-cluster "flowserve-test=http://127.0.0.1:$PEER_PORT"
  wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health" || { alive etcd; return 1; }
  local P=$D/pki
  spawn apiserver "$B/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" --insecure-port=0 \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --token-auth-file="$P/tokens.csv" --authorization-mode=RBAC --anonymous-auth=false \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --api-audiences=https://kubernetes.default.svc \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=false \
    --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,ResourceQuota,NodeRestriction
  wait_for kube-apiserver 90 curl -sf --cacert "$P/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://127.0.0.1:$API_PORT/readyz" || { alive apiserver; return 1; }
  # no cloud, no node IPAM, no attach/detach (there is no kubelet); service-account tokens
  # per controller, so the controllers run under their own RBAC roles as in a real cluster
  spawn controller-manager "$B/kube-controller-manager" --kubeconfig="$D/cm.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=0 --port=0 --leader-elect=false \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --controllers='*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service,-route,-attachdetach,-persistentvolume-expander'
  spawn scheduler "$B/kube-scheduler" --kubeconfig="$D/sch.kubeconfig" --bind-address=127.0.0.1 \
    --secure-port=0 --port=0 --leader-elect=false
  # the controller manager is working once the token controller gave `default` its token
  wait_for "controller manager" 60 sh -c "'$B/kubectl' --kubeconfig='$D/admin.kubeconfig' -n default get serviceaccount default -o jsonpath='{.secrets[0].name}' | grep -q ." \
    || { alive controller-manager; return 1; }
  alive scheduler
  cat > "$D/env" <<E
K8S_VERSION=$K8S_VERSION
K8S_BIN=$B
K8S_API=https://127.0.0.1:$API_PORT
K8S_CA=$P/ca.crt
K8S_ADMIN_KUBECONFIG=$D/admin.kubeconfig
K8S_DEVELOPER_KUBECONFIG=$D/developer.kubeconfig
K8S_OUTSIDER_KUBECONFIG=$D/outsider.kubeconfig
E
  log "control plane $K8S_VERSION up at https://127.0.0.1:$API_PORT in $((SECONDS - t0))s (state in $D)"
}

cmd_stop() {
  D=${1:?usage: control-plane.sh stop DIR}
  local n pid
  for n in scheduler controller-manager apiserver etcd; do
    [ -f "$D/$n.pid" ] || continue
    pid=$(cat "$D/$n.pid")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
      log "stopped $n ($pid)"
    fi
    rm -f "$D/$n.pid"
  done
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  bindir) cmd_bindir ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
