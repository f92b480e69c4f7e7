//! The `aws` provider's part of a cluster spec: a region, and one machine
//! template per pool (AMI, instance type, subnets, security groups, instance
//! profile, tags). Validation here catches malformed identifiers before any
//! call to EC2; whether they exist is for EC2 to say at launch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::format::FormatError;

/// The `aws` provider: machines are EC2 instances launched from an AMI with
/// `drover-agent` baked in.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsProviderSpec {
    /// The region instances run in, such as `eu-west-1`.
    pub region: String,
    /// Tags put on every instance of the cluster, beside Drover's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The machine template of the control-plane pool.
    pub control_plane: AwsMachineTemplate,
    /// One machine template per worker pool, keyed by pool name; every pool
    /// in `spec.workerPools` needs one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub worker_pools: BTreeMap<String, AwsMachineTemplate>,
    /// The control-plane endpoint. Without `spec.controlPlaneEndpoint`,
    /// Drover makes a Network Load Balancer for the cluster (this field
    /// may then set its scheme); with one, `targetGroupArn` names the
    /// target group of that load balancer Drover keeps the control planes
    /// registered in.
    pub load_balancer: Option<AwsLoadBalancerSpec>,
}

/// How an aws cluster's control planes are reached.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsLoadBalancerSpec {
    /// A TCP target group of the user's own load balancer: Drover makes no
    /// load balancer, and registers each control plane's address (port
    /// 6443) in this group while it serves. Needs `spec.controlPlaneEndpoint`.
    pub target_group_arn: Option<String>,
    /// Whether the load balancer Drover makes has an internal address (the
    /// default: machines and the coordinator reach it inside the VPC) or a
    /// public one.
    #[serde(default)]
    pub scheme: AwsLoadBalancerScheme,
}

/// The scheme of a Network Load Balancer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AwsLoadBalancerScheme {
    #[default]
    Internal,
    InternetFacing,
}

impl AwsLoadBalancerScheme {
    /// As ELBv2 spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AwsLoadBalancerScheme::Internal => "internal",
            AwsLoadBalancerScheme::InternetFacing => "internet-facing",
        }
    }
}

/// How the instances of one pool are launched.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsMachineTemplate {
    /// An AMI with `drover-agent` installed (see `images/aws`).
    pub ami: String,
    /// Such as `m6i.large`.
    pub instance_type: String,
    /// Subnet IDs; machines are spread over them.
    pub subnets: Vec<String>,
    /// Security group IDs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// An IAM instance profile, by name or ARN.
    pub instance_profile: Option<String>,
    /// Tags for this pool's instances; they override cluster-wide tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Spot capacity for this worker pool's instances (never the control
    /// plane's).
    pub spot: Option<Box<AwsSpot>>,
}

/// A worker pool's instances on spot capacity: cheaper, and taken back by
/// EC2 with two minutes' notice.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsSpot {
    /// Launch on spot (`RunInstances` with spot market options).
    #[serde(default)]
    pub enabled: bool,
    /// The most to pay per instance-hour, in US dollars (`"0.05"`); absent:
    /// up to the on-demand price, as EC2 recommends.
    pub max_price: Option<String>,
    /// When EC2 has no spot capacity for the launch (or the price is
    /// below the market), launch on demand instead of waiting for spot.
    #[serde(default)]
    pub on_demand_fallback: bool,
}

impl AwsSpot {
    /// Whether instances launch on spot.
    pub fn on(spot: Option<&AwsSpot>) -> bool {
        spot.is_some_and(|s| s.enabled)
    }
}

/// EC2 allows 50 tags per resource; Drover sets this many of its own.
pub const RESERVED_TAG_COUNT: usize = 6;
/// EC2's limit on raw user data.
pub const MAX_USER_DATA: usize = 16 * 1024;

impl AwsProviderSpec {
    /// The template of a pool, by pool name.
    pub fn template(&self, pool: &str) -> Option<&AwsMachineTemplate> {
        if pool == crate::names::CONTROL_PLANE_POOL {
            Some(&self.control_plane)
        } else {
            self.worker_pools.get(pool)
        }
    }

