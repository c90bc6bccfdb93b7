#!/usr/bin/env bash
# EXPERIMENTAL, not run by CI (docs/kubernetes.md, "Real pods"): a real node for a control
# plane started by control-plane.sh: kubelet v1.20.2 (same source, `control-plane.sh build
# kubelet`), Debian's containerd 1.6 + runc + CNI bridge plugin, and two images built from
# busybox-static without pulling anything (localhost/busybox:1, and localhost/pause:1 as
# the sandbox image); FlowServe's image comes from flowserve-image.sh (`import`). Needs root.
#
# Neither CoreDNS nor kube-proxy runs (neither is built here): svc-dns.py answers the pods'
# queries for <service>.<namespace>.svc.cluster.local with the Service's endpoint IPs, and
# one NAT rule sends the `kubernetes` Service's address (10.0.0.1:443, what in-cluster
# clients dial) to the API server on 127.0.0.1. The host reaches pods at their IPs
# (10.88.0.0/24 on the bridge cni-fs0).
#
#   real-node.sh start DIR CONTROL_PLANE_DIR     containerd + kubelet; waits for the Node
#   real-node.sh import DIR IMAGE.tar            an OCI archive into the node's containerd
#   real-node.sh stop DIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NODE=${K8S_NODE_NAME:-realnode}
BRIDGE=cni-fs0 GATEWAY_IP=10.88.0.1 SUBNET=10.88.0.0/24 API_SERVICE_IP=10.0.0.1
log() { echo "[real-node $(date -u +%T)] $*" >&2; }

