//! The control-plane endpoint of an aws cluster: a Network Load Balancer
//! Drover makes (a TCP listener on 6443 forwarding to a target group of the
//! control planes' addresses, health-checked with `GET /readyz` over TLS),
//! or only the registration of control planes in the user's own target group
//! (`spec.provider.aws.loadBalancer.targetGroupArn`).
//!
//! - The load balancer and the target group are named after the cluster and
//!   its UID (so a cluster made again under the same name never adopts the
//!   old one's) and tagged like instances, so the sweeper finds them.
//! - Targets are addresses (`ip` targets), the same `ip:port` backends the
//!   docker load balancer gets: a control plane is registered from the
//!   moment it bootstraps and deregistered before it leaves (the planner
//!   holds its removal until then).
//! - Every call is idempotent: what exists is adopted after its tags are
//!   checked, and a missing target or group counts as already gone.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::error::ProvideErrorMetadata;
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, LoadBalancer, LoadBalancerSchemeEnum, LoadBalancerTypeEnum,
    ProtocolEnum, Tag, TargetDescription, TargetGroupAttribute, TargetTypeEnum,
};

use drover_common::api::{Cluster, ProviderSpec};
use drover_common::aws::AwsProviderSpec;
use drover_common::wire::LoadBalancerConfig;

use super::{AwsProvider, PROVIDER};
use crate::provider::{
    EndpointLoadBalancer, Managed, ProviderError, LABEL_CLUSTER, LABEL_CLUSTER_UID, LABEL_MANAGED,
};

/// The port of the listener, and of every API server behind it.
pub const API_PORT: i32 = 6443;

/// How long a deregistered control plane keeps its open connections: long
/// enough for a watch to be re-established elsewhere, short enough that a
/// control plane leaving is not held up for ELB's default five minutes.
const DEREGISTRATION_DELAY_SECONDS: u32 = 30;

/// The name of a cluster's load balancer and target group: at most 32
/// characters of letters, digits and hyphens, as ELB requires, ending in the
/// first eight characters of the cluster's UID.
pub fn resource_name(cluster: &str, uid: &str) -> String {
    let short: String = cluster.chars().take(16).collect();
    let short = short.trim_end_matches('-');
    let uid: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("drover-{short}-{uid}")
}

fn aws_spec(cluster: &Cluster) -> Result<&AwsProviderSpec, ProviderError> {
    match &cluster.spec.provider {
        ProviderSpec::Aws(a) => Ok(a),
        other => Err(ProviderError::Failed {
            provider: PROVIDER,
            action: "keep the endpoint of",
            object: format!("cluster {}", cluster.metadata.name),
            detail: format!("the cluster's provider is {}", other.name()),
        }),
    }
}

fn cluster_uid(cluster: &Cluster) -> &str {
    cluster.metadata.uid.as_deref().unwrap_or_default()
}

impl AwsProvider {
    /// Makes the cluster's Network Load Balancer, its target group and its
    /// listener unless they exist, and returns its `dns-name:6443`; with a
    /// user target group, checks that the group exists and returns the
    /// spec's endpoint.
    pub(super) async fn ensure_load_balancer(
        &self,
        cluster: &Cluster,
    ) -> Result<EndpointLoadBalancer, ProviderError> {
        let spec = aws_spec(cluster)?;
        let object = format!("cluster {}", cluster.metadata.name);
        if let Some(arn) = spec.user_target_group() {
            self.target_group_by_arn(arn, &object).await?;
            let address = cluster.spec.endpoint_address().unwrap_or_default();
            return Ok(EndpointLoadBalancer {
                id: arn.to_owned(),
                address: address.to_owned(),
            });
        }
        let name = resource_name(&cluster.metadata.name, cluster_uid(cluster));
        let lb = match self.load_balancer(&name, cluster).await? {
            Some(lb) => lb,
            None => self.create_load_balancer(&name, cluster, spec).await?,
        };
        let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        let tg_arn = match self.target_group_by_name(&name, cluster).await? {
            Some(arn) => arn,
            None => {
                let vpc = lb.vpc_id().unwrap_or_default().to_owned();
                self.create_target_group(&name, cluster, &vpc).await?
            }
        };
        self.ensure_listener(&lb_arn, &tg_arn, &object).await?;
        let dns = lb.dns_name().unwrap_or_default();
        if dns.is_empty() {
            return Err(ProviderError::Failed {
                provider: PROVIDER,
                action: "make the load balancer of",
                object,
                detail: format!("load balancer {lb_arn} has no DNS name"),
            });
        }
        Ok(EndpointLoadBalancer {
            id: lb_arn,
            address: format!("{dns}:{API_PORT}"),
        })
    }