    /// The user tags of a pool's instances: cluster-wide ones overridden by
    /// the pool's.
    pub fn tags_for(&self, template: &AwsMachineTemplate) -> BTreeMap<String, String> {
        let mut tags = self.tags.clone();
        tags.extend(template.tags.clone());
        tags
    }

    /// The target group of the user's load balancer Drover registers
    /// control planes in, if the spec names one.
    pub fn user_target_group(&self) -> Option<&str> {
        self.load_balancer.as_ref()?.target_group_arn.as_deref()
    }

    /// Checks the spec against the cluster's pools and whether the spec
    /// names its own endpoint; each error names its field (under
    /// `spec.provider.aws`) and what is wrong.
    pub fn validate(
        &self,
        worker_pools: &[&str],
        user_endpoint: bool,
        err: &mut dyn FnMut(&str, String),
    ) {
        const BASE: &str = "spec.provider.aws";
        if let Some(lb) = &self.load_balancer {
            match &lb.target_group_arn {
                Some(arn) => {
                    if !check_target_group_arn(arn) {
                        err(
                            &format!("{BASE}.loadBalancer.targetGroupArn"),
                            format!("must be a target group ARN such as arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/0123456789abcdef, got {arn:?}"),
                        );
                    }
                    if !user_endpoint {
                        err(
                            &format!("{BASE}.loadBalancer.targetGroupArn"),
                            "needs spec.controlPlaneEndpoint: the host:port of the load balancer this target group belongs to".into(),
                        );
                    }
                    if lb.scheme != AwsLoadBalancerScheme::default() {
                        err(
                            &format!("{BASE}.loadBalancer.scheme"),
                            "is for the load balancer Drover makes; with targetGroupArn the load balancer is yours".into(),
                        );
                    }
                }
                None if user_endpoint => err(
                    &format!("{BASE}.loadBalancer"),
                    "spec.controlPlaneEndpoint is given, so Drover makes no load balancer: set loadBalancer.targetGroupArn to have control planes registered in yours, or remove loadBalancer".into(),
                ),
                None => {}
            }
        }
        if let Err(why) = check_region(&self.region) {
            err(&format!("{BASE}.region"), why.to_string());
        }
        check_tags(&self.tags, &format!("{BASE}.tags"), err);
        check_template(&self.control_plane, &format!("{BASE}.controlPlane"), err);
        if AwsSpot::on(self.control_plane.spot.as_deref()) {
            err(
                &format!("{BASE}.controlPlane.spot"),
                "spot is for worker pools: EC2 takes a spot instance back with two minutes' notice, and a control plane taken back takes an etcd member with it".into(),
            );
        }
        for (name, t) in &self.worker_pools {
            let base = format!("{BASE}.workerPools.{name}");
            if !worker_pools.contains(&name.as_str()) {
                err(
                    &base,
                    format!("there is no worker pool {name:?} in spec.workerPools; remove this template or add the pool"),
                );
            }
            check_template(t, &base, err);
            let merged = self.tags_for(t).len();
            if merged + RESERVED_TAG_COUNT > 50 {
                err(
                    &format!("{base}.tags"),
                    format!("{merged} tags with the cluster-wide ones; EC2 allows 50 per instance and Drover sets {RESERVED_TAG_COUNT}"),
                );
            }
        }
        let merged = self.tags_for(&self.control_plane).len();
        if merged + RESERVED_TAG_COUNT > 50 {
            err(
                &format!("{BASE}.controlPlane.tags"),
                format!("{merged} tags with the cluster-wide ones; EC2 allows 50 per instance and Drover sets {RESERVED_TAG_COUNT}"),
            );
        }
        for pool in worker_pools {
            if !self.worker_pools.contains_key(*pool) {
                err(
                    &format!("{BASE}.workerPools"),
                    format!("worker pool {pool:?} has no machine template; add {BASE}.workerPools.{pool} with ami, instanceType and subnets"),
                );
            }
        }
    }
}

/// `arn:<partition>:elasticloadbalancing:<region>:<account>:targetgroup/<name>/<id>`.
fn check_target_group_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    parts.len() == 6
        && parts[0] == "arn"
        && parts[1].starts_with("aws")
        && parts[2] == "elasticloadbalancing"
        && check_region(parts[3]).is_ok()
        && parts[4].len() == 12
        && parts[4].bytes().all(|b| b.is_ascii_digit())
        && parts[5]
            .strip_prefix("targetgroup/")
            .and_then(|r| r.split_once('/'))
            .is_some_and(|(name, id)| {
                !name.is_empty()
                    && name.len() <= 32
                    && !id.is_empty()
                    && id.bytes().all(|b| b.is_ascii_hexdigit())
            })
}

