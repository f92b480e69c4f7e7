//! One write of a Cluster, whichever API it came through: `/v1`'s PUT
//! (what `drover apply` sends) and the Kubernetes-style create, update,
//! patch and server-side apply (`kube/write.rs`). The caller decides the
//! cluster it wants from the one stored; this checks it as a whole (schema
//! rules, Secrets it reads, bundle sizes, immutable fields, version steps),
//! records the field managers, and writes it, or for a dry run says what
//! it would have written.
//!
//! Invariant: a write changes only `spec`, `metadata.labels`,
//! `metadata.annotations` and `metadata.managedFields`; `status` and the
//! rest of the metadata are the coordinator's. A write decided against one
//! copy of the cluster lands only if nothing but its status changed since
//! (the reconciler writes status all the time), else it is a conflict.

use axum::http::StatusCode;
use drover_common::api::{Cluster, ClusterStatus, FieldError};

use super::auth::Admin;
use super::error::ApiError;
use super::AuditChanges;
use crate::app::App;
use crate::domain::managed_fields;
use crate::store::Kind;

/// The field manager of `/v1` writes (what `drover apply` sends).
pub const DROVER_MANAGER: &str = "drover";

/// Whether a write may create the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// Create it or update it (`/v1` PUT, server-side apply).
    Allowed,
    /// Create only: an existing cluster is `AlreadyExists` (POST).
    Only,
    /// Update only: a missing cluster is `NotFound` (PUT, patch).
    Refused,
}

/// What a write does besides the object it decides (a Cluster here, a
/// Secret in `secrets.rs`).
pub struct Write<'a> {
    pub name: &'a str,
    pub admin: &'a Admin,
    pub creation: Creation,
    /// Check everything, write nothing (`dryRun=All`).
    pub dry_run: bool,
    /// The field manager of a write that is not an apply, which then owns
    /// the fields it changed; `None` when `decide` sets
    /// `metadata.managedFields` itself (server-side apply).
    pub manager: Option<&'a str>,
}

/// What the write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Updated,
    Unchanged,
}

impl Outcome {
    pub fn status(self) -> StatusCode {
        match self {
            Outcome::Created => StatusCode::CREATED,
            Outcome::Updated | Outcome::Unchanged => StatusCode::OK,
        }
    }
}

/// A cluster as a caller decided it.
pub struct Decided {
    pub cluster: Cluster,
    /// What its document said itself, which the typed cluster (its
    /// defaults filled in) cannot show.
    pub said: Said,
}

/// What a Cluster document says itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Said {
    /// Whether it says `spec.network.cni` (else it is defaulted: see
    /// [`defaulted_cni`]).
    pub cni: bool,
    /// The worker pools whose `replicas` the writer itself says (an
    /// autoscaled pool's is otherwise kept: see [`kept_replicas`]). For a
    /// server-side apply, those of the applied configuration.
    pub replicas_of: std::collections::BTreeSet<String>,
    /// The worker pools whose `replicas` the document has, whoever set it.
    pub has_replicas: std::collections::BTreeSet<String>,
}

impl Said {
    /// What `doc` says.
    pub fn of(doc: &serde_json::Value) -> Self {
        let replicas_of = pools_with_replicas(doc);
        Said {
            cni: doc["spec"]["network"].get("cni").is_some(),
            has_replicas: replicas_of.clone(),
            replicas_of,
        }
    }

    /// What a server-side apply of `config` that made `doc` says.
    pub fn of_apply(doc: &serde_json::Value, config: &serde_json::Value) -> Self {
        Said {
            replicas_of: pools_with_replicas(config),
            ..Self::of(doc)
        }
    }

    /// What a document as text says (nothing, if it does not parse: then
    /// it is refused anyway).
    pub fn of_text(body: &[u8]) -> Self {
        std::str::from_utf8(body)
            .ok()
            .and_then(|t| serde_saphyr::from_str::<serde_json::Value>(t).ok())
            .map(|d| Self::of(&d))
            .unwrap_or_default()
    }
}

