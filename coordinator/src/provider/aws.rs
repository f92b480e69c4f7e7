//! The `aws` provider: each machine is an EC2 instance launched from an AMI
//! with `drover-agent` baked in (see `images/aws`).
//!
//! - `RunInstances` carries the machine UID as its client token, so a
//!   create retried after a lost answer never launches a second instance;
//!   before launching, the provider also looks the machine up by tag.
//! - Every instance (and its volumes) is tagged with the coordinator, the
//!   cluster and the machine, so the sweeper finds what the store forgot.
//! - User data is a `#cloud-config` carrying the bootstrap document under
//!   `drover_bootstrap`; cloud-init ignores the key and the agent reads it
//!   from instance metadata (IMDSv2, which the instance is launched to require).
//! - Credentials, region defaults and the endpoint come from the SDK's
//!   standard chain, so `AWS_ENDPOINT_URL` points it at an emulator.
//! - Errors are classified ([`CloudErrorClass`]) so the executor can back off
//!   by kind: throttling briefly, capacity and quota longer, bad
//!   configuration until the spec changes.
//! - The cluster's control-plane endpoint is a Network Load Balancer
//!   ([`lb`]).

mod lb;

use std::collections::BTreeMap;

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_ec2::types::{
    Filter, HttpTokensState, IamInstanceProfileSpecification, Instance,
    InstanceInterruptionBehavior, InstanceMarketOptionsRequest, InstanceMetadataEndpointState,
    InstanceMetadataOptionsRequest, InstanceStateName, InstanceType, MarketType, ResourceType,
    SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
};
use aws_sdk_ec2::Client;
use base64::Engine as _;

use drover_common::api::{Cluster, Machine, ProviderSpec};
use drover_common::aws::{AwsMachineTemplate, AwsSpot, MAX_USER_DATA};

use super::{
    Check, CloudErrorClass, CreateHost, Created, EndpointLoadBalancer, Fut, HostError,
    InstanceCheckError, InstanceState, MachineRequest, Managed, Provider, ProviderError,
    ProviderMachine, LABEL_CLUSTER, LABEL_CLUSTER_UID, LABEL_MACHINE, LABEL_MACHINE_UID,
    LABEL_MANAGED,
};

const PROVIDER: &str = "aws";

/// An EC2 client for one region, scoped to one coordinator's instances.
#[derive(Clone)]
pub struct AwsProvider {
    client: Client,
    /// The Elastic Load Balancing (v2) client of the same region.
    elb: aws_sdk_elasticloadbalancingv2::Client,
    region: String,
    /// Value of the managed-by tag: this coordinator's identity.
    owner: String,
    /// The last listing and when it was made, shared by every clone.
    listed: std::sync::Arc<std::sync::Mutex<Option<Listing>>>,
}

/// A listing of the region's instances and when it was made.
type Listing = (std::time::Instant, Vec<ProviderMachine>);

/// How long a listing serves the reconcile loop, which runs every couple of
/// seconds and on every store change: `DescribeInstances` is rate-limited
/// per account, and a terminated instance still shows within this long.
pub const LIST_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// How one machine is launched.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub machine: &'a MachineRequest,
    pub template: &'a AwsMachineTemplate,
    /// The subnet chosen for this machine (recorded before the launch).
    pub subnet: &'a str,
    /// User tags (cluster-wide merged with the pool's).
    pub tags: BTreeMap<String, String>,
}

/// What EC2 reports of one instance.
#[derive(Debug, Clone)]
pub struct InstanceFacts {
    pub instance_id: String,
    pub state: InstanceState,
    /// EC2's own state name (`running`, `terminated`, ...).
    pub state_name: String,
    pub tags: BTreeMap<String, String>,
    /// Its availability zone (`placement.availabilityZone`).
    pub zone: Option<String>,
}

/// Which market an instance was launched on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Market {
    OnDemand,
    Spot,
    /// On demand because EC2 refused the spot launch, for this reason.
    OnDemandAfterSpot(String),
    /// An instance launched before (a retried create) was adopted.
    Adopted,
}

