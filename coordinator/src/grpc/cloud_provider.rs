//! The `CloudProvider` service: each call identifies its cluster by the
//! client certificate, reads that cluster and its machines fresh from the
//! store, lets `domain::autoscaling` decide, and writes what changes in
//! one transaction. Every call is audited (actor `autoscaler:<cluster>`,
//! method `GRPC`, the call's path) and counted
//! (`drover_autoscaler_calls_total{method,code}`).

use std::sync::Arc;
use std::time::Instant;

use drover_common::api::{Cluster, Machine, WorkerPoolSpec};
use drover_common::names::SCALE_DOWN_ANNOTATION;
use rustls::pki_types::CertificateDer;
use tonic::{Code as GrpcCode, Request, Response, Status};

use super::proto::{self, cloud_provider_server::CloudProvider};
use crate::app::App;
use crate::domain::autoscaling::{
    self as scaling, Code, Refusal, COMMON_NAME_PREFIX, ORGANIZATION_PREFIX,
};
use crate::domain::managed_fields;
use crate::store::{Kind, Op, StoreError};

/// The field manager of the autoscaler's writes: `replicas` of an
/// autoscaled pool is its (`kubectl` and GitOps see it own the field).
pub const MANAGER: &str = "cluster-autoscaler";

/// The label Drover would put on machines with GPUs, as `GPULabel`
/// answers it (no machine reports GPUs yet, so no group offers them).
pub const GPU_LABEL: &str = "drover.dev/gpu";

/// The service's full name, the first part of each call's path.
const SERVICE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";

/// The service over one coordinator.
pub struct Service {
    app: Arc<App>,
}

impl Service {
    pub fn new(app: Arc<App>) -> Self {
        Self { app }
    }
}

/// The cluster a caller's certificate is for.
#[derive(Debug, Clone)]
struct Caller {
    cluster: String,
    uid: String,
}

/// The caller's cluster, from its verified client certificate (the TLS
/// layer refused any the CA did not sign).
fn caller_of(certs: Option<Arc<Vec<CertificateDer<'static>>>>) -> Result<Caller, Status> {
    let refused = |why: &str| {
        Status::unauthenticated(format!(
            "{why}; write the autoscaler's credentials with `drover autoscaler-config CLUSTER`"
        ))
    };
    let certs = certs.ok_or_else(|| refused("no client certificate"))?;
    let der = certs
        .first()
        .ok_or_else(|| refused("no client certificate"))?;
    let info = drover_common::pki::cert_info(der)
        .map_err(|e| refused(&format!("the client certificate is unreadable: {e}")))?;
    let cluster = info
        .common_name
        .strip_prefix(COMMON_NAME_PREFIX)
        .ok_or_else(|| {
            refused(&format!(
                "the client certificate is {:?}'s, not a cluster autoscaler's",
                info.common_name
            ))
        })?
        .to_owned();
    let uid = info
        .organizations
        .iter()
        .find_map(|o| o.strip_prefix(ORGANIZATION_PREFIX))
        .ok_or_else(|| refused("the client certificate names no cluster UID"))?
        .to_owned();
    Ok(Caller { cluster, uid })
}

/// The caller's cluster and its machines, as the store has them now.
struct Scope {
    cluster: Cluster,
    machines: Vec<Machine>,
}

fn internal(e: StoreError) -> Status {
    Status::unavailable(format!("the coordinator's store failed: {e}; retry"))
}

fn scope(app: &App, caller: &Caller) -> Result<Scope, Status> {
    let cluster = app
        .cluster(&caller.cluster)
        .map_err(internal)?
        .filter(|c| c.metadata.uid.as_deref() == Some(caller.uid.as_str()))
        .ok_or_else(|| {
            Status::permission_denied(format!(
                "cluster {} (UID {}) that this certificate is for no longer exists; write new credentials with `drover autoscaler-config {}`",
                caller.cluster, caller.uid, caller.cluster
            ))
        })?;
    let machines = machines_of(app, caller)?;
    Ok(Scope { cluster, machines })
}

