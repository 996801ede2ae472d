# The node of e2e/cluster: kubelet, kube-proxy, containerd + runc and the CNI bridge, in a network
# namespace of their own with the rest of the cluster. Sourced by e2e/cluster (it uses S, start, stop, wait_for, log, die and the
# ports defined there); nothing here runs on its own.
#
# Network (e2e/README.md has the picture):
#   - The namespace $NETNS holds every component of the cluster (etcd, the control plane, Prometheus,
#     the registry, the node), each bound on the namespace's own loopback where it was bound on the
#     host's before, plus a dummy interface mf0 with the node's address $NODE_IP (the API server's
#     advertised address, the kubelet's --node-ip), and the CNI bridge mf-cni0 ($POD_GATEWAY) with the
#     pods behind it. It has no uplink and no default route: nothing sent in it can leave the machine.
#   - Pods get routes to the node, the pod and the Service ranges only (no default route).
#   - The host reaches it only through mf-forward: 127.0.0.1:PORT on the host dials 127.0.0.1:PORT in
#     the namespace; inside, 127.0.0.1:$GATEWAY_PORT dials the gateway Service's ClusterIP. The host's
#     routes, addresses and firewall are never touched.
#
# Components are started with `nsenter --net` (never `ip netns exec`, which remounts /sys and hides the
# cgroup mounts from the kubelet).

NETNS=${MF_NETNS:-modelfleet}
NS_PATH=/run/netns/$NETNS
HOST_NS_PATH=/run/netns/$NETNS-host
NODE_IP=10.210.0.1
POD_SUBNET=10.244.0.0/24
POD_GATEWAY=10.244.0.1
SERVICE_CIDR=10.96.0.0/16
GATEWAY_CLUSTER_IP=${MF_GATEWAY_CLUSTER_IP:-10.96.0.80}
PAUSE_IMAGE="127.0.0.1:$REGISTRY_PORT/modelfleet/pause:1.0"
RUNC=${MF_RUNC:-/usr/sbin/runc}
CNI_BIN=${MF_CNI_BIN:-/usr/lib/cni}
IN_NS=(nsenter "--net=$NS_PATH" --)

node_netns_up() {
  # A name for the host's own namespace, so a command inside the cluster's can reach the host's
  # loopback (the forwards' listening side): nsenter --net=$HOST_NS_PATH.
  [ -e "$HOST_NS_PATH" ] || ip netns attach "$NETNS-host" $$
  # A namespace left by a run that was killed (no forward of this cluster is alive) holds stale pods'
  # links and rules: start from a fresh one.
  if [ -e "$NS_PATH" ] && ! alive forward-host; then
    log "removing the namespace $NETNS a stopped cluster left behind"
    ip netns del "$NETNS" 2>/dev/null || true
  fi
  if [ ! -e "$NS_PATH" ]; then
    ip netns add "$NETNS"
    log "network namespace $NETNS created"
  fi
  "${IN_NS[@]}" ip link set lo up
  # The node's address lives on the namespace's loopback (this kernel has no dummy links): local to the
  # namespace, reached by pods through the bridge.
  "${IN_NS[@]}" ip addr show dev lo | grep -q "inet $NODE_IP/" ||
    "${IN_NS[@]}" ip addr add "$NODE_IP/32" dev lo
  # Connections from the node itself to a ClusterIP need a route for the first lookup; kube-proxy's
  # OUTPUT rule then rewrites the destination to a pod, and the packet is routed again, over the bridge.
  "${IN_NS[@]}" ip route replace "$SERVICE_CIDR" dev lo
  # Per-namespace settings: routing between the bridge and the node's address, and bridged pod-to-pod
  # traffic through kube-proxy's rules (a pod reaching a Service whose endpoint shares its bridge).
  "${IN_NS[@]}" sysctl -qw net.ipv4.ip_forward=1
  "${IN_NS[@]}" sysctl -qw net.bridge.bridge-nf-call-iptables=1
}

node_netns_down() {
  # Only the name goes; the host's namespace is the host's.
  [ -e "$HOST_NS_PATH" ] && { umount "$HOST_NS_PATH" 2>/dev/null || true; rm -f "$HOST_NS_PATH"; }
  [ -e "$NS_PATH" ] || return 0
  ip netns del "$NETNS" 2>/dev/null || umount -l "$NS_PATH" 2>/dev/null || true
  rm -f "$NS_PATH"
  log "network namespace $NETNS removed"
}