fn check_template(t: &AwsMachineTemplate, base: &str, err: &mut dyn FnMut(&str, String)) {
    if let Err(why) = check_id("ami", &t.ami) {
        err(&format!("{base}.ami"), why.to_string());
    }
    if let Err(why) = check_instance_type(&t.instance_type) {
        err(&format!("{base}.instanceType"), why.to_string());
    }
    if t.subnets.is_empty() {
        err(
            &format!("{base}.subnets"),
            "needs at least one subnet ID such as subnet-0abc1234".into(),
        );
    }
    for (i, s) in t.subnets.iter().enumerate() {
        if let Err(why) = check_id("subnet", s) {
            err(&format!("{base}.subnets[{i}]"), why.to_string());
        }
    }
    if let Some(price) = t.spot.as_ref().and_then(|s| s.max_price.as_deref()) {
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        let valid = match price.split_once('.') {
            Some((whole, frac)) => digits(whole) && digits(frac) && frac.len() <= 6,
            None => digits(price),
        } && price.len() <= 16
            && price.bytes().any(|b| (b'1'..=b'9').contains(&b));
        if !valid {
            err(
                &format!("{base}.spot.maxPrice"),
                format!("must be a price in US dollars per hour above zero such as \"0.05\", got {price:?}"),
            );
        }
    }
    for (i, s) in t.security_groups.iter().enumerate() {
        if let Err(why) = check_id("sg", s) {
            err(&format!("{base}.securityGroups[{i}]"), why.to_string());
        }
    }
    if let Some(p) = &t.instance_profile {
        if let Err(why) = check_instance_profile(p) {
            err(&format!("{base}.instanceProfile"), why.to_string());
        }
    }
    check_tags(&t.tags, &format!("{base}.tags"), err);
}

/// A region name such as `us-east-1` or `ap-southeast-2`.
pub fn check_region(r: &str) -> Result<(), FormatError> {
    let parts: Vec<&str> = r.split('-').collect();
    let ok = parts.len() >= 3
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if ok && r.len() <= 32 {
        Ok(())
    } else {
        Err(FormatError::AwsRegion { got: r.to_string() })
    }
}

/// An EC2 resource ID: `<prefix>-` and 8 or 17 lowercase hex digits.
fn check_id(prefix: &'static str, id: &str) -> Result<(), FormatError> {
    let ok = id
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|hex| {
            (8..=17).contains(&hex.len())
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(FormatError::AwsId {
            prefix,
            got: id.to_string(),
        })
    }
}

fn check_instance_type(t: &str) -> Result<(), FormatError> {
    let ok = t.len() <= 64
        && t.split_once('.').is_some_and(|(family, size)| {
            let part = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            };
            part(family) && part(size)
        });
    if ok {
        Ok(())
    } else {
        Err(FormatError::AwsInstanceType { got: t.to_string() })
    }
}

fn check_instance_profile(p: &str) -> Result<(), FormatError> {
    let name_ok = |n: &str| {
        (1..=128).contains(&n.len())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b))
    };
    let ok = match p.strip_prefix("arn:") {
        Some(rest) => rest
            .split_once(":iam::")
            .and_then(|(_, r)| r.split_once(":instance-profile/"))
            .is_some_and(|(account, path)| {
                account.len() == 12
                    && account.bytes().all(|b| b.is_ascii_digit())
                    && path.rsplit('/').next().is_some_and(name_ok)
            }),
        None => name_ok(p),
    };
    if ok {
        Ok(())
    } else {
        Err(FormatError::AwsInstanceProfile { got: p.to_string() })
    }
}