    /// Registers `config.backends` in the cluster's target group and
    /// deregisters the control planes that are no longer listed (in a
    /// user's group, only those Drover registered).
    pub(super) async fn set_load_balancer_targets(
        &self,
        cluster: &Cluster,
        config: &LoadBalancerConfig,
    ) -> Result<(), ProviderError> {
        let spec = aws_spec(cluster)?;
        let object = format!("cluster {}", cluster.metadata.name);
        let (tg_arn, own) = match spec.user_target_group() {
            Some(arn) => (arn.to_owned(), false),
            None => {
                let name = resource_name(&cluster.metadata.name, cluster_uid(cluster));
                let arn = self
                    .target_group_by_name(&name, cluster)
                    .await?
                    .ok_or_else(|| ProviderError::Failed {
                        provider: PROVIDER,
                        action: "register the control planes of",
                        object: object.clone(),
                        detail: format!("target group {name} does not exist"),
                    })?;
                (arn, true)
            }
        };
        let wanted = target_set(&config.backends);
        let registered = self.targets(&tg_arn, &object).await?;
        let recorded = cluster
            .status
            .load_balancer
            .as_ref()
            .map(|lb| target_set(&lb.backends))
            .unwrap_or_default();
        let stale: Vec<&(String, i32)> = registered
            .iter()
            .filter(|t| !wanted.contains(*t) && (own || recorded.contains(*t)))
            .collect();
        let missing: Vec<&(String, i32)> =
            wanted.iter().filter(|t| !registered.contains(*t)).collect();
        // Deregister first: a control plane that leaves stops getting new
        // connections before anything else changes.
        if !stale.is_empty() {
            self.elb
                .deregister_targets()
                .target_group_arn(&tg_arn)
                .set_targets(Some(descriptions(&stale)))
                .send()
                .await
                .map_err(|e| self.error("deregister control planes of", object.clone(), e))?;
            tracing::info!(cluster = %cluster.metadata.name, target_group = %tg_arn, targets = ?stale, "control planes deregistered from the load balancer");
        }
        if !missing.is_empty() {
            self.elb
                .register_targets()
                .target_group_arn(&tg_arn)
                .set_targets(Some(descriptions(&missing)))
                .send()
                .await
                .map_err(|e| self.error("register control planes of", object.clone(), e))?;
            tracing::info!(cluster = %cluster.metadata.name, target_group = %tg_arn, targets = ?missing, "control planes registered with the load balancer");
        }
        Ok(())
    }

    /// Deletes the cluster's load balancer (its listener goes with it) and
    /// then its target group; with a user target group, deregisters the
    /// control planes Drover registered.
    pub(super) async fn delete_load_balancer(
        &self,
        cluster: &Cluster,
    ) -> Result<(), ProviderError> {
        let spec = aws_spec(cluster)?;
        let object = format!("cluster {}", cluster.metadata.name);
        if spec.user_target_group().is_some() {
            let config = LoadBalancerConfig {
                ca_pem: String::new(),
                backends: vec![],
            };
            return self.set_load_balancer_targets(cluster, &config).await;
        }
        let name = resource_name(&cluster.metadata.name, cluster_uid(cluster));
        if let Some(lb) = self.load_balancer(&name, cluster).await? {
            let arn = lb.load_balancer_arn().unwrap_or_default();
            self.delete_arn(arn, &object).await?;
        }
        if let Some(arn) = self.target_group_by_name(&name, cluster).await? {
            self.delete_arn(&arn, &object).await?;
        }
        Ok(())
    }