/// The machines assigned to the caller's cluster, as stored now.
fn machines_of(app: &App, caller: &Caller) -> Result<Vec<Machine>, Status> {
    Ok(app
        .cluster_machines(&caller.uid)
        .map_err(internal)?
        .into_iter()
        .filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| a.cluster_uid == caller.uid)
        })
        .collect())
}

fn status_of(r: Refusal) -> Status {
    let code = match r.code {
        Code::InvalidArgument => GrpcCode::InvalidArgument,
        Code::NotFound => GrpcCode::NotFound,
        Code::PermissionDenied => GrpcCode::PermissionDenied,
        Code::OutOfRange => GrpcCode::OutOfRange,
        Code::FailedPrecondition => GrpcCode::FailedPrecondition,
    };
    Status::new(code, r.message)
}

/// The HTTP status the audit log records for a gRPC code (as gRPC's
/// HTTP mapping pairs them).
fn http_status(code: GrpcCode) -> u16 {
    match code {
        GrpcCode::Ok => 200,
        GrpcCode::InvalidArgument | GrpcCode::OutOfRange | GrpcCode::FailedPrecondition => 400,
        GrpcCode::Unauthenticated => 401,
        GrpcCode::PermissionDenied => 403,
        GrpcCode::NotFound => 404,
        GrpcCode::Unimplemented => 501,
        GrpcCode::Unavailable => 503,
        _ => 500,
    }
}

/// The `code` label of a call's count.
fn code_label(code: GrpcCode) -> &'static str {
    match code {
        GrpcCode::Ok => "ok",
        GrpcCode::InvalidArgument => "invalid_argument",
        GrpcCode::NotFound => "not_found",
        GrpcCode::PermissionDenied => "permission_denied",
        GrpcCode::OutOfRange => "out_of_range",
        GrpcCode::FailedPrecondition => "failed_precondition",
        GrpcCode::Unauthenticated => "unauthenticated",
        GrpcCode::Unimplemented => "unimplemented",
        GrpcCode::Unavailable => "unavailable",
        _ => "other",
    }
}

/// What a call gives back, and what it changed (for the audit log).
type Outcome<A> = Result<(A, Vec<String>), Status>;

impl Service {
    /// Runs `work` for the caller of `req` on the blocking pool (it reads
    /// and writes the store), then audits and counts the call.
    async fn call<Q, A>(
        &self,
        req: Request<Q>,
        method: &'static str,
        work: impl FnOnce(&App, &Caller, &Scope, Q) -> Outcome<A> + Send + 'static,
    ) -> Result<Response<A>, Status>
    where
        Q: Send + 'static,
        A: Send + 'static,
    {
        let started = Instant::now();
        let source = req
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let caller = caller_of(req.peer_certs());
        let actor = caller
            .as_ref()
            .map(|c| format!("autoscaler:{}", c.cluster))
            .unwrap_or_else(|_| "anonymous".into());
        let outcome = match caller {
            Ok(caller) => {
                let app = self.app.clone();
                crate::store::blocking(move || {
                    let scope = scope(&app, &caller)?;
                    work(&app, &caller, &scope, req.into_inner())
                })
                .await
            }
            Err(refused) => Err(refused),
        };
        let (code, changes) = match &outcome {
            Ok((_, changes)) => (GrpcCode::Ok, changes.clone()),
            Err(s) => (s.code(), vec![]),
        };
        match &outcome {
            Err(s) if s.code() != GrpcCode::Unimplemented => {
                tracing::warn!(%actor, %source, method, code = ?s.code(), message = %s.message(), "autoscaler call refused")
            }
            _ => tracing::debug!(%actor, %source, method, "autoscaler call"),
        }
        self.app.audit.record(crate::types::AuditEntry {
            time: drover_common::now(),
            actor,
            source,
            method: "GRPC".into(),
            path: format!("/{SERVICE}/{method}"),
            status: http_status(code),
            stage: None,
            suppressed: None,
            changes,
        });
        crate::metrics::global().autoscaler_call(method, code_label(code), started.elapsed());
        outcome.map(|(answer, _)| Response::new(answer))
    }
}

