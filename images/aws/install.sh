#!/usr/bin/env bash
# Turns a Debian 12 (bookworm) machine into a Drover node image: the host
# settings kubeadm needs, containerd and the Kubernetes packages, the Drover
# agent and its systemd unit, then a cleanup that leaves nothing
# machine-specific behind. Packer runs it on the build instance
# (images/aws/drover-node.pkr.hcl); scripts/verify-aws-image runs its agent
# phase in a debootstrapped Debian root file system.
#
#   install.sh [options] PHASE...
#
# Phases, run in the order given:
#   host        kernel modules (overlay, br_netfilter), bridge and forwarding
#               sysctls, swap off
#   kubernetes  containerd (Debian package, systemd cgroup driver), kubelet,
#               kubeadm and kubectl from pkgs.k8s.io, held; kubelet enabled
#   agent       /usr/local/bin/drover-agent, its unit, /etc/drover and
#               /var/lib/drover-agent (0700), the unit enabled; the upgrade
#               hooks; the image's default pod network under
#               /usr/share/drover/cni (spec.network.cni: image); no
#               bootstrap document: the agent reads it at first boot
#               (IMDSv2 user data or a NoCloud seed)
#   cleanup     cloud-init state, machine-id, SSH host keys, Drover state,
#               logs, apt lists: nothing machine-specific in the image
#   all         host kubernetes agent cleanup
#
# Options:
#   --root DIR                 the machine root (default /). The agent and
#                              cleanup phases write under DIR, so they also
#                              work on a mounted or chrooted image; host
#                              writes its files there and applies them live
#                              only when DIR is /; kubernetes needs /.
#   --agent-bin FILE           the agent binary (default: drover-agent beside
#                              this script)
#   --unit FILE                the systemd unit (default: drover-agent.service
#                              beside this script; the repository's is
#                              images/systemd/drover-agent.service)
#   --cni-dir DIR              the image's default pod network: manifests.yaml
#                              and net.d/*.conflist (default: cni beside
#                              this script, else the repository's
#                              images/cni)
#   --kubernetes-version V     the exact release vMAJOR.MINOR.PATCH the
#                              image pins (default v1.31.2): every machine
#                              of a cluster must run the one version its
#                              spec names, whenever the image was built
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=/
agent_bin=$here/drover-agent
unit_file=$here/drover-agent.service
if [[ -d $here/cni ]]; then cni_dir=$here/cni; else cni_dir=$here/../cni; fi
kubernetes_version=${KUBERNETES_VERSION:-v1.31.2}

# The agent's paths. The unit's ExecStart must run this binary; its
# StateDirectory= is /var/lib/drover-agent; bundle files such as
# /etc/drover/kubeadm.yaml go to /etc/drover.
readonly agent_path=/usr/local/bin/drover-agent
readonly unit_path=/etc/systemd/system/drover-agent.service
readonly config_dir=/etc/drover
readonly state_dir=/var/lib/drover-agent

log() { echo "install.sh: $*"; }
die() { echo "install.sh: error: $*" >&2; exit 1; }