impl std::fmt::Display for Market {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Market::OnDemand => f.write_str("on demand"),
            Market::Spot => f.write_str("spot"),
            Market::OnDemandAfterSpot(why) => {
                write!(f, "on demand after spot was refused ({why})")
            }
            Market::Adopted => f.write_str("adopted"),
        }
    }
}

/// Whether EC2's error `code` refuses a spot launch for want of capacity
/// or price, which `onDemandFallback` answers with an on-demand launch.
fn spot_refusal(code: Option<&str>) -> bool {
    matches!(
        code,
        Some(
            "InsufficientInstanceCapacity"
                | "SpotMaxPriceTooLow"
                | "MaxSpotInstanceCountExceeded"
                | "UnfulfillableCapacity"
                | "InsufficientCapacity"
        )
    )
}

impl InstanceFacts {
    /// The Node `spec.providerID` the AWS cloud controller gives an
    /// instance's Node, `aws:///<zone>/<instance-id>`
    /// (cloud-provider-aws pkg/providers/v1: `KubernetesInstanceID`).
    pub fn node_provider_id(&self) -> String {
        node_provider_id(self.zone.as_deref(), &self.instance_id)
    }
}

/// `aws:///<zone>/<instance-id>`, or `aws:///<instance-id>` when the zone
/// is not known (which the cloud controller also reads).
pub fn node_provider_id(zone: Option<&str>, instance_id: &str) -> String {
    match zone {
        Some(z) if !z.is_empty() => format!("aws:///{z}/{instance_id}"),
        _ => format!("aws:///{instance_id}"),
    }
}