impl Service {
    /// The vCPUs and memory of the instance type of the AWS pool `req`
    /// names, when it names one (`None` for other providers, or when the
    /// caller or group is not one: the call itself then refuses).
    async fn instance_type_capacity(
        &self,
        req: &Request<proto::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Option<drover_common::api::Capacity>, Status> {
        #[cfg(feature = "aws")]
        {
            let Ok(caller) = caller_of(req.peer_certs()) else {
                return Ok(None);
            };
            let app = self.app.clone();
            let cluster = crate::store::blocking(move || app.cluster(&caller.cluster))
                .await
                .map_err(internal)?;
            let Some(cluster) = cluster else {
                return Ok(None);
            };
            let drover_common::api::ProviderSpec::Aws(spec) = &cluster.spec.provider else {
                return Ok(None);
            };
            let Some((_, pool)) = req.get_ref().id.split_once('/') else {
                return Ok(None);
            };
            let Some(template) = spec.template(pool) else {
                return Ok(None);
            };
            let aws = self.app.providers.aws(&spec.region).await;
            return aws
                .instance_type_capacity(&template.instance_type)
                .await
                .map_err(|e| Status::unavailable(e.to_string()));
        }
        #[cfg(not(feature = "aws"))]
        {
            let _ = req;
            Ok(None)
        }
    }
}

fn group(g: scaling::NodeGroup) -> proto::NodeGroup {
    proto::NodeGroup {
        id: g.id,
        min_size: g.min_size as i32,
        max_size: g.max_size as i32,
        debug: g.debug,
    }
}

/// The pool group `id` names in the caller's cluster.
fn pool<'a>(scope: &'a Scope, id: &str) -> Result<&'a WorkerPoolSpec, Status> {
    scaling::pool_of(&scope.cluster, id).map_err(status_of)
}

/// A free machine pool cluster `cluster` may claim for `pool`, if there
/// is one.
fn free_match(
    app: &App,
    cluster: &Cluster,
    pool: &WorkerPoolSpec,
) -> Result<Option<Machine>, Status> {
    if cluster.spec.provider.creates_machines() {
        return Ok(None);
    }
    let wanted = |m: &Machine| {
        m.spec.assignment.is_none()
            && m.metadata.deletion_timestamp.is_none()
            && m.status.phase == drover_common::api::MachinePhase::Registered
            && pool.selector.matches(&m.metadata.labels)
            && provider_takes(cluster, m)
    };
    if app.fleet.controller.term().is_some() {
        // The leader's fleet index knows the free machines this cluster may
        // claim, without reading the fleet.
        for name in app.fleet.controller.index.candidates(cluster, |_| true) {
            if let Some(m) = app.machine(&name).map_err(internal)?.filter(wanted) {
                return Ok(Some(m));
            }
        }
        return Ok(None);
    }
    Ok(app.machines().map_err(internal)?.into_iter().find(wanted))
}

/// Whether a machine for `pool` can be had: always from a provider that
/// creates machines; on a pool cluster, when a free machine matches.
fn can_fill(app: &App, cluster: &Cluster, pool: &WorkerPoolSpec) -> Result<bool, Status> {
    Ok(cluster.spec.provider.creates_machines() || free_match(app, cluster, pool)?.is_some())
}