/// The worker pools whose `replicas` `doc` has.
fn pools_with_replicas(doc: &serde_json::Value) -> std::collections::BTreeSet<String> {
    doc["spec"]["workerPools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p.get("replicas").is_some())
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// Fills in the `replicas` a document leaves out: an autoscaled pool
/// keeps its current count (brought into its range), a new one starts at
/// its `minReplicas`, so GitOps and the autoscaler never undo each other;
/// a pool that is not autoscaled must say it.
fn kept_replicas(
    name: &str,
    desired: &mut Cluster,
    current: Option<&Cluster>,
    said: &Said,
) -> Result<(), ApiError> {
    let mut errors = vec![];
    for (i, pool) in desired.spec.worker_pools.iter_mut().enumerate() {
        if said.replicas_of.contains(&pool.name) {
            continue;
        }
        let Some(range) = &pool.autoscaling else {
            if said.has_replicas.contains(&pool.name) {
                continue;
            }
            errors.push(FieldError {
                field: format!("spec.workerPools[{i}].replicas"),
                message: "is required unless the pool is autoscaled (autoscaling: {minReplicas, maxReplicas})".into(),
            });
            continue;
        };
        let now = current
            .and_then(|c| c.spec.worker_pools.iter().find(|p| p.name == pool.name))
            .map_or(range.min_replicas, |p| p.replicas);
        pool.replicas = range.clamp(now);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            format!("Cluster {name:?} is invalid; nothing was changed"),
            errors,
        ))
    }
}

fn owned(c: Option<&Cluster>) -> serde_json::Value {
    c.and_then(|c| serde_json::to_value(c).ok())
        .map(|v| managed_fields::owned_part(&v))
        .unwrap_or(serde_json::Value::Null)
}

/// Whether two copies of a cluster differ in more than their status and
/// revision.
fn more_than_status_differs(a: &Cluster, b: &Cluster) -> bool {
    a.spec != b.spec
        || a.metadata.labels != b.metadata.labels
        || a.metadata.annotations != b.metadata.annotations
        || a.metadata.managed_fields != b.metadata.managed_fields
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
        || a.metadata.uid != b.metadata.uid
}

/// Checks `desired` as a whole, before anything is written.
fn check(app: &App, name: &str, desired: &Cluster) -> Result<(), ApiError> {
    if let Err(errors) = desired.validate() {
        return Err(ApiError::invalid(
            format!("Cluster {name:?} is invalid; nothing was changed"),
            errors,
        ));
    }
    super::body::check_document_name(&desired.metadata.name, name)?;
    let unresolved = crate::domain::user_secrets::unresolved_refs(&app.store, &desired.spec)?;
    if !unresolved.is_empty() {
        return Err(ApiError::invalid(
            format!(
                "Cluster {name:?} reads Secrets that cannot give what it asks; nothing was changed"
            ),
            unresolved,
        ));
    }
    let secrets = crate::domain::user_secrets::referenced(&app.store, &desired.spec)?;
    let oversized = crate::domain::bootstrap::oversized_pools(&desired.spec, &secrets);
    if !oversized.is_empty() {
        return Err(ApiError::invalid(
            format!(
                "Cluster {name:?} would give machines config bundles over the cap of {} MiB; nothing was changed",
                drover_common::api::MAX_BUNDLE_BYTES / (1024 * 1024)
            ),
            oversized
                .iter()
                .map(|o| FieldError {
                    field: o.field.clone(),
                    message: o.to_string(),
                })
                .collect(),
        ));
    }
    Ok(())
}