impl AwsProvider {
    /// A client for `region` from the SDK's standard configuration chain
    /// (environment, profile, container or instance credentials;
    /// `AWS_ENDPOINT_URL`). The SDK retries throttled and transient calls
    /// three times with jittered back-off before an error reaches Drover.
    pub async fn connect(region: &str, owner: String) -> Self {
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region.to_owned()))
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(std::time::Duration::from_secs(5))
                    .operation_attempt_timeout(std::time::Duration::from_secs(20))
                    .operation_timeout(std::time::Duration::from_secs(60))
                    .build(),
            )
            .load()
            .await;
        Self {
            client: Client::new(&config),
            elb: aws_sdk_elasticloadbalancingv2::Client::new(&config),
            region: region.to_owned(),
            owner,
            listed: Default::default(),
        }
    }

    fn error<E>(
        &self,
        action: &'static str,
        object: impl Into<String>,
        e: aws_sdk_ec2::error::SdkError<E>,
    ) -> ProviderError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let code = e.code().map(str::to_owned);
        let class = match &e {
            aws_sdk_ec2::error::SdkError::ServiceError(_) => {
                CloudErrorClass::from_code(code.as_deref().unwrap_or_default())
            }
            // Timeouts, connection failures, unreadable answers.
            _ => CloudErrorClass::Transient,
        };
        let detail = match (code.as_deref(), e.message()) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            _ => DisplayErrorContext(&e).to_string(),
        };
        ProviderError::Cloud {
            provider: PROVIDER,
            action,
            object: object.into(),
            class,
            detail: format!("{detail} (region {})", self.region),
        }
    }

    fn tags(&self, req: &MachineRequest, user: &BTreeMap<String, String>) -> Vec<Tag> {
        let mut tags: BTreeMap<String, String> = user.clone();
        tags.insert(LABEL_MANAGED.into(), self.owner.clone());
        tags.insert(LABEL_CLUSTER.into(), req.cluster.clone());
        tags.insert(LABEL_CLUSTER_UID.into(), req.cluster_uid.clone());
        tags.insert(LABEL_MACHINE.into(), req.machine.clone());
        tags.insert(LABEL_MACHINE_UID.into(), req.machine_uid.clone());
        tags.insert(
            "Name".into(),
            format!("drover-{}-{}", req.cluster, req.machine),
        );
        tags.into_iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect()
    }

    /// Launches the machine's instance unless it exists; returns its ID.
    /// Idempotent twice over: an instance tagged with the machine UID is
    /// adopted, and the client token makes EC2 itself return the first
    /// launch when a retried call arrives.
    pub async fn create(
        &self,
        launch: &Launch<'_>,
    ) -> Result<(InstanceFacts, Market), ProviderError> {
        let req = launch.machine;
        if req.user_data.len() > MAX_USER_DATA {
            return Err(ProviderError::Failed {
                provider: PROVIDER,
                action: "launch",
                object: format!("machine {}", req.machine),
                detail: format!(
                    "user data is {} bytes; EC2 allows {MAX_USER_DATA}",
                    req.user_data.len()
                ),
            });
        }
        if let Some(existing) = self.find_machine(&req.machine_uid).await? {
            tracing::info!(machine = %req.machine, instance = %existing.instance_id, state = %existing.state_name, "instance already exists; adopted");
            return Ok((existing, Market::Adopted));
        }
        let spot = launch.template.spot.as_deref().filter(|s| s.enabled);
        let (out, market) = match spot {
            None => (
                self.run(launch, None, &req.machine_uid).await,
                Market::OnDemand,
            ),
            Some(spot) => match self.run(launch, Some(spot), &req.machine_uid).await {
                Err(e) if spot.on_demand_fallback && spot_refusal(e.code()) => {
                    let why = self
                        .error(
                            "launch a spot instance for",
                            format!("machine {}", req.machine),
                            e,
                        )
                        .to_string();
                    tracing::warn!(machine = %req.machine, region = %self.region, error = %why, "no spot capacity; launching on demand (onDemandFallback)");
                    crate::metrics::global().spot_fallback();
                    // Another client token: EC2 refuses a token reused with
                    // other parameters (IdempotentParameterMismatch).
                    let token = format!("{}-on-demand", req.machine_uid);
                    (
                        self.run(launch, None, &token).await,
                        Market::OnDemandAfterSpot(why),
                    )
                }
                other => (other, Market::Spot),
            },
        };
        let out = out.map_err(|e| {
            self.error(
                "launch an instance for",
                format!("machine {}", req.machine),
                e,
            )
        })?;
        let launched =
            out.instances()
                .first()
                .and_then(facts)
                .ok_or_else(|| ProviderError::Failed {
                    provider: PROVIDER,
                    action: "launch an instance for",
                    object: format!("machine {}", req.machine),
                    detail: "RunInstances answered without an instance".into(),
                })?;
        let t = launch.template;
        tracing::info!(machine = %req.machine, instance = %launched.instance_id, zone = ?launched.zone, subnet = %launch.subnet, ami = %t.ami, instance_type = %t.instance_type, market = %market, region = %self.region, "instance launched");
        Ok((launched, market))
    }

    /// One `RunInstances` call for the launch: on spot (at `spot`'s max
    /// price) when given, under client token `token`.
    async fn run(
        &self,
        launch: &Launch<'_>,
        spot: Option<&AwsSpot>,
        token: &str,
    ) -> Result<
        aws_sdk_ec2::operation::run_instances::RunInstancesOutput,
        aws_sdk_ec2::error::SdkError<aws_sdk_ec2::operation::run_instances::RunInstancesError>,
    > {
        let req = launch.machine;
        let tags = self.tags(req, &launch.tags);
        let t = launch.template;
        let mut call = self
            .client
            .run_instances()
            .image_id(&t.ami)
            .instance_type(InstanceType::from(t.instance_type.as_str()))
            .min_count(1)
            .max_count(1)
            .client_token(token)
            .subnet_id(launch.subnet)
            .set_security_group_ids(
                (!t.security_groups.is_empty()).then(|| t.security_groups.clone()),
            )
            .user_data(base64::engine::general_purpose::STANDARD.encode(&req.user_data))
            .metadata_options(
                InstanceMetadataOptionsRequest::builder()
                    .http_endpoint(InstanceMetadataEndpointState::Enabled)
                    .http_tokens(HttpTokensState::Required)
                    .http_put_response_hop_limit(1)
                    .build(),
            );
        if let Some(spot) = spot {
            // One-time spot requests only: a persistent one would launch a
            // new instance behind Drover's back when EC2 takes one.
            call = call.instance_market_options(
                InstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::Spot)
                    .spot_options(
                        SpotMarketOptions::builder()
                            .set_max_price(spot.max_price.clone())
                            .spot_instance_type(SpotInstanceType::OneTime)
                            .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
                            .build(),
                    )
                    .build(),
            );
        }
        for resource in [ResourceType::Instance, ResourceType::Volume] {
            call = call.tag_specifications(
                TagSpecification::builder()
                    .resource_type(resource)
                    .set_tags(Some(tags.clone()))
                    .build(),
            );
        }
        if let Some(profile) = &t.instance_profile {
            let spec = if profile.starts_with("arn:") {
                IamInstanceProfileSpecification::builder().arn(profile)
            } else {
                IamInstanceProfileSpecification::builder().name(profile)
            };
            call = call.iam_instance_profile(spec.build());
        }
        call.send().await
    }

    /// Terminates an instance; one already gone counts as terminated.
    pub async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        match self
            .client
            .terminate_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(_) => {
                tracing::info!(instance = %instance_id, region = %self.region, "instance terminated");
                Ok(())
            }
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => Ok(()),
            Err(e) => Err(self.error("terminate", format!("instance {instance_id}"), e)),
        }
    }

    /// Terminates every instance of a machine (by its UID tag) and the one
    /// recorded for it, if any.
    pub async fn delete_machine(
        &self,
        machine_uid: &str,
        recorded: Option<&str>,
    ) -> Result<(), ProviderError> {
        let mut ids: Vec<String> = self
            .list_filtered(vec![tag_filter(LABEL_MACHINE_UID, machine_uid)])
            .await?
            .into_iter()
            .filter(|i| i.state_name != "terminated")
            .map(|i| i.instance_id)
            .collect();
        if let Some(r) = recorded {
            if !ids.iter().any(|i| i == r) {
                ids.push(r.to_owned());
            }
        }
        for id in ids {
            self.terminate(&id).await?;
        }
        Ok(())
    }

    /// The instance launched for a machine UID that is not terminated.
    pub async fn find_machine(
        &self,
        machine_uid: &str,
    ) -> Result<Option<InstanceFacts>, ProviderError> {
        Ok(self
            .list_filtered(vec![tag_filter(LABEL_MACHINE_UID, machine_uid)])
            .await?
            .into_iter()
            .find(|i| !matches!(i.state_name.as_str(), "terminated" | "shutting-down")))
    }

    /// The CPUs and memory of instance type `instance_type`, as EC2
    /// describes it (`DescribeInstanceTypes`: default vCPUs, memory in
    /// MiB); `None` when EC2 does not know the type. What a template node
    /// of a pool of that type has, so an empty pool can scale from zero.
    pub async fn instance_type_capacity(
        &self,
        instance_type: &str,
    ) -> Result<Option<drover_common::api::Capacity>, ProviderError> {
        let out = self
            .client
            .describe_instance_types()
            .instance_types(InstanceType::from(instance_type))
            .send()
            .await;
        let out = match out {
            Ok(out) => out,
            Err(e)
                if e.code()
                    .is_some_and(|c| c.starts_with("InvalidInstanceType")) =>
            {
                return Ok(None)
            }
            Err(e) => {
                return Err(self.error("describe", format!("instance type {instance_type}"), e))
            }
        };
        Ok(out.instance_types().first().and_then(|t| {
            let cpus = t.v_cpu_info()?.default_v_cpus()?;
            let mib = t.memory_info()?.size_in_mib()?;
            Some(drover_common::api::Capacity {
                cpus: u32::try_from(cpus).ok()?,
                memory_bytes: u64::try_from(mib).ok()? << 20,
            })
        }))
    }

    /// One instance by ID; `None` when EC2 does not know it.
    pub async fn describe(
        &self,
        instance_id: &str,
    ) -> Result<Option<InstanceFacts>, ProviderError> {
        match self
            .client
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(out) => Ok(out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .find_map(facts)),
            Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidInstanceID")) => Ok(None),
            Err(e) => Err(self.error("describe", format!("instance {instance_id}"), e)),
        }
    }

    /// Every instance this coordinator launched in the region, terminated
    /// ones included (EC2 lists them for about an hour).
    pub async fn instances(&self) -> Result<Vec<InstanceFacts>, ProviderError> {
        self.list_filtered(vec![]).await
    }

    /// [`AwsProvider::instances`] in the provider-neutral shape, from a
    /// listing at most [`LIST_TTL`] old.
    pub async fn list(&self) -> Result<Vec<ProviderMachine>, ProviderError> {
        if let Some((at, list)) = &*self.listed.lock().expect("listing lock") {
            if at.elapsed() < LIST_TTL {
                return Ok(list.clone());
            }
        }
        let list: Vec<ProviderMachine> = self
            .instances()
            .await?
            .into_iter()
            .map(|i| ProviderMachine {
                provider_id: i.instance_id,
                labels: i.tags,
                state: i.state,
            })
            .collect();
        *self.listed.lock().expect("listing lock") =
            Some((std::time::Instant::now(), list.clone()));
        Ok(list)
    }

    async fn list_filtered(
        &self,
        mut filters: Vec<Filter>,
    ) -> Result<Vec<InstanceFacts>, ProviderError> {
        filters.push(tag_filter(LABEL_MANAGED, &self.owner));
        let mut found = vec![];
        let mut next: Option<String> = None;
        loop {
            let out = self
                .client
                .describe_instances()
                .set_filters(Some(filters.clone()))
                .set_next_token(next.take())
                .send()
                .await
                .map_err(|e| self.error("list instances", "of this coordinator", e))?;
            found.extend(
                out.reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .filter_map(facts),
            );
            match out.next_token() {
                Some(t) if !t.is_empty() => next = Some(t.to_owned()),
                _ => return Ok(found),
            }
        }
    }
}