/// `t` as `v1.Node#Marshal()` would write it: Ready, its capacity, and
/// allocatable as the kubelet's defaults leave it (the eviction memory
/// kept back).
fn node_bytes(t: &scaling::TemplateNode) -> Vec<u8> {
    use super::k8s;
    use prost::Message;
    let resources = |memory: u64| {
        [
            ("cpu", t.capacity.cpus.to_string()),
            ("memory", memory.to_string()),
            ("pods", scaling::DEFAULT_MAX_PODS.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), k8s::Quantity::of(v)))
        .collect()
    };
    k8s::Node {
        metadata: Some(k8s::ObjectMeta {
            name: Some(t.name.clone()),
            labels: t.labels.clone(),
        }),
        spec: Some(k8s::NodeSpec {
            provider_id: Some(t.provider_id.clone()),
            taints: vec![],
        }),
        status: Some(k8s::NodeStatus {
            capacity: resources(t.capacity.memory_bytes),
            allocatable: resources(
                t.capacity
                    .memory_bytes
                    .saturating_sub(scaling::EVICTION_MEMORY),
            ),
            conditions: vec![k8s::NodeCondition {
                r#type: Some("Ready".into()),
                status: Some("True".into()),
            }],
            node_info: Some(k8s::NodeSystemInfo {
                kubelet_version: Some(t.kubelet_version.clone()),
                operating_system: Some("linux".into()),
                architecture: Some("amd64".into()),
            }),
        }),
    }
    .encode_to_vec()
}

/// Whether pool cluster `cluster` may claim free machine `m`: it
/// registered into the cluster's pool, if one is named, and matches the
/// cluster's selector.
fn provider_takes(cluster: &Cluster, m: &Machine) -> bool {
    let drover_common::api::ProviderSpec::Pool(p) = &cluster.spec.provider else {
        return false;
    };
    p.selector.matches(&m.metadata.labels)
        && p.pool.as_ref().is_none_or(|pool| m.spec.pool == *pool)
}

/// Sets the replicas of pool `pool_name` of the caller's cluster to what
/// `decide` makes of it (fresh from the store), and marks the machines it
/// names to leave, in one transaction, retried when something else wrote
/// meanwhile. Returns what changed.
fn scale(
    app: &App,
    caller: &Caller,
    pool_name: &str,
    decide: impl Fn(&Scope, &WorkerPoolSpec) -> Result<(u32, Vec<String>), Status>,
) -> Result<Vec<String>, Status> {
    for _ in 0..crate::store::MODIFY_ATTEMPTS {
        let scope = scope(app, caller)?;
        let cluster = &scope.cluster;
        let name = &cluster.metadata.name;
        let current = cluster
            .spec
            .worker_pools
            .iter()
            .find(|p| p.name == pool_name)
            .ok_or_else(|| Status::not_found(format!("cluster {name} has no pool {pool_name}")))?;
        let (replicas, leaving) = decide(&scope, current)?;
        if replicas == current.replicas && leaving.is_empty() {
            return Ok(vec![]);
        }
        let mut next = cluster.clone();
        let rev = next
            .metadata
            .resource_version
            .take()
            .and_then(|r| r.parse().ok());
        if let Some(p) = next
            .spec
            .worker_pools
            .iter_mut()
            .find(|p| p.name == pool_name)
        {
            p.replicas = replicas;
        }
        next.metadata.generation += 1;
        let owned = |c: &Cluster| {
            serde_json::to_value(c)
                .map(|v| managed_fields::owned_part(&v))
                .unwrap_or_default()
        };
        next.metadata.managed_fields = managed_fields::update(
            &owned(cluster),
            &owned(&next),
            &cluster.metadata.managed_fields,
            MANAGER,
            drover_common::API_VERSION,
            drover_common::now(),
        );
        let mut ops = vec![Op::Update {
            kind: Kind::Cluster,
            name: name.clone(),
            body: crate::store::encode(&next),
            expected_revision: rev,
        }];
        let mut changes = vec![format!(
            "cluster {name} pool {pool_name}: replicas {} -> {replicas}",
            current.replicas
        )];
        for m in scope
            .machines
            .iter()
            .filter(|m| leaving.contains(&m.metadata.name))
        {
            let mut marked = m.clone();
            let rev = marked
                .metadata
                .resource_version
                .take()
                .and_then(|r| r.parse().ok());
            marked
                .metadata
                .annotations
                .insert(SCALE_DOWN_ANNOTATION.into(), MANAGER.into());
            drover_common::api::push_event(
                &mut marked.status.events,
                "ScaledDown",
                format!("the cluster-autoscaler of cluster {name} took it out of pool {pool_name}"),
            );
            ops.push(Op::Update {
                kind: Kind::Machine,
                name: m.metadata.name.clone(),
                body: crate::store::encode(&marked),
                expected_revision: rev,
            });
            changes.push(format!("machine {} scaled down", m.metadata.name));
        }
        match app.store.txn(ops) {
            Ok(_) => {
                tracing::info!(cluster = %name, pool = %pool_name, from = current.replicas, to = replicas, leaving = ?leaving, "autoscaler scaled the pool");
                app.reconcile_cluster(name);
                return Ok(changes);
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(internal(e)),
        }
    }
    Err(Status::aborted(format!(
        "cluster {} kept changing while the autoscaler's write was tried; retry",
        caller.cluster
    )))
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!("Drover does not serve {what}"))
}