/// The rules an update keeps that a create has none of.
fn check_update(name: &str, current: &Cluster, desired: &Cluster) -> Result<(), ApiError> {
    if current.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::conflict(format!(
            "cluster {name} is being deleted; wait until it is gone to create it again"
        )));
    }
    let invalid = |field: &str, message: String| {
        ApiError::invalid(
            format!("Cluster {name:?} is invalid; nothing was changed"),
            vec![FieldError {
                field: field.into(),
                message,
            }],
        )
    };
    if let Some((field, message)) = current
        .spec
        .provider
        .immutable_change(&desired.spec.provider)
    {
        return Err(invalid(field, message.into()));
    }
    if let Some(problem) = version_change_problem(current, desired) {
        return Err(invalid("spec.kubernetesVersion", problem));
    }
    Ok(())
}

/// Writes the cluster `decide` makes of the stored one (`None`: there is
/// none), as `w` says. Blocking: it reads and writes the store.
pub fn write_cluster(
    app: &App,
    w: &Write<'_>,
    decide: impl FnOnce(Option<&Cluster>) -> Result<Decided, ApiError>,
) -> Result<(Outcome, AuditChanges, Cluster), ApiError> {
    let name = w.name;
    let existing = app.cluster(name)?;
    match (&existing, w.creation) {
        (None, Creation::Refused) => return Err(ApiError::not_found("cluster", name)),
        (Some(_), Creation::Only) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("cluster {name} already exists; update it, or delete it first"),
            ))
        }
        _ => {}
    }
    let Decided {
        cluster: mut desired,
        said,
    } = decide(existing.as_ref())?;
    kept_replicas(name, &mut desired, existing.as_ref(), &said)?;
    check(app, name, &desired)?;
    if !said.cni {
        desired.spec.network.cni = defaulted_cni(&desired.spec, existing.as_ref().map(|c| &c.spec));
    }
    let now = drover_common::now();
    if let Some(manager) = w.manager {
        let before = existing.as_ref();
        desired.metadata.managed_fields = managed_fields::update(
            &owned(before),
            &owned(Some(&desired)),
            before.map_or(&[][..], |c| &c.metadata.managed_fields),
            manager,
            drover_common::API_VERSION,
            now,
        );
    }
    let Some(existing) = existing else {
        desired.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
        desired.metadata.generation = 1;
        desired.metadata.creation_timestamp = Some(now);
        desired.metadata.deletion_timestamp = None;
        desired.metadata.resource_version = None;
        desired.status = ClusterStatus::default();
        let changes = audited(name, w.admin, None, &desired.spec, w.dry_run);
        if w.dry_run {
            return Ok((Outcome::Created, changes, desired));
        }
        app.store.create_json(Kind::Cluster, name, &desired)?;
        tracing::info!(cluster = %name, by = %w.admin.token_id, "cluster created");
        app.reconcile_cluster(name);
        let created = app
            .cluster(name)?
            .ok_or_else(|| ApiError::not_found("cluster", name))?;
        return Ok((Outcome::Created, changes, created));
    };
    check_update(name, &existing, &desired)?;
    let mut before = None;
    let mut would_be = None;
    let current = app
        .update_cluster(name, |current| {
            if more_than_status_differs(current, &existing) {
                return Err(ApiError::conflict(format!(
                    "cluster {name} was changed by another write while this one was checked; nothing was changed, send it again"
                )));
            }
            let spec_changed = current.spec != desired.spec;
            let changed = spec_changed
                || current.metadata.labels != desired.metadata.labels
                || current.metadata.annotations != desired.metadata.annotations
                || current.metadata.managed_fields != desired.metadata.managed_fields;
            if !changed {
                return Ok(false);
            }
            before = Some(current.spec.clone());
            let mut next = current.clone();
            if spec_changed {
                next.metadata.generation += 1;
            }
            next.spec = desired.spec.clone();
            next.metadata.labels = desired.metadata.labels.clone();
            next.metadata.annotations = desired.metadata.annotations.clone();
            next.metadata.managed_fields = desired.metadata.managed_fields.clone();
            if w.dry_run {
                would_be = Some(next);
                return Ok(false);
            }
            *current = next;
            Ok(true)
        })?
        .ok_or_else(|| ApiError::not_found("cluster", name))?;
    let Some(before) = before else {
        return Ok((Outcome::Unchanged, AuditChanges::default(), current));
    };
    if let Some(would_be) = would_be {
        let changes = audited(name, w.admin, Some(&before), &would_be.spec, true);
        return Ok((Outcome::Updated, changes, would_be));
    }
    let changes = audited(name, w.admin, Some(&before), &current.spec, false);
    tracing::info!(cluster = %name, generation = current.metadata.generation, by = %w.admin.token_id, "cluster updated");
    app.reconcile_cluster(name);
    let updated = app
        .cluster(name)?
        .ok_or_else(|| ApiError::not_found("cluster", name))?;
    Ok((Outcome::Updated, changes, updated))
}

