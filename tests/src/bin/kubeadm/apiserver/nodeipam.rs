//! Node pod ranges, as kube-controller-manager's node IPAM controller with
//! `--allocate-node-cidrs` gives them (pkg/controller/nodeipam/ipam/
//! range_allocator.go over pkg/controller/nodeipam/ipam/cidrset/
//! cidr_set.go): each Node gets one `--node-cidr-mask-size` range (/24 for
//! IPv4 by default, cmd/kube-controller-manager/app/core.go) of
//! `--cluster-cidr` in `spec.podCIDR` and `spec.podCIDRs`, no two Nodes
//! the same, and a deleted Node's range goes back to the pool. kubeadm
//! turns it on by writing those flags into the controller manager's static
//! Pod when `networking.podSubnet` is set (cmd/kubeadm/app/phases/
//! controlplane/manifests.go); the stand-in reads them from that manifest,
//! so `controllerManager.extraArgs` change them as they would.
//!
//! Differences that no client can tell apart: the range is given in the
//! request that creates the Node rather than just after it, and each
//! range is claimed under its own etcd key (create-only) so two API
//! servers never hand out the same one; there is no search cursor, so the
//! lowest free range is taken (as by a controller manager that has just
//! started: cidrset begins its search at the first range).

use std::net::Ipv4Addr;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::store::Store;
use crate::util::Root;

const CONTROLLER_MANAGER_MANIFEST: &str = "/etc/kubernetes/manifests/kube-controller-manager.yaml";

/// Where each claimed range is kept: `<prefix><addr>-<bits>` holds its Node.
const CLAIM_PREFIX: &str = "/registry/standin-nodeipam/";

/// The default `--node-cidr-mask-size-ipv4`.
const DEFAULT_NODE_MASK_V4: u8 = 24;

/// cidrset refuses a node mask more than 16 bits longer than the cluster's
/// ("CIDRSet max subnet"), so at most 65536 ranges.
const MAX_EXTRA_BITS: u8 = 16;

/// The allocator's settings: the cluster's IPv4 range and the node mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub cluster: Ipv4Addr,
    pub cluster_bits: u8,
    pub node_bits: u8,
}

impl Settings {
    /// The settings kube-controller-manager would run with, from its flags
    /// (`--allocate-node-cidrs`, `--cluster-cidr`, `--node-cidr-mask-size`,
    /// `--node-cidr-mask-size-ipv4`); none when allocation is off.
    pub fn from_flags(flags: &[(String, String)]) -> Result<Option<Self>> {
        let flag = |name: &str| {
            flags
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        if flag("allocate-node-cidrs") != Some("true") {
            return Ok(None);
        }
        let Some(cidr) = flag("cluster-cidr").filter(|c| !c.is_empty()) else {
            bail!("--cluster-cidr is required with --allocate-node-cidrs");
        };
        // A dual-stack cluster-cidr: the stand-in's Nodes take the IPv4 one.
        let Some((cluster, cluster_bits)) = cidr.split(',').find_map(|c| parse_v4(c.trim())) else {
            bail!("--cluster-cidr {cidr:?} has no IPv4 range");
        };
        let node_bits = match flag("node-cidr-mask-size-ipv4").or(flag("node-cidr-mask-size")) {
            Some(v) => v
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= 32)
                .with_context(|| format!("invalid node CIDR mask size {v:?}"))?,
            None => DEFAULT_NODE_MASK_V4,
        };
        if node_bits < cluster_bits {
            bail!("the node CIDR mask /{node_bits} is larger than the cluster CIDR {cidr}");
        }
        if node_bits - cluster_bits > MAX_EXTRA_BITS {
            bail!("CIDRSet max subnet: the node mask /{node_bits} is more than {MAX_EXTRA_BITS} bits longer than the cluster CIDR {cidr}");
        }
        Ok(Some(Self {
            cluster,
            cluster_bits,
            node_bits,
        }))
    }