usage() {
  sed -n '/^#   install.sh/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

# The path of an absolute machine path under --root.
r() { if [[ $root == / ]]; then printf '%s' "$1"; else printf '%s%s' "${root%/}" "$1"; fi; }

need_live_root() {
  [[ $root == / ]] || die "the $1 phase installs packages and runs services: it needs --root / (run it on the build machine, or chrooted into the image)"
  [[ $(id -u) -eq 0 ]] || die "the $1 phase must run as root"
}

# ---------------------------------------------------------------- host

phase_host() {
  log "host: kernel modules, sysctls, swap"
  install -d -m 0755 "$(r /etc/modules-load.d)" "$(r /etc/sysctl.d)"
  cat >"$(r /etc/modules-load.d/k8s.conf)" <<'EOF'
# Kubernetes (Drover node image): overlayfs for containerd's snapshotter,
# br_netfilter so bridged pod traffic passes iptables.
overlay
br_netfilter
EOF
  chmod 0644 "$(r /etc/modules-load.d/k8s.conf)"
  cat >"$(r /etc/sysctl.d/k8s.conf)" <<'EOF'
# Kubernetes (Drover node image): kubeadm's preflight checks these.
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
EOF
  chmod 0644 "$(r /etc/sysctl.d/k8s.conf)"

  # The kubelet refuses to start with swap on (failSwapOn defaults to true).
  local fstab
  fstab=$(r /etc/fstab)
  if [[ -f $fstab ]] && grep -Eq '^[^#[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]]' "$fstab"; then
    sed -i -E 's/^([^#[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]].*)$/# disabled for the kubelet: \1/' "$fstab"
    log "host: swap entries in /etc/fstab commented out"
  fi

  if [[ $root == / ]]; then
    # Also apply now, so the rest of the build sees the final host; the
    # files above are what counts for the image.
    modprobe overlay
    modprobe br_netfilter
    sysctl --quiet --load=/etc/sysctl.d/k8s.conf
    swapoff -a
  fi
}

# ---------------------------------------------------------- kubernetes

phase_kubernetes() {
  need_live_root kubernetes
  [[ $kubernetes_version =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] \
    || die "--kubernetes-version must be an exact release vMAJOR.MINOR.PATCH (for example v1.31.2), not '$kubernetes_version': an image pins the version it installs, so that machines built on different days run the same one"
  local minor="v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
  local repo="https://pkgs.k8s.io/core:/stable:/$minor/deb/"
  local keyring=/etc/apt/keyrings/kubernetes-apt-keyring.asc
  log "kubernetes: containerd (Debian) and kubelet/kubeadm/kubectl $kubernetes_version from $repo"

  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # containerd pulls in runc; conntrack, iptables, socat and ethtool are
  # what kubeadm's preflight and the kubelet look for on the host;
  # etcd-client's etcdctl restores a cluster's etcd from a snapshot before
  # kubeadm init (`drover restore cluster`).
  apt-get install -y -q --no-install-recommends \
    ca-certificates curl containerd conntrack iptables socat ethtool etcd-client

  # containerd: the kubelet and the runtime must agree on the cgroup driver;
  # kubeadm configures the kubelet for systemd.
  install -d -m 0755 /etc/containerd
  containerd config default >/etc/containerd/config.toml.new
  grep -q 'SystemdCgroup = false' /etc/containerd/config.toml.new \
    || die "containerd's default config has no 'SystemdCgroup = false' to turn on (containerd $(containerd --version)); its config format changed"
  sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' /etc/containerd/config.toml.new
  mv /etc/containerd/config.toml.new /etc/containerd/config.toml

  # The Kubernetes community package repository: one repository per minor
  # version, signed by the key it publishes beside it (ASCII-armored keys
  # in Signed-By work since apt 1.4; bookworm has 2.6).
  install -d -m 0755 /etc/apt/keyrings
  curl -fsSL --retry 5 --retry-connrefused "${repo}Release.key" -o "$keyring.new" \
    || die "cannot download the Kubernetes package signing key ${repo}Release.key (network? does Kubernetes $minor exist on pkgs.k8s.io?)"
  grep -q -- '-----BEGIN PGP PUBLIC KEY BLOCK-----' "$keyring.new" \
    || die "${repo}Release.key is not an OpenPGP public key (does Kubernetes $minor exist on pkgs.k8s.io?)"
  chmod 0644 "$keyring.new"
  mv "$keyring.new" "$keyring"
  cat >/etc/apt/sources.list.d/kubernetes.sources <<EOF
Types: deb
URIs: $repo
Suites: /
Signed-By: $keyring
EOF
  apt-get update -q

  # The exact release, and cri-tools by name: from 1.32 the kubeadm package
  # no longer depends on it, and kubeadm's preflight runs crictl.
  local v=${kubernetes_version#v}
  local pkgs=("kubelet=$v-*" "kubeadm=$v-*" "kubectl=$v-*" cri-tools)
  apt-mark unhold kubelet kubeadm kubectl cri-tools >/dev/null 2>&1 || true
  apt-get install -y -q --no-install-recommends "${pkgs[@]}"
  apt-mark hold kubelet kubeadm kubectl cri-tools
  [[ $(kubeadm version -o short) == "$kubernetes_version" ]] \
    || die "kubeadm $(kubeadm version -o short) was installed, not $kubernetes_version"

  # The sandbox (pause) image kubeadm expects, so containerd does not pull
  # a second one; kubeadm's own list, for its own version (no network).
  local pause
  pause=$(kubeadm config images list --kubernetes-version "$(kubeadm version -o short)" 2>/dev/null | grep '/pause:' || true)
  if [[ -n $pause ]]; then
    sed -i -E "s|^([[:space:]]*sandbox_image = ).*|\\1\"$pause\"|" /etc/containerd/config.toml
  fi

  cat >/etc/crictl.yaml <<'EOF'
runtime-endpoint: unix:///run/containerd/containerd.sock
image-endpoint: unix:///run/containerd/containerd.sock
EOF

  # kubelet crash-loops until kubeadm configures it; that is expected.
  systemctl enable containerd.service kubelet.service
  if [[ -d /run/systemd/system ]]; then
    systemctl restart containerd.service
    # The control-plane images of this release, pulled at bake time, so a
    # machine's first boot needs no registry.
    kubeadm config images pull --kubernetes-version "$kubernetes_version" \
      --cri-socket unix:///var/run/containerd/containerd.sock \
      || die "cannot pull the control-plane images of $kubernetes_version (registry.k8s.io reachable from the build instance?)"
  else
    log "kubernetes: no running systemd here, so the control-plane images are not pre-pulled; machines pull them at first boot"
  fi
  log "kubernetes: $(kubeadm version -o short), $(crictl --version), $(containerd --version)"
}

# --------------------------------------------------------------- agent

# The targets the unit's [Install] section names (WantedBy=, RequiredBy=).
install_targets() {
  awk -v want="$1" '
    /^[[:space:]]*\[/ { section = $0; gsub(/[[:space:]]/, "", section); next }
    section == "[Install]" && $0 ~ "^[[:space:]]*" want "=" {
      sub(/^[^=]*=/, ""); n = split($0, t, /[[:space:]]+/)
      for (i = 1; i <= n; i++) if (t[i] != "") print t[i]
    }' "$unit_file"
}

phase_agent() {
  log "agent: $agent_bin -> $agent_path, $unit_file -> $unit_path (root $root)"
  [[ -f $agent_bin ]] || die "agent binary $agent_bin does not exist (give --agent-bin FILE)"
  [[ -f $unit_file ]] || die "systemd unit $unit_file does not exist (give --unit FILE; the repository's is images/systemd/drover-agent.service)"
  [[ -d $root ]] || die "--root $root is not a directory"

  local exec_path
  exec_path=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit_file")
  [[ $exec_path == "$agent_path" ]] \
    || die "$unit_file runs '$exec_path' but this script installs the agent to $agent_path"

  install -d -m 0755 "$(r /usr/local/bin)" "$(r /etc/systemd/system)"
  # To a temporary name and renamed: a running agent's binary is never
  # half-written.
  install -m 0755 "$agent_bin" "$(r "$agent_path").new"
  mv -f "$(r "$agent_path").new" "$(r "$agent_path")"
  install -m 0644 "$unit_file" "$(r "$unit_path")"

  # The image's default pod network (spec.network.cni: image): every
  # machine's agent installs net.d/ into /etc/cni/net.d before kubeadm, a
  # control plane applies manifests.yaml as addon "cni". The plugins it
  # names (bridge, host-local, portmap) come with the kubelet's
  # kubernetes-cni package in /opt/cni/bin.
  [[ -f $cni_dir/manifests.yaml ]] && compgen -G "$cni_dir/net.d/*.conflist" >/dev/null \
    || die "--cni-dir $cni_dir has no manifests.yaml and net.d/*.conflist (the repository's is images/cni)"
  install -d -m 0755 "$(r /usr/share/drover/cni/net.d)"
  install -m 0644 "$cni_dir/manifests.yaml" "$(r /usr/share/drover/cni/manifests.yaml)"
  install -m 0644 "$cni_dir"/net.d/*.conflist "$(r /usr/share/drover/cni/net.d)/"

  # The upgrade hooks the agent runs during an in-place upgrade (pool
  # clusters; README "Upgrading a cluster"): one script, by two names.
  install -d -m 0755 "$(r /usr/lib/drover)"
  cat >"$(r /usr/lib/drover/upgrade-kubeadm).new" <<'HOOK'
#!/usr/bin/env bash
# Drover's in-place upgrade hooks (installed by images/aws/install.sh).
#   upgrade-kubeadm VERSION   installs kubeadm VERSION from pkgs.k8s.io
#   upgrade-kubelet VERSION   installs kubelet and kubectl VERSION, restarts
#                             the kubelet
# The drover-agent runs them around `kubeadm upgrade`; each switches the
# package repository to VERSION's minor release, as the Kubernetes upgrade
# guide does, and keeps the packages held.
set -euo pipefail
name=$(basename "$0")
v=${1:-}
[[ $v =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] \
  || { echo "$name: usage: $name vMAJOR.MINOR.PATCH (got '$v')" >&2; exit 2; }
minor="v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
repo="https://pkgs.k8s.io/core:/stable:/$minor/deb/"
keyring=/etc/apt/keyrings/kubernetes-apt-keyring.asc
case $name in
  upgrade-kubeadm) pkgs=(kubeadm) ;;
  upgrade-kubelet) pkgs=(kubelet kubectl) ;;
  *) echo "$name: run as upgrade-kubeadm or upgrade-kubelet" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
curl -fsSL --retry 5 --retry-connrefused "${repo}Release.key" -o "$keyring.new" \
  || { echo "$name: cannot download ${repo}Release.key (does Kubernetes $minor exist on pkgs.k8s.io?)" >&2; exit 1; }
mv "$keyring.new" "$keyring"
printf 'Types: deb\nURIs: %s\nSuites: /\nSigned-By: %s\n' "$repo" "$keyring" \
  >/etc/apt/sources.list.d/kubernetes.sources
apt-get update -q
apt-mark unhold "${pkgs[@]}" >/dev/null
apt-get install -y -q --no-install-recommends "${pkgs[@]/%/=${v#v}-*}"
apt-mark hold "${pkgs[@]}" >/dev/null
if [[ $name == upgrade-kubelet ]]; then
  systemctl daemon-reload
  systemctl restart kubelet.service
  echo "$name: $(kubelet --version) installed and restarted"
else
  echo "$name: kubeadm $(kubeadm version -o short) installed"
fi
HOOK
  chmod 0755 "$(r /usr/lib/drover/upgrade-kubeadm).new"
  mv -f "$(r /usr/lib/drover/upgrade-kubeadm).new" "$(r /usr/lib/drover/upgrade-kubeadm)"
  ln -sfn upgrade-kubeadm "$(r /usr/lib/drover/upgrade-kubelet)"
  bash -n "$(r /usr/lib/drover/upgrade-kubeadm)" || die "the upgrade hook does not parse"

  # install -d leaves the mode of an existing directory alone.
  install -d -m 0700 "$(r "$config_dir")" "$(r "$state_dir")"
  chmod 0700 "$(r "$config_dir")" "$(r "$state_dir")"
  if [[ -e $(r "$state_dir/state.json") ]]; then
    log "agent: warning: $state_dir/state.json exists; the cleanup phase removes it before the image is taken"
  fi

  # Enabled the way `systemctl enable` does it, without systemd running (the
  # build may be a chroot): a symlink per [Install] target.
  local name t kind enabled=()
  name=$(basename "$unit_path")
  for kind in WantedBy:wants RequiredBy:requires; do
    for t in $(install_targets "${kind%%:*}"); do
      install -d -m 0755 "$(r "/etc/systemd/system/$t.${kind#*:}")"
      ln -sfn "$unit_path" "$(r "/etc/systemd/system/$t.${kind#*:}/$name")"
      enabled+=("$t")
    done
  done
  [[ ${#enabled[@]} -gt 0 ]] || die "$unit_file has no WantedBy= in [Install]; it would never start"
  log "agent: enabled for ${enabled[*]}"

  if [[ $root == / ]]; then
    # Fails here, not at first boot, if the binary cannot run on this system
    # (architecture, C library).
    "$agent_path" --version >/dev/null || die "$agent_path does not run on this system"
    if [[ -d /run/systemd/system ]]; then
      systemctl daemon-reload
    fi
  fi
}

# ------------------------------------------------------------- cleanup

# Deletes what a directory under --root holds, keeping the directory.
empty_dir() {
  local d
  d=$(r "$1")
  if [[ -d $d ]]; then
    find "$d" -mindepth 1 -delete
  fi
}

phase_cleanup() {
  log "cleanup: removing everything machine-specific (root $root)"
  if [[ $root == / ]] && command -v apt-get >/dev/null; then
    apt-get clean
  fi
  empty_dir /var/lib/apt/lists

  # cloud-init: the next boot is a first boot again (users, SSH keys, host
  # name, user data from the new instance). A NoCloud seed left in the image
  # would hand every machine the same bootstrap document: removed too.
  if [[ $root == / ]] && command -v cloud-init >/dev/null; then
    cloud-init clean --logs
  fi
  empty_dir /var/lib/cloud
  rm -f "$(r /var/log)"/cloud-init*.log

  # machine-id: empty (not absent), so systemd generates a new one at first
  # boot and treats the boot as a first boot (presets, units).
  : >"$(r /etc/machine-id)"
  chmod 0444 "$(r /etc/machine-id)"
  local dbus_id
  dbus_id=$(r /var/lib/dbus/machine-id)
  if [[ -e $dbus_id && ! -L $dbus_id ]]; then
    rm -f "$dbus_id"
    ln -s /etc/machine-id "$dbus_id"
  fi
  rm -f "$(r /var/lib/systemd/random-seed)" "$(r /var/lib/systemd/credential.secret)"

  # SSH host keys: cloud-init (ssh_deletekeys, ssh_genkeytypes) makes new
  # ones at first boot. Authorized keys of the build (Packer's temporary
  # key pair) go too; cloud-init installs the instance's key.
  rm -f "$(r /etc/ssh)"/ssh_host_*
  rm -f "$(r /root/.ssh/authorized_keys)"
  local home
  for home in "$(r /home)"/*; do
    if [[ -d $home ]]; then
      rm -f "$home/.ssh/authorized_keys" "$home/.bash_history"
    fi
  done
  rm -f "$(r /root/.bash_history)"

  # Drover: no identity, progress or bootstrap document in the image.
  empty_dir "$state_dir"
  empty_dir "$config_dir"

  # DHCP leases, the journal (its directory is named after the machine-id)
  # and logs.
  rm -f "$(r /var/lib/dhcp)"/*.leases
  empty_dir /var/lib/dhcpcd
  empty_dir /var/log/journal
  if [[ -d $(r /var/log) ]]; then
    find "$(r /var/log)" -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
    find "$(r /var/log)" -type f -exec truncate -s 0 {} +
  fi
  sync
}

# ---------------------------------------------------------------- main

phases=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --root) root=${2:?--root needs a directory}; shift 2 ;;
    --root=*) root=${1#*=}; shift ;;
    --agent-bin) agent_bin=${2:?--agent-bin needs a file}; shift 2 ;;
    --agent-bin=*) agent_bin=${1#*=}; shift ;;
    --unit) unit_file=${2:?--unit needs a file}; shift 2 ;;
    --unit=*) unit_file=${1#*=}; shift ;;
    --cni-dir) cni_dir=${2:?--cni-dir needs a directory}; shift 2 ;;
    --cni-dir=*) cni_dir=${1#*=}; shift ;;
    --kubernetes-version) kubernetes_version=${2:?--kubernetes-version needs a version}; shift 2 ;;
    --kubernetes-version=*) kubernetes_version=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    all) phases+=(host kubernetes agent cleanup); shift ;;
    host|kubernetes|agent|cleanup) phases+=("$1"); shift ;;
    *) echo "install.sh: unknown argument: $1 (phases: all host kubernetes agent cleanup; --help)" >&2; exit 64 ;;
  esac
done
[[ ${#phases[@]} -gt 0 ]] || { echo "install.sh: no phase given (all host kubernetes agent cleanup; --help)" >&2; exit 64; }
[[ $root == /* ]] || root=$(cd "$root" && pwd)

for phase in "${phases[@]}"; do
  "phase_$phase"
done
log "done: ${phases[*]}"