/// Marks the cluster `name` for deletion, once `check` accepts it (the
/// reconciler then releases its machines and removes it); for a dry run,
/// the cluster as it would be marked. Marking twice changes nothing.
/// Blocking: it reads and writes the store.
pub fn request_deletion(
    app: &App,
    name: &str,
    admin: &Admin,
    dry_run: bool,
    check: impl Fn(&Cluster) -> Result<(), ApiError>,
) -> Result<Cluster, ApiError> {
    if dry_run {
        let mut c = app
            .cluster(name)?
            .ok_or_else(|| ApiError::not_found("cluster", name))?;
        check(&c)?;
        c.metadata
            .deletion_timestamp
            .get_or_insert_with(drover_common::now);
        return Ok(c);
    }
    // The reconciler may write the cluster's status meanwhile: a conflict
    // re-reads it rather than failing the operator's request.
    let mut requested = false;
    let c = app
        .update_cluster(name, |c| {
            check(c)?;
            requested = c.metadata.deletion_timestamp.is_none();
            if requested {
                c.metadata.deletion_timestamp = Some(drover_common::now());
            }
            Ok::<_, ApiError>(requested)
        })?
        .ok_or_else(|| ApiError::not_found("cluster", name))?;
    if requested {
        tracing::info!(cluster = %name, by = %admin.token_id, "cluster deletion requested");
    }
    app.reconcile_cluster(name);
    Ok(app.cluster(name)?.unwrap_or(c))
}

/// `spec.network.cni` of a document that leaves it out. An existing
/// cluster keeps what it has (so clusters stored before this default keep
/// `none`). A new docker cluster gets the node image's network, as kind
/// installs kindnet unless told `disableDefaultCNI`, unless its spec
/// brings its own: a file in `/etc/cni/net.d` or an addon named `cni`.
/// Pool and aws clusters get `none`: their machines' networks differ too
/// much for one default.
fn defaulted_cni(
    spec: &drover_common::api::ClusterSpec,
    existing: Option<&drover_common::api::ClusterSpec>,
) -> drover_common::api::CniMode {
    use drover_common::api::{CniMode, ProviderSpec, IMAGE_CNI_ADDON};
    if let Some(existing) = existing {
        return existing.network.cni;
    }
    let own_network = spec
        .files
        .iter()
        .chain(&spec.control_plane.files)
        .chain(spec.worker_pools.iter().flat_map(|p| &p.files))
        .any(|f| f.path.starts_with("/etc/cni/net.d/"))
        || spec.addons.iter().any(|a| a.name == IMAGE_CNI_ADDON);
    match spec.provider {
        ProviderSpec::Docker(_) if !own_network => CniMode::Image,
        _ => CniMode::None,
    }
}

/// The changes of a write to what lands on machines, for the audit log;
/// logged unless it is a dry run.
fn audited(
    name: &str,
    admin: &Admin,
    before: Option<&drover_common::api::ClusterSpec>,
    after: &drover_common::api::ClusterSpec,
    dry_run: bool,
) -> AuditChanges {
    let changes = crate::domain::customise::changes(before, after);
    if !dry_run {
        for change in &changes {
            tracing::info!(cluster = %name, by = %admin.token_id, %change, "machine files or commands changed");
        }
    }
    AuditChanges(changes)
}