# Host loopback -> the namespace's loopback, for each port the host's tools and tests use.
start_forwards() {
  local bin="$TARGET_BIN/mf-forward" pairs=() p
  [ -x "$bin" ] || die "$bin is missing: run 'cargo build --workspace --bins' first"
  for p in "$APISERVER_PORT" "$PROM_PORT" "$REGISTRY_PORT" "$GATEWAY_PORT" "$GATEWAY_METRICS_PORT"; do
    pairs+=("127.0.0.1:$p=127.0.0.1:$p")
  done
  start forward-host "$bin" --netns "$NS_PATH" "${pairs[@]}"
  # Inside: the gateway's loopback address is its Service (the chart pins its ClusterIP).
  start forward-gateway "${IN_NS[@]}" "$bin" \
    "127.0.0.1:$GATEWAY_PORT=$GATEWAY_CLUSTER_IP:80" \
    "127.0.0.1:$GATEWAY_METRICS_PORT=$GATEWAY_CLUSTER_IP:$GATEWAY_METRICS_PORT"
}

# The sandbox image, from e2e/node/pause.c: a static binary on an empty root, pushed to the registry.
push_pause_image() {
  local name=${PAUSE_IMAGE#*/}
  if curl -sf "http://127.0.0.1:$REGISTRY_PORT/v2/${name%%:*}/manifests/${name##*:}" \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json' >/dev/null; then
    return
  fi
  local w="$S/pause-build"
  rm -rf "$w"; mkdir -p "$w"
  gcc -static -Os -s -o "$w/pause" "$REPO/e2e/node/pause.c"
  umoci init --layout "$w/oci" >/dev/null
  umoci new --image "$w/oci:1.0" >/dev/null
  umoci unpack --rootless --image "$w/oci:1.0" "$w/bundle" >/dev/null 2>&1 ||
    umoci unpack --image "$w/oci:1.0" "$w/bundle" >/dev/null
  install -m 0755 "$w/pause" "$w/bundle/rootfs/pause"
  umoci repack --image "$w/oci:1.0" "$w/bundle" >/dev/null
  umoci config --image "$w/oci:1.0" --config.entrypoint /pause --config.user 65535:65535 >/dev/null
  skopeo copy --quiet --dest-tls-verify=false "oci:$w/oci:1.0" "docker://$PAUSE_IMAGE"
  rm -rf "$w"
  log "sandbox image $PAUSE_IMAGE built from e2e/node/pause.c"
}

write_containerd_config() {
  local d="$S/containerd"
  mkdir -p "$d/root" "$d/state" "$S/cni/net.d" "$S/cni/ipam"
  # The cluster's own registry, over plain HTTP: on the namespace's loopback (our images), and at the
  # node's address (what pods reach it at: model artifacts and model images name it so).
  local host
  for host in "127.0.0.1:$REGISTRY_PORT" "$NODE_IP:$REGISTRY_PORT"; do
    mkdir -p "$d/certs.d/$host"
    cat > "$d/certs.d/$host/hosts.toml" <<HT
server = "http://$host"
[host."http://$host"]
  capabilities = ["pull", "resolve"]
HT
  done
  cat > "$d/config.toml" <<CT
version = 3
root = "$d/root"
state = "$d/state"

[grpc]
  address = "$d/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$d/certs.d"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: a negative oom_score_adj (the sandbox's -998) is refused, so clamp.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$S/cni/net.d"
CT
  cat > "$S/cni/net.d/10-modelfleet.conflist" <<CN
{
  "cniVersion": "1.0.0",
  "name": "modelfleet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "mf-cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$S/cni/ipam",
        "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$POD_GATEWAY"}]],
        "routes": [
          {"dst": "10.244.0.0/16", "gw": "$POD_GATEWAY"},
          {"dst": "$SERVICE_CIDR", "gw": "$POD_GATEWAY"},
          {"dst": "$NODE_IP/32", "gw": "$POD_GATEWAY"}
        ]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CN
}