start() {
  local D=$1 CP=$2; mkdir -p "$D"; D=$(cd "$D" && pwd)
  local B; B=$("$HERE/control-plane.sh" bindir)
  [ -x "$B/kubelet" ] || "$HERE/control-plane.sh" build kubelet >/dev/null
  if ! command -v containerd >/dev/null || [ ! -x /usr/lib/cni/bridge ] || [ ! -x /bin/busybox ]; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      containerd runc containernetworking-plugins busybox-static
  fi
  mkdir -p "$D/cni" "$D/kubelet"
  # restrict_oom_score_adj: without it runc fails every sandbox here ("can't get final
  # child's PID from pipe: EOF"): the sandbox's oom_score_adj -998 needs CAP_SYS_RESOURCE
  cat > "$D/containerd.toml" <<T
version = 2
root = "$D/containerd-root"
state = "$D/containerd-state"
[grpc]
  address = "$D/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni"
T
  cat > "$D/cni/10-bridge.conflist" <<'T'
{"cniVersion": "0.4.0", "name": "flowserve-test", "plugins": [
  {"type": "bridge", "bridge": "cni-fs0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
T
  # the bridge first (the CNI plugin adopts it), so the DNS stand-in can listen on its address
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$GATEWAY_IP/24" dev "$BRIDGE" && ip link set "$BRIDGE" up
  python3 "$HERE/svc-dns.py" --listen "$GATEWAY_IP:53" --kubeconfig "$CP/admin.kubeconfig" > "$D/svc-dns.log" 2>&1 &
  echo $! > "$D/svc-dns.pid"
  # in-cluster clients (the autoscaler) dial the `kubernetes` Service; the API server listens
  # on 127.0.0.1 only, which a DNAT from the bridge may target once route_localnet is on
  local api_port; api_port=$(sed -n 's#^K8S_API=https://127.0.0.1:##p' "$CP/env")
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  echo "-t nat -I PREROUTING -i $BRIDGE -d $API_SERVICE_IP -p tcp --dport 443 -j DNAT --to-destination 127.0.0.1:$api_port" > "$D/nat-rule"
  iptables $(cat "$D/nat-rule")
  containerd --config "$D/containerd.toml" > "$D/containerd.log" 2>&1 & echo $! > "$D/containerd.pid"
  local ctr=(ctr --address "$D/containerd.sock" -n k8s.io) i
  for i in $(seq 50); do "${ctr[@]}" version >/dev/null 2>&1 && break; sleep 0.2; done
  rm -rf "$D/rootfs" && mkdir -p "$D/rootfs/bin" "$D/rootfs/tmp" "$D/rootfs/proc" "$D/rootfs/sys" "$D/rootfs/dev" "$D/rootfs/etc"
  cp /bin/busybox "$D/rootfs/bin/"
  for i in sh sleep echo ls cat wget nc; do ln -sf busybox "$D/rootfs/bin/$i"; done
  python3 "$HERE/oci-image.py" "$D/rootfs" localhost/busybox:1 "$D/busybox.tar" /bin/sh
  python3 "$HERE/oci-image.py" "$D/rootfs" localhost/pause:1 "$D/pause.tar" /bin/sleep 2147483647
  "${ctr[@]}" images import "$D/busybox.tar" >/dev/null && "${ctr[@]}" images import "$D/pause.tar" >/dev/null
  cat > "$D/kubelet.yaml" <<T
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: ${K8S_KUBELET_PORT:-10250}
readOnlyPort: 0
healthzPort: 0
cgroupDriver: cgroupfs
failSwapOn: false
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
enforceNodeAllocatable: []
cgroupsPerQOS: false
evictionHard: {}
clusterDNS: [$GATEWAY_IP]
clusterDomain: cluster.local
T
  # the admin kubeconfig: the control plane's token file has no system:node credential yet
  "$B/kubelet" --config="$D/kubelet.yaml" --kubeconfig="$CP/admin.kubeconfig" --hostname-override="$NODE" \
    --container-runtime=remote --container-runtime-endpoint="unix://$D/containerd.sock" \
    --root-dir="$D/kubelet" --cert-dir="$D/kubelet/pki" --network-plugin=cni --cni-bin-dir=/usr/lib/cni \
    --cni-conf-dir="$D/cni" --pod-infra-container-image=localhost/pause:1 > "$D/kubelet.log" 2>&1 &
  echo $! > "$D/kubelet.pid"
  local K=("$B/kubectl" --kubeconfig "$CP/admin.kubeconfig")
  for i in $(seq 150); do
    [ "$("${K[@]}" get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && break
    sleep 0.2
  done
  # no node lifecycle controller runs (control-plane.sh): lift the admission's not-ready taint
  "${K[@]}" patch node "$NODE" --type=merge -p '{"spec":{"taints":null}}' >/dev/null
  log "node $NODE Ready (kubelet $(cat "$D/kubelet.pid"), containerd $(cat "$D/containerd.pid"))"
}

import_image() {
  local D=$1 tar=$2
  ctr --address "$D/containerd.sock" -n k8s.io images import "$tar" >/dev/null
  log "imported $tar"
}

stop() {
  local D=$1 n id
  [ -f "$D/kubelet.pid" ] && kill "$(cat "$D/kubelet.pid")" 2>/dev/null && log "stopped kubelet"; rm -f "$D/kubelet.pid"
  if [ -f "$D/containerd.pid" ] && kill -0 "$(cat "$D/containerd.pid")" 2>/dev/null; then
    # the pods' containers first: their shims outlive containerd otherwise
    local ctr=(ctr --address "$D/containerd.sock" -n k8s.io)
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    for n in $(seq 50); do [ -z "$("${ctr[@]}" tasks ls -q 2>/dev/null | grep -v '^$' | head -1)" ] && break; sleep 0.2; done
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks delete "$id" >/dev/null 2>&1 || true; done
    kill "$(cat "$D/containerd.pid")" && log "stopped containerd"
  fi
  rm -f "$D/containerd.pid"
  for n in $(mount | awk -v d="$D" 'index($3, d) == 1 {print $3}' | sort -r); do umount "$n" || true; done
  [ -f "$D/svc-dns.pid" ] && kill "$(cat "$D/svc-dns.pid")" 2>/dev/null && log "stopped svc-dns"; rm -f "$D/svc-dns.pid"
  if [ -f "$D/nat-rule" ]; then iptables $(sed 's/ -I / -D /' "$D/nat-rule") 2>/dev/null || true; rm -f "$D/nat-rule"; fi
  ip link delete "$BRIDGE" 2>/dev/null || true
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  import) import_image "$2" "$3" ;;
  stop) stop "$2" ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