#[tonic::async_trait]
impl CloudProvider for Service {
    async fn node_groups(
        &self,
        req: Request<proto::NodeGroupsRequest>,
    ) -> Result<Response<proto::NodeGroupsResponse>, Status> {
        self.call(req, "NodeGroups", |_, _, scope, _| {
            let node_groups = scaling::node_groups(&scope.cluster)
                .into_iter()
                .map(group)
                .collect();
            Ok((proto::NodeGroupsResponse { node_groups }, vec![]))
        })
        .await
    }

    async fn node_group_for_node(
        &self,
        req: Request<proto::NodeGroupForNodeRequest>,
    ) -> Result<Response<proto::NodeGroupForNodeResponse>, Status> {
        self.call(req, "NodeGroupForNode", |_, _, scope, q| {
            let node = q.node.unwrap_or_default();
            let found = if node.provider_id.is_empty() {
                None
            } else {
                scaling::group_for_node(&scope.cluster, &scope.machines, &node.provider_id)
                    .map_err(status_of)?
            };
            // No group is a group with an empty id.
            let node_group = Some(found.map(group).unwrap_or_default());
            Ok((proto::NodeGroupForNodeResponse { node_group }, vec![]))
        })
        .await
    }

    async fn pricing_node_price(
        &self,
        req: Request<proto::PricingNodePriceRequest>,
    ) -> Result<Response<proto::PricingNodePriceResponse>, Status> {
        self.call(req, "PricingNodePrice", |_, _, _, _| {
            Err(unimplemented("prices"))
        })
        .await
    }

    async fn pricing_pod_price(
        &self,
        req: Request<proto::PricingPodPriceRequest>,
    ) -> Result<Response<proto::PricingPodPriceResponse>, Status> {
        self.call(req, "PricingPodPrice", |_, _, _, _| {
            Err(unimplemented("prices"))
        })
        .await
    }

    async fn gpu_label(
        &self,
        req: Request<proto::GpuLabelRequest>,
    ) -> Result<Response<proto::GpuLabelResponse>, Status> {
        self.call(req, "GPULabel", |_, _, _, _| {
            Ok((
                proto::GpuLabelResponse {
                    label: GPU_LABEL.into(),
                },
                vec![],
            ))
        })
        .await
    }