fn tag_filter(key: &str, value: &str) -> Filter {
    Filter::builder()
        .name(format!("tag:{key}"))
        .values(value)
        .build()
}

fn facts(i: &Instance) -> Option<InstanceFacts> {
    let name = i.state().and_then(|s| s.name()).cloned();
    let state = match &name {
        Some(InstanceStateName::Running) => InstanceState::Running,
        Some(InstanceStateName::Pending) | None => InstanceState::Pending,
        // Stopping, stopped, shutting down, terminated: it will not serve
        // again by itself.
        Some(_) => InstanceState::Stopped,
    };
    Some(InstanceFacts {
        instance_id: i.instance_id()?.to_owned(),
        state,
        state_name: name.map(|n| n.as_str().to_owned()).unwrap_or_default(),
        zone: i
            .placement()
            .and_then(|p| p.availability_zone())
            .map(str::to_owned),
        tags: i
            .tags()
            .iter()
            .filter_map(|t| {
                Some((
                    t.key()?.to_owned(),
                    t.value().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
    })
}

impl AwsProvider {
    /// Launches a machine of an `aws` cluster: picks its pool's template,
    /// records its subnet, then launches with its bootstrap document.
    async fn create_machine(&self, host: &dyn CreateHost) -> Result<Created, ProviderError> {
        let (cluster, m) = (host.cluster(), host.machine());
        let ProviderSpec::Aws(spec) = &cluster.spec.provider else {
            return super::not_its_cluster(PROVIDER, "launch", host, "an aws cluster");
        };
        let pool = m
            .spec
            .assignment
            .as_ref()
            .map(|a| a.machine_pool.clone())
            .unwrap_or_default();
        let template = spec.template(&pool).ok_or_else(|| ProviderError::Failed {
            provider: PROVIDER,
            action: "find the machine template for",
            object: format!("machine {}", m.metadata.name),
            detail: format!("spec.provider.aws has no template for pool {pool}"),
        })?;
        // Record the subnet before the launch: a retried launch must send the
        // same parameters under the same client token.
        let subnet = match m
            .status
            .failure_domain
            .clone()
            .filter(|s| template.subnets.contains(s))
        {
            Some(s) => s,
            None => {
                let failed = |action| {
                    let object = format!("machine {}", m.metadata.name);
                    move |detail: HostError| ProviderError::Failed {
                        provider: PROVIDER,
                        action,
                        object,
                        detail: detail.to_string(),
                    }
                };
                let in_use = host
                    .failure_domains_in_use()
                    .map_err(failed("choose a subnet for"))?;
                let in_use: Vec<&str> = in_use.iter().map(String::as_str).collect();
                let chosen = choose_subnet(template, &in_use)
                    .unwrap_or_default()
                    .to_owned();
                host.record_failure_domain(&chosen)
                    .map_err(failed("record the subnet of"))?;
                chosen
            }
        };
        let doc = host.bootstrap_document(host.advertise_urls());
        let req = MachineRequest::new(
            cluster,
            m,
            user_data(&cluster.metadata.name, &m.metadata.name, &doc),
            &template.ami,
        );
        let (launched, market) = self
            .create(&Launch {
                machine: &req,
                template,
                subnet: &subnet,
                tags: spec.tags_for(template),
            })
            .await?;
        Ok(Created {
            message: format!(
                "instance {} launched in {subnet} ({}, {}, {market}, region {})",
                launched.instance_id, template.ami, template.instance_type, spec.region
            ),
            node_provider_id: Some(launched.node_provider_id()),
            provider_id: launched.instance_id,
        })
    }

    /// The instance ID the agent read from instance metadata must be the
    /// instance launched for the machine, running, and carry this
    /// coordinator's tags for the machine's UID.
    async fn check_instance(
        &self,
        m: &Machine,
        reported: Option<&str>,
    ) -> Result<(), InstanceCheckError> {
        use InstanceCheckError::{Refused, Unavailable};
        let name = &m.metadata.name;
        let uid = m.metadata.uid.as_deref().unwrap_or_default();
        let Some(reported) = reported else {
            return Err(Refused(format!(
                "machine {name} runs on EC2 but the agent reported no instance ID; it must read its bootstrap document from instance metadata (IMDSv2), not a file"
            )));
        };
        if let Some(launched) = m.status.provider_id.as_deref() {
            if launched != reported {
                return Err(Refused(format!(
                    "the ticket of machine {name} belongs to instance {launched}, but it was presented from instance {reported}"
                )));
            }
        }
        let facts = self
            .describe(reported)
            .await
            .map_err(|e| Unavailable(format!("cannot check instance {reported}: {e}")))?
            .ok_or_else(|| {
                Refused(format!(
                    "instance {reported} does not exist in region {}",
                    self.region
                ))
            })?;
        let tag = |k: &str| facts.tags.get(k).map(String::as_str);
        if tag(LABEL_MANAGED) != Some(self.owner.as_str()) || tag(LABEL_MACHINE_UID) != Some(uid) {
            return Err(Refused(format!(
                "instance {reported} was not launched by this coordinator for machine {name} (its {} tag is {:?})",
                LABEL_MACHINE_UID,
                tag(LABEL_MACHINE_UID)
            )));
        }
        match facts.state {
            InstanceState::Running => Ok(()),
            InstanceState::Pending => Err(Unavailable(format!(
                "instance {reported} is still pending; retry when it runs"
            ))),
            InstanceState::Stopped | InstanceState::Paused => Err(Refused(format!(
                "instance {reported} is {}; only a running instance may register",
                facts.state_name
            ))),
        }
    }

    /// Every instance, load balancer and target group of this coordinator
    /// in the region, for the sweeper.
    async fn managed_objects(&self) -> Result<Vec<Managed>, ProviderError> {
        let mut out: Vec<Managed> = self
            .instances()
            .await?
            .into_iter()
            .map(|i| Managed::Machine {
                gone: matches!(i.state_name.as_str(), "terminated" | "shutting-down"),
                provider_id: i.instance_id,
                labels: i.tags,
            })
            .collect();
        out.extend(self.managed_load_balancers().await?);
        Ok(out)
    }

    async fn remove(&self, orphan: &Managed) -> Result<Option<String>, ProviderError> {
        match orphan {
            Managed::Machine {
                provider_id,
                labels,
                ..
            } => {
                self.terminate(provider_id).await?;
                tracing::warn!(instance = %provider_id, region = %self.region, tags = ?labels, "orphan instance terminated");
                Ok(Some(format!("instance {provider_id} ({})", self.region)))
            }
            Managed::ClusterResource { name, .. } => {
                Ok(Some(self.remove_load_balancer(name).await?))
            }
        }
    }
}

/// The `aws` provider of one region as a [`Provider`].
impl Provider for AwsProvider {
    fn create<'a>(&'a self, host: &'a dyn CreateHost) -> Fut<'a, Created> {
        Box::pin(self.create_machine(host))
    }

    fn destroy<'a>(&'a self, _: &'a Cluster, machine: &'a Machine) -> Fut<'a, ()> {
        Box::pin(self.delete_machine(
            machine.metadata.uid.as_deref().unwrap_or_default(),
            machine.status.provider_id.as_deref(),
        ))
    }

    fn delete_cluster_resources<'a>(&'a self, cluster: &'a Cluster) -> Fut<'a, ()> {
        Box::pin(self.delete_load_balancer(cluster))
    }

    fn ensure_endpoint<'a>(
        &'a self,
        cluster: &'a Cluster,
    ) -> Fut<'a, Option<EndpointLoadBalancer>> {
        Box::pin(async move { self.ensure_load_balancer(cluster).await.map(Some) })
    }

    fn set_endpoint_backends<'a>(
        &'a self,
        cluster: &'a Cluster,
        config: &'a drover_common::wire::LoadBalancerConfig,
    ) -> Fut<'a, ()> {
        Box::pin(self.set_load_balancer_targets(cluster, config))
    }

    fn list(&self) -> Fut<'_, Vec<ProviderMachine>> {
        Box::pin(AwsProvider::list(self))
    }

    fn managed(&self) -> Fut<'_, Vec<Managed>> {
        Box::pin(self.managed_objects())
    }

    fn remove_orphan<'a>(&'a self, orphan: &'a Managed) -> Fut<'a, Option<String>> {
        Box::pin(self.remove(orphan))
    }

    fn verify_instance<'a>(&'a self, machine: &'a Machine, reported: Option<&'a str>) -> Check<'a> {
        Box::pin(self.check_instance(machine, reported))
    }
}