    /// The settings of this machine's controller manager, read from its
    /// static Pod manifest; none when it has none or allocation is off.
    pub fn local(root: &Root) -> Result<Option<Self>> {
        let Ok(text) = std::fs::read_to_string(root.path(CONTROLLER_MANAGER_MANIFEST)) else {
            return Ok(None);
        };
        let doc: Value =
            serde_saphyr::from_str(&text).context("kube-controller-manager.yaml is not YAML")?;
        let flags: Vec<(String, String)> = doc["spec"]["containers"][0]["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str()?.strip_prefix("--")?.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self::from_flags(&flags)
    }

    /// The `n`th node range, `a.b.c.d/bits`, or none past the last.
    pub fn range(&self, n: u32) -> Option<String> {
        let extra = self.node_bits - self.cluster_bits;
        if u64::from(n) >= 1u64 << extra {
            return None;
        }
        let base = u32::from(self.cluster) & mask(self.cluster_bits);
        let host_bits = 32 - u32::from(self.node_bits);
        let addr = if host_bits == 32 {
            base
        } else {
            base | (n << host_bits)
        };
        Some(format!("{}/{}", Ipv4Addr::from(addr), self.node_bits))
    }

    /// The number of node ranges.
    pub fn count(&self) -> u64 {
        1u64 << (self.node_bits - self.cluster_bits)
    }
}

fn mask(bits: u8) -> u32 {
    if bits == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(bits))
    }
}

fn parse_v4(cidr: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, b) = cidr.split_once('/')?;
    let bits: u8 = b.parse().ok().filter(|b| *b <= 32)?;
    Some((a.parse().ok()?, bits))
}

fn claim_key(range: &str) -> String {
    format!("{CLAIM_PREFIX}{}", range.replace('/', "-"))
}

/// The first range no Node holds, claimed for `node`; none when the
/// allocator is off. Every range taken is an error, as the controller's
/// "no remaining CIDRs left to allocate in the accepted range".
pub async fn allocate(root: &Root, store: &Store, node: &str) -> Result<Option<String>> {
    let Some(settings) = Settings::local(root)? else {
        return Ok(None);
    };
    let taken: std::collections::BTreeSet<String> = store
        .objects(CLAIM_PREFIX, "a node range")
        .await?
        .iter()
        .filter_map(|c| c["range"].as_str().map(str::to_owned))
        .collect();
    let count = u32::try_from(settings.count()).unwrap_or(u32::MAX);
    for n in 0..count {
        let Some(range) = settings.range(n) else {
            break;
        };
        if taken.contains(&range) {
            continue;
        }
        let claim = json!({"range": range, "node": node});
        // Another API server may claim it first: then the next one.
        if store.put_object(&claim_key(&range), &claim, true).await? {
            return Ok(Some(range));
        }
    }
    bail!("CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range")
}

/// Gives `range` back to the pool.
pub async fn release(store: &Store, range: &str) -> Result<()> {
    store
        .delete_object(&claim_key(range), "a node range")
        .await?;
    Ok(())
}

/// `node` with `range` as its pod range.
pub fn with_range(mut node: Value, range: &str) -> Value {
    node["spec"]["podCIDR"] = range.into();
    node["spec"]["podCIDRs"] = json!([range]);
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn ranges_come_from_the_controller_manager_flags() {
        assert_eq!(Settings::from_flags(&flags(&[])).unwrap(), None);
        let s = Settings::from_flags(&flags(&[
            ("allocate-node-cidrs", "true"),
            ("cluster-cidr", "10.244.0.0/16"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(s.node_bits, 24);
        assert_eq!(s.count(), 256);
        assert_eq!(s.range(0).unwrap(), "10.244.0.0/24");
        assert_eq!(s.range(3).unwrap(), "10.244.3.0/24");
        assert_eq!(s.range(256), None);
        let s = Settings::from_flags(&flags(&[
            ("allocate-node-cidrs", "true"),
            ("cluster-cidr", "fd00::/48,192.168.0.0/20"),
            ("node-cidr-mask-size-ipv4", "26"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(s.range(5).unwrap(), "192.168.1.64/26");
        assert!(Settings::from_flags(&flags(&[
            ("allocate-node-cidrs", "true"),
            ("cluster-cidr", "10.0.0.0/8"),
            ("node-cidr-mask-size", "28"),
        ]))
        .is_err());
        assert!(Settings::from_flags(&flags(&[("allocate-node-cidrs", "true")])).is_err());
    }
}