    /// Every load balancer and target group of this coordinator in the
    /// region, for the sweeper.
    pub(super) async fn managed_load_balancers(&self) -> Result<Vec<Managed>, ProviderError> {
        let object = format!("region {}", self.region);
        let mut arns = vec![];
        let mut pages = self.elb.describe_load_balancers().into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.error("list load balancers of", object.clone(), e))?;
            arns.extend(
                page.load_balancers()
                    .iter()
                    .filter_map(|lb| lb.load_balancer_arn().map(str::to_owned)),
            );
        }
        let mut pages = self.elb.describe_target_groups().into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.error("list target groups of", object.clone(), e))?;
            arns.extend(
                page.target_groups()
                    .iter()
                    .filter_map(|tg| tg.target_group_arn().map(str::to_owned)),
            );
        }
        let mut out = vec![];
        for (arn, tags) in self.tags_of(&arns, &object).await? {
            if tags.get(LABEL_MANAGED) == Some(&self.owner) {
                out.push(Managed::ClusterResource {
                    name: arn,
                    labels: tags,
                });
            }
        }
        Ok(out)
    }

    /// Deletes an orphan load balancer or target group.
    pub(super) async fn remove_load_balancer(&self, arn: &str) -> Result<String, ProviderError> {
        self.delete_arn(arn, &format!("orphan {arn}")).await?;
        tracing::warn!(%arn, region = %self.region, "orphan load-balancer resource deleted");
        Ok(format!("{arn} ({})", self.region))
    }

    async fn delete_arn(&self, arn: &str, object: &str) -> Result<(), ProviderError> {
        let gone = |code: Option<&str>| {
            matches!(code, Some("LoadBalancerNotFound" | "TargetGroupNotFound"))
        };
        if arn.contains(":loadbalancer/") {
            match self
                .elb
                .delete_load_balancer()
                .load_balancer_arn(arn)
                .send()
                .await
            {
                Ok(_) => tracing::info!(%arn, "load balancer deleted"),
                Err(e) if gone(e.code()) => {}
                Err(e) => return Err(self.error("delete the load balancer of", object, e)),
            }
        } else {
            match self
                .elb
                .delete_target_group()
                .target_group_arn(arn)
                .send()
                .await
            {
                Ok(_) => tracing::info!(%arn, "target group deleted"),
                Err(e) if gone(e.code()) => {}
                // Still attached to a listener of a load balancer being
                // deleted: the next pass tries again.
                Err(e) => return Err(self.error("delete the target group of", object, e)),
            }
        }
        Ok(())
    }

    fn elb_tags(&self, cluster: &Cluster) -> Result<Vec<Tag>, ProviderError> {
        let spec = aws_spec(cluster)?;
        let mut tags: BTreeMap<String, String> = spec.tags.clone();
        tags.insert(LABEL_MANAGED.into(), self.owner.clone());
        tags.insert(LABEL_CLUSTER.into(), cluster.metadata.name.clone());
        tags.insert(LABEL_CLUSTER_UID.into(), cluster_uid(cluster).to_owned());
        Ok(tags
            .into_iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect())
    }

    /// The tags of each resource, 20 ARNs per call as ELB allows.
    async fn tags_of(
        &self,
        arns: &[String],
        object: &str,
    ) -> Result<Vec<(String, BTreeMap<String, String>)>, ProviderError> {
        let mut out = vec![];
        for chunk in arns.chunks(20) {
            let answer = self
                .elb
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| self.error("read the tags of load balancers of", object, e))?;
            for d in answer.tag_descriptions() {
                let tags = d
                    .tags()
                    .iter()
                    .filter_map(|t| Some((t.key()?.to_owned(), t.value()?.to_owned())))
                    .collect();
                out.push((d.resource_arn().unwrap_or_default().to_owned(), tags));
            }
        }
        Ok(out)
    }

    /// Refuses to adopt a resource of this name that another cluster (or
    /// someone else) owns.
    async fn check_owner(&self, arn: &str, cluster: &Cluster) -> Result<(), ProviderError> {
        let object = format!("cluster {}", cluster.metadata.name);
        let tags = self.tags_of(&[arn.to_owned()], &object).await?;
        let uid = tags
            .first()
            .and_then(|(_, t)| t.get(LABEL_CLUSTER_UID).cloned())
            .unwrap_or_default();
        if uid == cluster_uid(cluster) {
            Ok(())
        } else {
            Err(ProviderError::Failed {
                provider: PROVIDER,
                action: "adopt the load balancer of",
                object,
                detail: format!("{arn} exists but is tagged for cluster UID {uid:?}; delete it or rename the cluster"),
            })
        }
    }

    async fn load_balancer(
        &self,
        name: &str,
        cluster: &Cluster,
    ) -> Result<Option<LoadBalancer>, ProviderError> {
        let object = format!("cluster {}", cluster.metadata.name);
        let found = match self.elb.describe_load_balancers().names(name).send().await {
            Ok(out) => out.load_balancers().first().cloned(),
            Err(e) if e.code() == Some("LoadBalancerNotFound") => None,
            Err(e) => return Err(self.error("look up the load balancer of", object, e)),
        };
        if let Some(lb) = &found {
            self.check_owner(lb.load_balancer_arn().unwrap_or_default(), cluster)
                .await?;
        }
        Ok(found)
    }

    async fn create_load_balancer(
        &self,
        name: &str,
        cluster: &Cluster,
        spec: &AwsProviderSpec,
    ) -> Result<LoadBalancer, ProviderError> {
        let object = format!("cluster {}", cluster.metadata.name);
        let subnets = self
            .one_subnet_per_zone(&spec.control_plane.subnets, &object)
            .await?;
        let scheme = spec.load_balancer.clone().unwrap_or_default().scheme;
        let out = self
            .elb
            .create_load_balancer()
            .name(name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(LoadBalancerSchemeEnum::from(scheme.as_str()))
            .set_subnets(Some(subnets.clone()))
            .set_tags(Some(self.elb_tags(cluster)?))
            .send()
            .await
            .map_err(|e| self.error("make the load balancer of", object.clone(), e))?;
        let lb = out
            .load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                action: "make the load balancer of",
                object,
                detail: "CreateLoadBalancer answered without a load balancer".into(),
            })?;
        tracing::info!(cluster = %cluster.metadata.name, load_balancer = lb.load_balancer_arn().unwrap_or_default(), dns = lb.dns_name().unwrap_or_default(), ?subnets, scheme = scheme.as_str(), "network load balancer made");
        Ok(lb)
    }

    /// A Network Load Balancer takes one subnet per availability zone: the
    /// first of the control-plane subnets in each zone, in spec order.
    async fn one_subnet_per_zone(
        &self,
        subnets: &[String],
        object: &str,
    ) -> Result<Vec<String>, ProviderError> {
        let out = self
            .client
            .describe_subnets()
            .set_subnet_ids(Some(subnets.to_vec()))
            .send()
            .await
            .map_err(|e| self.error("read the control-plane subnets of", object, e))?;
        let zone_of: BTreeMap<&str, &str> = out
            .subnets()
            .iter()
            .filter_map(|s| Some((s.subnet_id()?, s.availability_zone()?)))
            .collect();
        let mut zones = BTreeSet::new();
        Ok(subnets
            .iter()
            .filter(|s| zone_of.get(s.as_str()).is_some_and(|z| zones.insert(*z)))
            .cloned()
            .collect())
    }

    async fn target_group_by_name(
        &self,
        name: &str,
        cluster: &Cluster,
    ) -> Result<Option<String>, ProviderError> {
        let object = format!("cluster {}", cluster.metadata.name);
        let arn = match self.elb.describe_target_groups().names(name).send().await {
            Ok(out) => out
                .target_groups()
                .first()
                .and_then(|tg| tg.target_group_arn())
                .map(str::to_owned),
            Err(e) if e.code() == Some("TargetGroupNotFound") => None,
            Err(e) => return Err(self.error("look up the target group of", object, e)),
        };
        if let Some(arn) = &arn {
            self.check_owner(arn, cluster).await?;
        }
        Ok(arn)
    }

    async fn target_group_by_arn(&self, arn: &str, object: &str) -> Result<(), ProviderError> {
        self.elb
            .describe_target_groups()
            .target_group_arns(arn)
            .send()
            .await
            .map_err(|e| {
                self.error(
                    "find the target group (spec.provider.aws.loadBalancer.targetGroupArn) of",
                    object,
                    e,
                )
            })?;
        Ok(())
    }

    async fn create_target_group(
        &self,
        name: &str,
        cluster: &Cluster,
        vpc: &str,
    ) -> Result<String, ProviderError> {
        let object = format!("cluster {}", cluster.metadata.name);
        let out = self
            .elb
            .create_target_group()
            .name(name)
            .protocol(ProtocolEnum::Tcp)
            .port(API_PORT)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Ip)
            // An API server is healthy when `/readyz` answers 200 over TLS
            // (the load balancer does not check its certificate).
            .health_check_protocol(ProtocolEnum::Https)
            .health_check_path("/readyz")
            .health_check_interval_seconds(10)
            .healthy_threshold_count(2)
            .unhealthy_threshold_count(2)
            .set_tags(Some(self.elb_tags(cluster)?))
            .send()
            .await
            .map_err(|e| self.error("make the target group of", object.clone(), e))?;
        let arn = out
            .target_groups()
            .first()
            .and_then(|tg| tg.target_group_arn())
            .ok_or_else(|| ProviderError::Failed {
                provider: PROVIDER,
                action: "make the target group of",
                object: object.clone(),
                detail: "CreateTargetGroup answered without a target group".into(),
            })?
            .to_owned();
        self.elb
            .modify_target_group_attributes()
            .target_group_arn(&arn)
            .attributes(
                TargetGroupAttribute::builder()
                    .key("deregistration_delay.timeout_seconds")
                    .value(DEREGISTRATION_DELAY_SECONDS.to_string())
                    .build(),
            )
            .send()
            .await
            .map_err(|e| self.error("set the deregistration delay of", object, e))?;
        tracing::info!(cluster = %cluster.metadata.name, target_group = %arn, "target group made");
        Ok(arn)
    }

    async fn ensure_listener(
        &self,
        lb_arn: &str,
        tg_arn: &str,
        object: &str,
    ) -> Result<(), ProviderError> {
        let out = self
            .elb
            .describe_listeners()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(|e| self.error("read the listeners of", object, e))?;
        if out.listeners().iter().any(|l| l.port() == Some(API_PORT)) {
            return Ok(());
        }
        let forward = Action::builder()
            .r#type(ActionTypeEnum::Forward)
            .target_group_arn(tg_arn)
            .build();
        self.elb
            .create_listener()
            .load_balancer_arn(lb_arn)
            .protocol(ProtocolEnum::Tcp)
            .port(API_PORT)
            .default_actions(forward)
            .send()
            .await
            .map_err(|e| self.error("make the listener of", object, e))?;
        tracing::info!(load_balancer = %lb_arn, target_group = %tg_arn, port = API_PORT, "listener made");
        Ok(())
    }

    /// The registered targets of a group, `(ip, port)`.
    async fn targets(
        &self,
        tg_arn: &str,
        object: &str,
    ) -> Result<BTreeSet<(String, i32)>, ProviderError> {
        let out = self
            .elb
            .describe_target_health()
            .target_group_arn(tg_arn)
            .send()
            .await
            .map_err(|e| self.error("read the targets of", object, e))?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter_map(|d| {
                let t = d.target()?;
                Some((t.id()?.to_owned(), t.port().unwrap_or(API_PORT)))
            })
            .collect())
    }
}

