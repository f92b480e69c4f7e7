//! `Cluster::validate`: everything about a cluster document that serde
//! cannot check (names, versions, counts, networks, endpoints, policies,
//! the provider's part), and the format checks it uses (`parse_cidr`,
//! `check_host_port`).
//!
//! Invariant: validation returns every problem at once, each a
//! `FieldError` under the field's path, so a user fixes a document in one
//! pass; it reads the document and changes nothing.

use std::net::IpAddr;

use super::spec::{
    Cluster, CniMode, DockerMachineProfile, ProviderSpec, RolloutPolicy,
    RENEW_CERTIFICATES_BEFORE_RANGE,
};
use super::versions::check_kubernetes_version;
use crate::names::{check_dns_label, check_labels, CONTROL_PLANE_POOL};
use crate::objects::addons::validate_addons;
use crate::objects::customise::validate_customisation;
use crate::objects::format::FormatError;
use crate::objects::problem::FieldError;
use crate::units::{parse_duration, parse_percent};

/// The most machines one worker pool may have.
pub const MAX_POOL_REPLICAS: u32 = 1000;

impl Cluster {
    /// Checks everything serde cannot: names, versions, counts, networks.
    /// Returns every problem at once so a user fixes a document in one pass.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut err = |field: &str, message: String| {
            errs.push(FieldError {
                field: field.to_owned(),
                message,
            })
        };
        if self.api_version != crate::API_VERSION {
            err(
                "apiVersion",
                format!(
                    "must be {:?}, got {:?}",
                    crate::API_VERSION,
                    self.api_version
                ),
            );
        }
        if self.kind != "Cluster" {
            err("kind", format!("must be \"Cluster\", got {:?}", self.kind));
        }
        if let Err(e) = check_dns_label("cluster name", &self.metadata.name) {
            err("metadata.name", e.to_string());
        } else if self.metadata.name.len() + "cp".len() > crate::names::MAX_NAME_PREFIX {
            err(
                "metadata.name",
                format!(
                    "must be at most {} characters, so machine names (<cluster>-cp-xxxxx) stay DNS-1123 labels",
                    crate::names::MAX_NAME_PREFIX - 2
                ),
            );
        }
        for e in check_labels(&self.metadata.labels) {
            err("metadata.labels", e.to_string());
        }
        for e in crate::names::check_annotations(&self.metadata.annotations) {
            err("metadata.annotations", e);
        }
        for e in check_labels(&self.spec.control_plane.selector.match_labels) {
            err("spec.controlPlane.selector.matchLabels", e.to_string());
        }
        if let Err(why) = check_kubernetes_version(&self.spec.kubernetes_version) {
            err("spec.kubernetesVersion", why.to_string());
        }
        let cp = self.spec.control_plane.replicas;
        if cp == 0 || cp.is_multiple_of(2) || cp > 7 {
            err(
                "spec.controlPlane.replicas",
                format!("must be 1, 3, 5 or 7 (etcd needs an odd number of members), got {cp}"),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, pool) in self.spec.worker_pools.iter().enumerate() {
            if let Err(e) = check_dns_label("worker pool name", &pool.name) {
                err(&format!("spec.workerPools[{i}].name"), e.to_string());
            }
            if self.metadata.name.len() + pool.name.len() > crate::names::MAX_NAME_PREFIX {
                err(
                    &format!("spec.workerPools[{i}].name"),
                    format!(
                        "the cluster name and this pool name together must be at most {} characters, so machine names (<cluster>-<pool>-xxxxx) stay DNS-1123 labels",
                        crate::names::MAX_NAME_PREFIX
                    ),
                );
            }
            if pool.name == CONTROL_PLANE_POOL {
                err(
                    &format!("spec.workerPools[{i}].name"),
                    format!("{CONTROL_PLANE_POOL:?} is reserved for the control plane"),
                );
            }
            if !seen.insert(pool.name.as_str()) {
                err(
                    &format!("spec.workerPools[{i}].name"),
                    format!("duplicate worker pool name {:?}", pool.name),
                );
            }
            for e in check_labels(&pool.selector.match_labels) {
                err(
                    &format!("spec.workerPools[{i}].selector.matchLabels"),
                    e.to_string(),
                );
            }
            validate_customisation(
                &format!("spec.workerPools[{i}]"),
                &pool.files,
                &pool.pre_kubeadm_commands,
                &pool.post_kubeadm_commands,
                &mut |f, m| err(f, m),
            );
            for (j, file) in pool.files.iter().enumerate() {
                if file.control_plane_only {
                    err(
                        &format!("spec.workerPools[{i}].files[{j}].controlPlaneOnly"),
                        "keeps a file of spec.files off workers; in a worker pool's files it would keep the file off every machine it is for. Move the file to spec.files or spec.controlPlane.files".into(),
                    );
                }
            }
            if pool.replicas > MAX_POOL_REPLICAS {
                err(
                    &format!("spec.workerPools[{i}].replicas"),
                    format!("must be at most {MAX_POOL_REPLICAS}, got {}", pool.replicas),
                );
            }
            if let Some(a) = &pool.autoscaling {
                let field = format!("spec.workerPools[{i}].autoscaling");
                if a.max_replicas == 0 || a.max_replicas > MAX_POOL_REPLICAS {
                    err(
                        &format!("{field}.maxReplicas"),
                        format!(
                            "must be between 1 and {MAX_POOL_REPLICAS}, got {}",
                            a.max_replicas
                        ),
                    );
                } else if a.min_replicas > a.max_replicas {
                    err(
                        &format!("{field}.minReplicas"),
                        format!(
                            "must be at most maxReplicas ({}), got {}",
                            a.max_replicas, a.min_replicas
                        ),
                    );
                } else if a.clamp(pool.replicas) != pool.replicas {
                    err(
                        &format!("spec.workerPools[{i}].replicas"),
                        format!(
                            "must be within autoscaling's {}..{} while the pool is autoscaled, got {}; leave replicas out to keep the autoscaler's count",
                            a.min_replicas, a.max_replicas, pool.replicas
                        ),
                    );
                }
            }
        }
        validate_customisation(
            "spec",
            &self.spec.files,
            &self.spec.pre_kubeadm_commands,
            &self.spec.post_kubeadm_commands,
            &mut |f, m| err(f, m),
        );
        validate_customisation(
            "spec.controlPlane",
            &self.spec.control_plane.files,
            &self.spec.control_plane.pre_kubeadm_commands,
            &self.spec.control_plane.post_kubeadm_commands,
            &mut |f, m| err(f, m),
        );
        validate_addons(
            &self.spec.addons,
            self.spec.network.cni == CniMode::Image,
            &mut |f, m| err(f, m),
        );
        let pod = parse_cidr(&self.spec.network.pod_subnet);
        if let Err(why) = &pod {
            err("spec.network.podSubnet", why.to_string());
        }
        let svc = parse_cidr(&self.spec.network.service_subnet);
        if let Err(why) = &svc {
            err("spec.network.serviceSubnet", why.to_string());
        }
        if let (Ok(a), Ok(b)) = (&pod, &svc) {
            if cidrs_overlap(*a, *b) {
                err(
                    "spec.network.serviceSubnet",
                    "must not overlap spec.network.podSubnet".into(),
                );
            }
        }
        if let Err(e) = check_dns_subdomain(&self.spec.network.dns_domain) {
            err("spec.network.dnsDomain", e.to_string());
        }
        if let Some(ep) = self.spec.endpoint_address() {
            if let Err(why) = check_host_port(ep) {
                err("spec.controlPlaneEndpoint", why.to_string());
            }
        }
        let pool = matches!(self.spec.provider, ProviderSpec::Pool(_));
        if self.spec.endpoint_managed_by_coordinator() && !pool {
            err(
                "spec.controlPlaneEndpoint",
                format!(
                    "{{managed: coordinator}} is for pool clusters; {} clusters get their endpoint from their provider, or give a host:port",
                    self.spec.provider.name()
                ),
            );
        }
        // (An even count is refused above, with its own message.)
        if pool
            && self.spec.control_plane.replicas > 1
            && self.spec.control_plane.replicas % 2 == 1
            && self.spec.control_plane_endpoint.is_none()
        {
            err(
                "spec.controlPlaneEndpoint",
                format!(
                    "a pool cluster with {} control-plane machines needs an endpoint that outlives any one of them: a load balancer's, DNS name's or VIP's host:port (kube-vip can keep a VIP on the machines), or {{managed: coordinator}} for the coordinator's own proxy",
                    self.spec.control_plane.replicas
                ),
            );
        }
        match &self.spec.provider {
            ProviderSpec::Pool(p) => {
                if let Some(pool) = &p.pool {
                    if let Err(e) = check_dns_label("pool name", pool) {
                        err("spec.provider.pool.pool", e.to_string());
                    }
                }
                for e in check_labels(&p.selector.match_labels) {
                    err("spec.provider.pool.selector.matchLabels", e.to_string());
                }
            }
            ProviderSpec::Docker(d) => {
                if d.image.is_empty()
                    || d.image.len() > 255
                    || d.image.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    err(
                        "spec.provider.docker.image",
                        format!(
                            "must be an image reference such as drover-node:test, got {:?}",
                            d.image
                        ),
                    );
                }
                if d.privileged.is_some() && d.profile != DockerMachineProfile::Kind {
                    err(
                        "spec.provider.docker.privileged",
                        "applies to profile kind only; remove it, or set profile: kind".into(),
                    );
                }
            }
            ProviderSpec::Aws(_) => {}
        }
        if let ProviderSpec::Aws(a) = &self.spec.provider {
            let pools: Vec<&str> = self
                .spec
                .worker_pools
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            a.validate(
                &pools,
                self.spec.endpoint_address().is_some(),
                &mut |f, m| err(f, m),
            );
        }
        let remediations = std::iter::once((
            "spec.controlPlane.remediation".to_owned(),
            self.spec.control_plane.remediation.as_ref(),
        ))
        .chain(self.spec.worker_pools.iter().enumerate().map(|(i, p)| {
            (
                format!("spec.workerPools[{i}].remediation"),
                p.remediation.as_ref(),
            )
        }));
        for (field, r) in remediations {
            if let Some(r) = r {
                for (f, m) in r.problems() {
                    err(&format!("{field}.{f}"), m);
                }
            }
        }
        if let Some(h) = &self.spec.health {
            for (field, v) in [
                ("spec.health.heartbeatTimeout", &h.heartbeat_timeout),
                ("spec.health.startupTimeout", &h.startup_timeout),
                ("spec.health.unhealthyTimeout", &h.unhealthy_timeout),
            ] {
                if let Some(v) = v {
                    match parse_duration(v) {
                        Ok(d) if d.is_zero() => err(field, "must be positive".into()),
                        Ok(_) => {}
                        Err(e) => err(field, e.to_string()),
                    }
                }
            }
            if let Some(m) = &h.max_unhealthy {
                if let Err(e) = parse_percent(m) {
                    err("spec.health.maxUnhealthy", e.to_string());
                }
            }
        }
        if let Some(t) = self.spec.drain.as_ref().and_then(|d| d.timeout.as_ref()) {
            match parse_duration(t) {
                Ok(d) if d.is_zero() => err("spec.drain.timeout", "must be positive".into()),
                Ok(_) => {}
                Err(e) => err("spec.drain.timeout", e.to_string()),
            }
        }
        if let Some(t) = self
            .spec
            .upgrade
            .as_ref()
            .and_then(|u| u.settle_time.as_ref())
        {
            if let Err(e) = parse_duration(t) {
                err("spec.upgrade.settleTime", e.to_string());
            }
        }
        if let Some(t) = self
            .spec
            .upgrade
            .as_ref()
            .and_then(|u| u.renew_certificates_before.as_ref())
        {
            match parse_duration(t) {
                Ok(d) if RENEW_CERTIFICATES_BEFORE_RANGE.contains(&d) => {}
                Ok(_) => err(
                    "spec.upgrade.renewCertificatesBefore",
                    format!("must be at least 7d and less than 365d (kubeadm's certificates are valid for a year), got {t:?}"),
                ),
                Err(e) => err("spec.upgrade.renewCertificatesBefore", e.to_string()),
            }
        }
        if let Some(b) = &self.spec.backup {
            for (field, message) in b.problems() {
                err(field, message);
            }
        }
        if let Some(r) = &self.spec.control_plane.rollout {
            if r.max_surge.is_some_and(|s| s > 1) {
                err(
                    "spec.controlPlane.rollout.maxSurge",
                    "must be 0 or 1: control planes are replaced one at a time".into(),
                );
            }
            if r.max_surge == Some(0) && self.spec.control_plane.replicas < 3 {
                err(
                    "spec.controlPlane.rollout.maxSurge",
                    format!(
                        "0 (replace in place) needs at least 3 control planes so etcd keeps quorum while one is replaced; this cluster has {}; use 1",
                        self.spec.control_plane.replicas
                    ),
                );
            }
            if r.max_unavailable.is_some() {
                err(
                    "spec.controlPlane.rollout.maxUnavailable",
                    "is for worker pools; the control plane rolls by maxSurge (0 or 1)".into(),
                );
            }
        }
        for (i, p) in self.spec.worker_pools.iter().enumerate() {
            if let Some(r) = &p.rollout {
                if RolloutPolicy::surge(Some(r)) == 0 && RolloutPolicy::unavailable(Some(r)) == 0 {
                    err(
                        &format!("spec.workerPools[{i}].rollout"),
                        "maxSurge and maxUnavailable cannot both be 0: the pool could never replace a machine".into(),
                    );
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }
}

/// Parses `a.b.c.d/n` or an IPv6 CIDR.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), FormatError> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| FormatError::NotACidr { got: s.to_string() })?;
    let ip: IpAddr = ip.parse().map_err(|_| FormatError::NotAnIp {
        got: ip.to_string(),
    })?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u8 =
        len.parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| FormatError::PrefixLength {
                max,
                got: len.to_string(),
            })?;
    Ok((ip, len))
}