fn check_tags(tags: &BTreeMap<String, String>, field: &str, err: &mut dyn FnMut(&str, String)) {
    for (k, v) in tags {
        let lower = k.to_ascii_lowercase();
        if k.is_empty() || k.chars().count() > 128 {
            err(field, format!("tag key {k:?} must be 1 to 128 characters"));
        } else if lower.starts_with("aws:") {
            err(
                field,
                format!("tag key {k:?}: the aws: prefix is reserved by AWS"),
            );
        } else if lower.starts_with("drover.dev/") || k == "Name" {
            err(
                field,
                format!("tag key {k:?} is set by Drover itself; choose another key"),
            );
        }
        if v.chars().count() > 256 {
            err(
                field,
                format!("the value of tag {k:?} is longer than 256 characters"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> AwsMachineTemplate {
        AwsMachineTemplate {
            ami: "ami-12c6146b".into(),
            instance_type: "t3.medium".into(),
            subnets: vec!["subnet-0abc1234".into()],
            security_groups: vec!["sg-0123456789abcdef0".into()],
            instance_profile: Some("drover-node".into()),
            tags: BTreeMap::new(),
            spot: None,
        }
    }

    #[test]
    fn spot_is_for_worker_pools_at_a_price_above_zero() {
        let spot = |price: Option<&str>| {
            Some(Box::new(AwsSpot {
                enabled: true,
                max_price: price.map(str::to_owned),
                on_demand_fallback: true,
            }))
        };
        let mut spec = AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::new(),
            control_plane: template(),
            worker_pools: [("w".to_string(), template())].into(),
            load_balancer: None,
        };
        spec.worker_pools.get_mut("w").unwrap().spot = spot(Some("0.05"));
        assert_eq!(errors(&spec, &["w"]), vec![]);
        spec.control_plane.spot = spot(None);
        spec.worker_pools.get_mut("w").unwrap().spot = spot(Some("0"));
        let fields: Vec<String> = errors(&spec, &["w"]).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "spec.provider.aws.controlPlane.spot",
                "spec.provider.aws.workerPools.w.spot.maxPrice"
            ]
        );
        for bad in ["-1", "1e3", "0.1234567", ".5", "cheap"] {
            spec.control_plane.spot = None;
            spec.worker_pools.get_mut("w").unwrap().spot = spot(Some(bad));
            assert_eq!(errors(&spec, &["w"]).len(), 1, "{bad}");
        }
    }

    fn errors(spec: &AwsProviderSpec, pools: &[&str]) -> Vec<(String, String)> {
        errors_with_endpoint(spec, pools, false)
    }

    fn errors_with_endpoint(
        spec: &AwsProviderSpec,
        pools: &[&str],
        user_endpoint: bool,
    ) -> Vec<(String, String)> {
        let mut v = vec![];
        spec.validate(pools, user_endpoint, &mut |f, m| v.push((f.to_owned(), m)));
        v
    }

    #[test]
    fn a_user_target_group_needs_the_users_endpoint_and_a_well_formed_arn() {
        let arn =
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/0123456789abcdef";
        let mut spec = AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::new(),
            control_plane: template(),
            worker_pools: BTreeMap::new(),
            load_balancer: Some(AwsLoadBalancerSpec {
                target_group_arn: Some(arn.into()),
                scheme: AwsLoadBalancerScheme::Internal,
            }),
        };
        assert_eq!(errors_with_endpoint(&spec, &[], true), vec![]);
        assert_eq!(spec.user_target_group(), Some(arn));
        let errs = errors_with_endpoint(&spec, &[], false);
        assert!(
            errs.iter().any(
                |(f, m)| f == "spec.provider.aws.loadBalancer.targetGroupArn"
                    && m.contains("spec.controlPlaneEndpoint")
            ),
            "{errs:?}"
        );
        for bad in [
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/api/0123456789abcdef",
            "arn:aws:ec2:us-east-1:123456789012:targetgroup/api/0123",
            "targetgroup/api/0123",
        ] {
            spec.load_balancer.as_mut().unwrap().target_group_arn = Some(bad.into());
            let errs = errors_with_endpoint(&spec, &[], true);
            assert!(
                errs.iter().any(|(f, m)| f
                    == "spec.provider.aws.loadBalancer.targetGroupArn"
                    && m.contains(bad)),
                "{bad}: {errs:?}"
            );
        }
        // A scheme is for the load balancer Drover makes.
        spec.load_balancer = Some(AwsLoadBalancerSpec {
            target_group_arn: None,
            scheme: AwsLoadBalancerScheme::InternetFacing,
        });
        assert_eq!(errors_with_endpoint(&spec, &[], false), vec![]);
        let errs = errors_with_endpoint(&spec, &[], true);
        assert!(
            errs.iter()
                .any(|(f, m)| f == "spec.provider.aws.loadBalancer" && m.contains("targetGroupArn")),
            "{errs:?}"
        );
    }

    #[test]
    fn a_good_spec_passes() {
        let spec = AwsProviderSpec {
            region: "eu-west-1".into(),
            tags: BTreeMap::from([("team".into(), "infra".into())]),
            control_plane: template(),
            worker_pools: BTreeMap::from([("default".into(), template())]),
            load_balancer: None,
        };
        assert_eq!(errors(&spec, &["default"]), vec![]);
        let mut arn = template();
        arn.instance_profile =
            Some("arn:aws:iam::123456789012:instance-profile/nodes/drover-node".into());
        assert!(check_template_ok(&arn));
    }

    fn check_template_ok(t: &AwsMachineTemplate) -> bool {
        let mut n = 0;
        check_template(t, "x", &mut |_, _| n += 1);
        n == 0
    }

    #[test]
    fn malformed_identifiers_are_named() {
        let mut t = template();
        t.ami = "ubuntu-22.04".into();
        t.instance_type = "large".into();
        t.subnets = vec!["subnet-XYZ".into()];
        t.security_groups = vec!["default".into()];
        t.instance_profile = Some("arn:aws:iam::12:role/x".into());
        t.tags = BTreeMap::from([("aws:foo".into(), "x".into())]);
        let spec = AwsProviderSpec {
            region: "Europe".into(),
            tags: BTreeMap::from([("drover.dev/cluster".into(), "x".into())]),
            control_plane: t,
            worker_pools: BTreeMap::new(),
            load_balancer: None,
        };
        let fields: Vec<String> = errors(&spec, &[]).into_iter().map(|(f, _)| f).collect();
        for f in [
            "spec.provider.aws.region",
            "spec.provider.aws.tags",
            "spec.provider.aws.controlPlane.ami",
            "spec.provider.aws.controlPlane.instanceType",
            "spec.provider.aws.controlPlane.subnets[0]",
            "spec.provider.aws.controlPlane.securityGroups[0]",
            "spec.provider.aws.controlPlane.instanceProfile",
            "spec.provider.aws.controlPlane.tags",
        ] {
            assert!(
                fields.iter().any(|x| x == f),
                "no error for {f}: {fields:?}"
            );
        }
    }

    #[test]
    fn every_worker_pool_needs_a_template_and_no_template_is_spare() {
        let spec = AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::new(),
            control_plane: template(),
            worker_pools: BTreeMap::from([("gpu".into(), template())]),
            load_balancer: None,
        };
        let errs = errors(&spec, &["default"]);
        assert!(errs
            .iter()
            .any(|(f, m)| f == "spec.provider.aws.workerPools" && m.contains("\"default\"")));
        assert!(
            errs.iter()
                .any(|(f, m)| f == "spec.provider.aws.workerPools.gpu"
                    && m.contains("no worker pool"))
        );
    }

    #[test]
    fn too_many_tags_are_refused() {
        let mut spec = AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::new(),
            control_plane: template(),
            worker_pools: BTreeMap::new(),
            load_balancer: None,
        };
        spec.tags = (0..45).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(errors(&spec, &[])
            .iter()
            .any(|(f, m)| f == "spec.provider.aws.controlPlane.tags" && m.contains("50")));
    }

    #[test]
    fn pool_tags_override_cluster_tags() {
        let mut t = template();
        t.tags = BTreeMap::from([("team".into(), "gpu".into())]);
        let spec = AwsProviderSpec {
            region: "us-east-1".into(),
            tags: BTreeMap::from([
                ("team".into(), "infra".into()),
                ("env".into(), "prod".into()),
            ]),
            control_plane: template(),
            worker_pools: BTreeMap::new(),
            load_balancer: None,
        };
        let tags = spec.tags_for(&t);
        assert_eq!(tags["team"], "gpu");
        assert_eq!(tags["env"], "prod");
    }
}