/// Backends (`ip:port`) as ELB targets, `(ip, port)`.
fn target_set(backends: &[String]) -> BTreeSet<(String, i32)> {
    backends
        .iter()
        .filter_map(|b| b.parse::<std::net::SocketAddr>().ok())
        .map(|a| (a.ip().to_string(), i32::from(a.port())))
        .collect()
}

fn descriptions(targets: &[&(String, i32)]) -> Vec<TargetDescription> {
    targets
        .iter()
        .map(|(ip, port)| TargetDescription::builder().id(ip).port(*port).build())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_fit_elb_rules_and_carry_the_uid() {
        let n = resource_name("demo", "3f2a9c1e-0000-4000-8000-000000000000");
        assert_eq!(n, "drover-demo-3f2a9c1e");
        let long = resource_name(
            "a-very-long-cluster-name-indeed-for-elb",
            "3f2a9c1e-0000-4000-8000-000000000000",
        );
        assert!(long.len() <= 32, "{long}");
        assert_eq!(long, "drover-a-very-long-clus-3f2a9c1e");
        // A cut that ends in a hyphen does not leave a double one.
        let cut = resource_name("abcdefghijklmno-xyz", "3f2a9c1e");
        assert_eq!(cut, "drover-abcdefghijklmno-3f2a9c1e");
        assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