/// The user data of a machine: a `#cloud-config` that carries the bootstrap
/// document for the agent and asks cloud-init for nothing else.
pub fn user_data(cluster: &str, machine: &str, document: &str) -> String {
    let mut out = format!(
        "#cloud-config\n# Drover machine {machine} of cluster {cluster}; drover-agent reads drover_bootstrap.\ndrover_bootstrap: |\n"
    );
    for line in document.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The subnet for a new machine: the template's subnet holding the fewest
/// of the pool's machines, so a pool spreads over availability zones.
pub fn choose_subnet<'a>(template: &'a AwsMachineTemplate, in_use: &[&str]) -> Option<&'a str> {
    template
        .subnets
        .iter()
        .min_by_key(|s| in_use.iter().filter(|u| *u == s).count())
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_fill_evenly_in_order() {
        let t = AwsMachineTemplate {
            ami: "ami-12c6146b".into(),
            instance_type: "t3.medium".into(),
            subnets: vec!["subnet-a".into(), "subnet-b".into(), "subnet-c".into()],
            security_groups: vec![],
            instance_profile: None,
            tags: BTreeMap::new(),
            spot: None,
        };
        assert_eq!(choose_subnet(&t, &[]), Some("subnet-a"));
        assert_eq!(choose_subnet(&t, &["subnet-a"]), Some("subnet-b"));
        assert_eq!(
            choose_subnet(&t, &["subnet-a", "subnet-b"]),
            Some("subnet-c")
        );
        assert_eq!(
            choose_subnet(&t, &["subnet-a", "subnet-b", "subnet-c", "subnet-b"]),
            Some("subnet-a")
        );
    }

    #[test]
    fn user_data_is_cloud_config_the_agent_reads() {
        let doc = "apiVersion: drover.dev/v1alpha1\nkind: BootstrapDocument\nticket: dt1.x.y\n";
        let ud = user_data("prod", "prod-cp-abcde", doc);
        assert!(ud.starts_with("#cloud-config\n"));
        assert!(ud.contains("drover_bootstrap: |\n  apiVersion: drover.dev/v1alpha1\n"));
        let value: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        assert_eq!(value["drover_bootstrap"].as_str().unwrap(), doc);
    }
}