fn cidrs_overlap(a: (IpAddr, u8), b: (IpAddr, u8)) -> bool {
    match (a.0, b.0) {
        (IpAddr::V4(x), IpAddr::V4(y)) => {
            let len = a.1.min(b.1) as u32;
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            (u32::from(x) & mask) == (u32::from(y) & mask)
        }
        (IpAddr::V6(x), IpAddr::V6(y)) => {
            let len = a.1.min(b.1) as u32;
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            (u128::from(x) & mask) == (u128::from(y) & mask)
        }
        _ => false,
    }
}

fn check_dns_subdomain(s: &str) -> Result<(), FormatError> {
    Ok(crate::names::check_dns_subdomain("DNS domain", s)?)
}

/// Checks `host:port`.
pub fn check_host_port(s: &str) -> Result<(), FormatError> {
    let malformed = || FormatError::NotHostPort { got: s.to_string() };
    let (host, port) = s.rsplit_once(':').ok_or_else(malformed)?;
    if host.is_empty() {
        return Err(malformed());
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .map(|_| ())
        .ok_or_else(|| FormatError::Port {
            got: port.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn parses_and_validates() {
        let c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.validate().unwrap();
        assert_eq!(c.spec.network.pod_subnet, "10.244.0.0/16");
        assert_eq!(c.desired_pools().len(), 2);
    }

    #[test]
    fn a_remediation_names_known_problems_and_a_real_reboot_timeout() {
        let mut c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.spec.worker_pools[0].remediation = serde_saphyr::from_str(
            "strategy: Reboot\nrebootTimeout: 5m\nconditions: [DiskPressure, ReadOnlyFilesystem]",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.spec
                .remediation(&c.spec.worker_pools[0].name.clone())
                .reboot_timeout,
            std::time::Duration::from_secs(300)
        );
        c.spec.control_plane.remediation =
            serde_saphyr::from_str("rebootTimeout: 2s\nconditions: [DiskFull]").unwrap();
        let errs = c.validate().unwrap_err();
        let got: Vec<(&str, &str)> = errs
            .iter()
            .map(|e| (e.field.as_str(), e.message.as_str()))
            .collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, "spec.controlPlane.remediation.rebootTimeout");
        assert!(got[0].1.contains("must be at least 10s"), "{got:?}");
        assert_eq!(got[1].0, "spec.controlPlane.remediation.conditions");
        assert!(
            got[1].1.contains("\"DiskFull\" is not a node problem")
                && got[1].1.contains("ReadOnlyFilesystem, DiskPressure"),
            "{got:?}"
        );
        // An unknown strategy is refused when the document is read.
        let bad: Result<crate::objects::cluster::RemediationPolicy, _> =
            serde_saphyr::from_str("strategy: Reimage");
        assert!(bad.is_err());
    }

    #[test]
    fn selectors_and_labels_follow_kubernetes_rules() {
        let mut c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.metadata.labels.insert("ok.dev/x".into(), "v".into());
        c.validate().unwrap();
        // Machine names (<cluster>-<pool>-xxxxx) must stay DNS-1123 labels.
        let mut long = c.clone();
        long.metadata.name = "c".repeat(40);
        long.spec.worker_pools[0].name = "p".repeat(20);
        let errs = long.validate().unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.workerPools[0].name");
        long.metadata.name = "c".repeat(60);
        long.spec.worker_pools[0].name = "p".into();
        let errs = long.validate().unwrap_err();
        assert!(errs.iter().any(|e| e.field == "metadata.name"), "{errs:?}");
        let ProviderSpec::Pool(p) = &mut c.spec.provider else {
            panic!("a pool cluster")
        };
        p.selector
            .match_labels
            .insert("env\nrole".into(), "x".into());
        c.spec.worker_pools[0]
            .selector
            .match_labels
            .insert("zone".into(), "a b".into());
        c.spec
            .control_plane
            .selector
            .match_labels
            .insert("..//k".into(), String::new());
        let errs = c.validate().unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.controlPlane.selector.matchLabels",
                "spec.workerPools[0].selector.matchLabels",
                "spec.provider.pool.selector.matchLabels"
            ],
            "{errs:?}"
        );
    }

    #[test]
    fn semantic_errors_name_fields() {
        let mut c: Cluster = serde_saphyr::from_str(sample()).unwrap();
        c.spec.control_plane.replicas = 2;
        c.spec.kubernetes_version = "1.31".into();
        c.spec.network.service_subnet = "10.244.1.0/24".into();
        c.metadata.name = "../x".into();
        let errs = c.validate().unwrap_err();
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.kubernetesVersion",
                "spec.controlPlane.replicas",
                "spec.network.serviceSubnet"
            ]
        );
    }
}