/// Why `desired` may not change `current`'s Kubernetes version, if it may
/// not: the version moves up one minor release at a time, and for a pool
/// cluster, whose machines upgrade in place, from the oldest version its
/// kubelets run (kubeadm upgrades one minor release at a time, from the
/// version that runs).
fn version_change_problem(current: &Cluster, desired: &Cluster) -> Option<String> {
    let (from, to) = (
        &current.spec.kubernetes_version,
        &desired.spec.kubernetes_version,
    );
    if from == to {
        return None;
    }
    if let Err(why) = drover_common::api::check_version_change(from, to) {
        return Some(why.to_string());
    }
    // Provider clusters roll: new machines replace the old ones, made for
    // the newest version. Pool machines upgrade where they stand.
    if current.spec.provider.creates_machines() {
        return None;
    }
    let oldest = current
        .status
        .nodes
        .iter()
        .filter_map(|n| {
            let v = drover_common::api::KubernetesVersion::parse(&n.kubelet_version).ok()?;
            Some((v, n.kubelet_version.as_str()))
        })
        .min_by_key(|(v, _)| *v)
        .map(|(_, text)| text)
        .filter(|oldest| oldest != from);
    let oldest = oldest?;
    let why = drover_common::api::check_version_change(oldest, to).err()?;
    Some(format!(
        "cannot change pool cluster {name} to {to}: a machine still runs {oldest} (the in-place upgrade to {from} is not done; see `drover rollout status {name}`), and {why}",
        name = current.metadata.name
    ))
}

#[cfg(test)]
mod cni_default_tests {
    use super::*;
    use drover_common::api::CniMode;

    fn doc(provider: &str, extra: &str) -> String {
        format!(
            "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  kubernetesVersion: v1.31.2\n{extra}  controlPlane:\n    replicas: 1\n  provider:\n{provider}"
        )
    }

    fn spec(text: &str) -> drover_common::api::ClusterSpec {
        serde_saphyr::from_str::<Cluster>(text).unwrap().spec
    }

    const DOCKER: &str = "    docker:\n      image: drover-node:test\n";
    const POOL: &str = "    pool:\n      selector:\n        matchLabels:\n          env: dev\n";

    #[test]
    fn a_new_docker_cluster_gets_the_image_network_unless_it_says_or_brings_one() {
        let plain = doc(DOCKER, "");
        assert!(!Said::of_text(plain.as_bytes()).cni);
        assert_eq!(defaulted_cni(&spec(&plain), None), CniMode::Image);
        // An explicit `none` is the document's own.
        let none = doc(DOCKER, "  network:\n    cni: none\n");
        assert!(Said::of_text(none.as_bytes()).cni);
        assert_eq!(spec(&none).network.cni, CniMode::None);
        // A CNI config of its own, or an addon named cni: none.
        let files = doc(
            DOCKER,
            "  files:\n    - path: /etc/cni/net.d/10-calico.conflist\n      content: \"{}\"\n",
        );
        assert_eq!(defaulted_cni(&spec(&files), None), CniMode::None);
        // Pool clusters: none.
        assert_eq!(defaulted_cni(&spec(&doc(POOL, "")), None), CniMode::None);
        // A stored cluster keeps what it has, image or none.
        let stored = spec(&none);
        assert_eq!(defaulted_cni(&spec(&plain), Some(&stored)), CniMode::None);
        let mut image = stored.clone();
        image.network.cni = CniMode::Image;
        assert_eq!(defaulted_cni(&spec(&plain), Some(&image)), CniMode::Image);
    }
}

#[cfg(test)]
mod replicas_tests {
    use super::*;
    use drover_common::api::AutoscalingSpec;

    fn cluster(pools: &str) -> (Cluster, Said) {
        let text = format!(
            "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  kubernetesVersion: v1.31.2\n  controlPlane:\n    replicas: 1\n  workerPools:\n{pools}  provider:\n    pool:\n      selector:\n        matchLabels:\n          env: dev\n"
        );
        let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        (serde_json::from_value(doc.clone()).unwrap(), Said::of(&doc))
    }