start_containerd() {
  [ -x "$MF_NODE_BIN/containerd" ] || die "$MF_NODE_BIN/containerd is missing: run e2e/scripts/build-k8s.sh containerd"
  command -v "$RUNC" >/dev/null || die "$RUNC is missing: run 'make setup'"
  write_containerd_config
  start containerd env PATH="$MF_NODE_BIN:$PATH" "${IN_NS[@]}" "$MF_NODE_BIN/containerd" \
    --config "$S/containerd/config.toml" --log-level warn
  wait_for containerd 30 "$MF_NODE_BIN/ctr" --address "$S/containerd/containerd.sock" version
}

write_kubelet_config() {
  mkdir -p "$S/kubelet" "$S/pod-logs"
  : > "$S/resolv.conf"
  cat > "$S/kubelet-config.yaml" <<KC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The host is on cgroup v1 (hybrid); Kubernetes 1.35 refuses it unless told not to (KEP-5573).
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$S/containerd/containerd.sock
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $S/pki/kubelet-serving.crt
tlsPrivateKeyFile: $S/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $S/pki/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $S/pod-logs
resolvConf: $S/resolv.conf
clusterDomain: cluster.local
# One node that shares the machine: reserve nothing, and evict only on memory. cadvisor cannot map
# this machine's root device, so filesystem signals are unavailable: they are not thresholds here.
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
evictionHard:
  memory.available: 256Mi
imageGCHighThresholdPercent: 100
maxPods: 110
# Mounted Secrets and ConfigMaps follow updates within this (default 1m) plus the cache's TTL; shorter
# here so the key-rotation scenario does not wait a minute.
syncFrequency: 10s
serializeImagePulls: false
KC
}

start_kubelet() {
  for b in kubelet kube-proxy kube-scheduler; do
    [ -x "$MF_K8S_BIN/$b" ] || die "$MF_K8S_BIN/$b is missing: run e2e/scripts/build-k8s.sh (or make setup)"
  done
  write_kubelet_config
  start kubelet "${IN_NS[@]}" "$MF_K8S_BIN/kubelet" --config "$S/kubelet-config.yaml" \
    --kubeconfig "$S/kubelet.kubeconfig" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
    --root-dir "$S/kubelet" --v 1
}

start_scheduler() {
  start kube-scheduler "${IN_NS[@]}" "$MF_K8S_BIN/kube-scheduler" --kubeconfig "$S/scheduler.kubeconfig" \
    --authentication-kubeconfig "$S/scheduler.kubeconfig" --authorization-kubeconfig "$S/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --v 1
}

start_kube_proxy() {
  # kube-proxy exits when its configuration file changes, even to the same content: a second `cluster
  # up` (make up on a running cluster) rewrote it and left the node without Service routing. Written
  # aside and moved in only when it differs.
  cat > "$S/kube-proxy.yaml.new" <<KP
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $S/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: 10.244.0.0/16
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
# nf_conntrack_max is the machine's, not the namespace's: leave it alone.
conntrack: {maxPerCore: 0}
KP
  if cmp -s "$S/kube-proxy.yaml.new" "$S/kube-proxy.yaml"; then
    rm -f "$S/kube-proxy.yaml.new"
  else
    mv "$S/kube-proxy.yaml.new" "$S/kube-proxy.yaml"
  fi
  start kube-proxy "${IN_NS[@]}" "$MF_K8S_BIN/kube-proxy" --config "$S/kube-proxy.yaml" --v 1
}

# Stops every container, then containerd, its shims, and what they mounted under the cluster's state.
node_down() {
  local ctr=("$MF_NODE_BIN/ctr" --address "$S/containerd/containerd.sock" -n k8s.io)
  stop kube-proxy 10
  stop kubelet 20
  if alive containerd; then
    local t
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks rm -f "$t" >/dev/null 2>&1 || true; done
  fi
  stop containerd 15
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $S/containerd/containerd.sock" 2>/dev/null || true
  local m
  for m in $(findmnt -rn -o TARGET | grep -F "$S/" | sort -r); do umount -l "$m" 2>/dev/null || true; done
  # Pod cgroups the kubelet made (cgroupfs driver), deepest first.
  local c
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}