    async fn get_available_gpu_types(
        &self,
        req: Request<proto::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<proto::GetAvailableGpuTypesResponse>, Status> {
        self.call(req, "GetAvailableGPUTypes", |_, _, _, _| {
            Ok((proto::GetAvailableGpuTypesResponse::default(), vec![]))
        })
        .await
    }

    async fn cleanup(
        &self,
        req: Request<proto::CleanupRequest>,
    ) -> Result<Response<proto::CleanupResponse>, Status> {
        self.call(req, "Cleanup", |_, _, _, _| {
            Ok((proto::CleanupResponse {}, vec![]))
        })
        .await
    }

    async fn refresh(
        &self,
        req: Request<proto::RefreshRequest>,
    ) -> Result<Response<proto::RefreshResponse>, Status> {
        // Every call reads the store fresh: nothing is cached to refresh.
        self.call(req, "Refresh", |_, _, _, _| {
            Ok((proto::RefreshResponse {}, vec![]))
        })
        .await
    }

    async fn node_group_target_size(
        &self,
        req: Request<proto::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<proto::NodeGroupTargetSizeResponse>, Status> {
        self.call(req, "NodeGroupTargetSize", |_, _, scope, q| {
            let p = pool(scope, &q.id)?;
            Ok((
                proto::NodeGroupTargetSizeResponse {
                    target_size: p.replicas as i32,
                },
                vec![],
            ))
        })
        .await
    }

    async fn node_group_increase_size(
        &self,
        req: Request<proto::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<proto::NodeGroupIncreaseSizeResponse>, Status> {
        self.call(req, "NodeGroupIncreaseSize", |app, caller, scope, q| {
            let name = pool(scope, &q.id)?.name.clone();
            let changes = scale(app, caller, &name, |_, p| {
                Ok((scaling::increased(p, q.delta).map_err(status_of)?, vec![]))
            })?;
            Ok((proto::NodeGroupIncreaseSizeResponse {}, changes))
        })
        .await
    }

    async fn node_group_delete_nodes(
        &self,
        req: Request<proto::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<proto::NodeGroupDeleteNodesResponse>, Status> {
        self.call(req, "NodeGroupDeleteNodes", |app, caller, scope, q| {
            let name = pool(scope, &q.id)?.name.clone();
            let ids: Vec<String> = q.nodes.iter().map(|n| n.provider_id.clone()).collect();
            let id = q.id.clone();
            let changes = scale(app, caller, &name, |scope, p| deleted(scope, p, &id, &ids))?;
            Ok((proto::NodeGroupDeleteNodesResponse {}, changes))
        })
        .await
    }

    async fn node_group_decrease_target_size(
        &self,
        req: Request<proto::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<proto::NodeGroupDecreaseTargetSizeResponse>, Status> {
        self.call(
            req,
            "NodeGroupDecreaseTargetSize",
            |app, caller, scope, q| {
                let name = pool(scope, &q.id)?.name.clone();
                let changes = scale(app, caller, &name, |scope, p| {
                    let existing = scaling::existing(&scope.cluster, p, &scope.machines);
                    Ok((
                        scaling::decreased_target(p, q.delta, existing).map_err(status_of)?,
                        vec![],
                    ))
                })?;
                Ok((proto::NodeGroupDecreaseTargetSizeResponse {}, changes))
            },
        )
        .await
    }

    async fn node_group_nodes(
        &self,
        req: Request<proto::NodeGroupNodesRequest>,
    ) -> Result<Response<proto::NodeGroupNodesResponse>, Status> {
        self.call(req, "NodeGroupNodes", |app, caller, scope, q| {
            let p = pool(scope, &q.id)?;
            let fill = can_fill(app, &scope.cluster, p)?;
            // With no free machine left, the cluster's machines are read
            // again after that look: one the reconciler claimed since the
            // scope was read then counts as the pool's, not as missing
            // (an out-of-resources error would make the autoscaler back
            // off a scale-up that is going well).
            let again;
            let machines = if fill {
                &scope.machines
            } else {
                again = machines_of(app, caller)?;
                &again
            };
            let instances = scaling::instances(&scope.cluster, p, machines, fill)
                .into_iter()
                .map(instance)
                .collect();
            Ok((proto::NodeGroupNodesResponse { instances }, vec![]))
        })
        .await
    }

    async fn node_group_template_node_info(
        &self,
        req: Request<proto::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<proto::NodeGroupTemplateNodeInfoResponse>, Status> {
        // On AWS a new machine is an instance of the pool's type: its
        // vCPUs and memory, from EC2, before any instance exists.
        let of_type = self.instance_type_capacity(&req).await?;
        self.call(req, "NodeGroupTemplateNodeInfo", move |app, _, scope, q| {
            let p = pool(scope, &q.id)?;
            let capacity = match of_type {
                Some(c) => Some(c),
                None => {
                    let free = free_match(app, &scope.cluster, p)?;
                    scaling::reported_capacity(&scope.cluster, p, &scope.machines, free.as_ref())
                }
            };
            let capacity = capacity.ok_or_else(|| {
                Status::failed_precondition(format!(
                    "no machine of node group {} (nor a free one it may claim) has reported its CPUs and memory; register one with an agent of this version",
                    q.id
                ))
            })?;
            let bytes = node_bytes(&scaling::template(&scope.cluster, p, capacity));
            Ok((
                proto::NodeGroupTemplateNodeInfoResponse {
                    node_info: bytes.clone(),
                    node_bytes: bytes,
                    resource_slice_bytes: vec![],
                },
                vec![],
            ))
        })
        .await
    }

    async fn node_group_get_options(
        &self,
        req: Request<proto::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<proto::NodeGroupAutoscalingOptionsResponse>, Status> {
        // Drover sets no per-group options: each group gets the
        // autoscaler's own defaults, which it sends.
        self.call(req, "NodeGroupGetOptions", |_, _, scope, q| {
            pool(scope, &q.id)?;
            Ok((
                proto::NodeGroupAutoscalingOptionsResponse {
                    node_group_autoscaling_options: q.defaults,
                },
                vec![],
            ))
        })
        .await
    }
}

/// What `NodeGroupDeleteNodes` of the Nodes `ids` does to pool `p` (group
/// `id`): the pool's new replicas and the machines that leave. A
/// placeholder (a machine not there yet) only lowers the target; a Node
/// not in the group is refused, as the autoscaler's contract asks.
fn deleted(
    scope: &Scope,
    p: &WorkerPoolSpec,
    id: &str,
    ids: &[String],
) -> Result<(u32, Vec<String>), Status> {
    let cluster = &scope.cluster;
    let range = p
        .autoscaling
        .ok_or_else(|| Status::not_found(format!("pool {} is not autoscaled", p.name)))?;
    let mut leaving = vec![];
    let mut gone = 0u32;
    for node in ids {
        if scaling::is_placeholder(node)
            && node.starts_with(&format!("drover://{}/{}/", cluster.metadata.name, p.name))
        {
            gone += 1;
            continue;
        }
        let machine = scope
            .machines
            .iter()
            .filter(|m| {
                m.spec
                    .assignment
                    .as_ref()
                    .is_some_and(|a| a.machine_pool == p.name)
            })
            .find(|m| scaling::provider_id(&cluster.metadata.name, m) == *node)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "node {node} is not in node group {id}; nothing was deleted"
                ))
            })?;
        let already = machine.metadata.deletion_timestamp.is_some()
            || machine
                .metadata
                .annotations
                .contains_key(SCALE_DOWN_ANNOTATION);
        if !already {
            leaving.push(machine.metadata.name.clone());
            gone += 1;
        }
    }
    let replicas = p.replicas.saturating_sub(gone);
    if replicas < range.min_replicas {
        return Err(Status::out_of_range(format!(
            "deleting {gone} nodes would leave node group {id} with {replicas}, below its minimum of {}; nothing was deleted",
            range.min_replicas
        )));
    }
    Ok((replicas, leaving))
}

fn instance(i: scaling::Instance) -> proto::Instance {
    use proto::instance_status::InstanceState as S;
    let state = match i.state {
        scaling::InstanceState::Running => S::InstanceRunning,
        scaling::InstanceState::Creating => S::InstanceCreating,
        scaling::InstanceState::Deleting => S::InstanceDeleting,
    };
    proto::Instance {
        id: i.id,
        status: Some(proto::InstanceStatus {
            instance_state: state as i32,
            error_info: i.error.map(|e| proto::InstanceErrorInfo {
                error_code: e.code,
                error_message: e.message,
                instance_error_class: e.class,
            }),
        }),
    }
}