    const SCALED: &str =
        "    - name: scaled\n      autoscaling: {minReplicas: 2, maxReplicas: 6}\n";

    #[test]
    fn an_autoscaled_pool_keeps_its_count_when_a_document_leaves_it_out() {
        // New: it starts at its minimum.
        let (mut new, said) = cluster(SCALED);
        assert!(said.replicas_of.is_empty());
        kept_replicas("c", &mut new, None, &said).unwrap();
        assert_eq!(new.spec.worker_pools[0].replicas, 2);
        // The autoscaler took it to 5: a document without replicas keeps 5.
        let mut current = new.clone();
        current.spec.worker_pools[0].replicas = 5;
        let (mut desired, said) = cluster(SCALED);
        kept_replicas("c", &mut desired, Some(&current), &said).unwrap();
        assert_eq!(desired.spec.worker_pools[0].replicas, 5);
        // A narrower range brings the kept count into it.
        let (mut desired, said) = cluster(&SCALED.replace("maxReplicas: 6", "maxReplicas: 3"));
        kept_replicas("c", &mut desired, Some(&current), &said).unwrap();
        assert_eq!(desired.spec.worker_pools[0].replicas, 3);
        assert_eq!(
            desired.spec.worker_pools[0].autoscaling,
            Some(AutoscalingSpec {
                min_replicas: 2,
                max_replicas: 3
            })
        );
        // A document that says replicas is taken at its word, and
        // validation refuses it outside the range.
        let (mut desired, said) = cluster(&format!("{SCALED}      replicas: 9\n"));
        kept_replicas("c", &mut desired, Some(&current), &said).unwrap();
        assert_eq!(desired.spec.worker_pools[0].replicas, 9);
        let errors = desired.validate().unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.field == "spec.workerPools[0].replicas"
                    && e.message.contains("within autoscaling's 2..6")),
            "{errors:?}"
        );
    }

    #[test]
    fn an_apply_that_leaves_replicas_out_keeps_the_count_another_manager_set() {
        // The merged document has the autoscaler's 5; the applied
        // configuration says none, and narrows the range to 2..3.
        let narrower = SCALED.replace("maxReplicas: 6", "maxReplicas: 3");
        let (mut desired, merged) = cluster(&format!("{narrower}      replicas: 5\n"));
        let (_, config) = cluster(&narrower);
        let config_doc = serde_json::json!({"spec": {"workerPools": [{"name": "scaled"}]}});
        let said = Said::of_apply(&serde_json::to_value(&desired).unwrap(), &config_doc);
        assert!(said.replicas_of.is_empty() && said.has_replicas.contains("scaled"));
        assert_eq!(said.replicas_of, config.replicas_of);
        assert_eq!(said.has_replicas, merged.has_replicas);
        let mut current = desired.clone();
        current.spec.worker_pools[0].replicas = 5;
        kept_replicas("c", &mut desired, Some(&current), &said).unwrap();
        assert_eq!(desired.spec.worker_pools[0].replicas, 3);
        // A pool that is not autoscaled keeps the count another manager set.
        let (mut plain, merged) = cluster("    - name: plain\n      replicas: 4\n");
        let said = Said {
            replicas_of: Default::default(),
            ..merged
        };
        kept_replicas("c", &mut plain, None, &said).unwrap();
        assert_eq!(plain.spec.worker_pools[0].replicas, 4);
    }

    #[test]
    fn a_pool_that_is_not_autoscaled_must_say_its_replicas() {
        let (mut desired, said) = cluster("    - name: plain\n");
        let e = kept_replicas("c", &mut desired, None, &said).unwrap_err();
        assert_eq!(e.errors[0].field, "spec.workerPools[0].replicas");
        assert!(e.errors[0]
            .message
            .contains("unless the pool is autoscaled"));
    }
}
