//! Restore drills (`drover restore cluster NAME --into NEW`, or
//! `spec.backup.drill`): one of a cluster's snapshots restored into a new,
//! separate cluster, which the planner inventories and then deletes
//! (`drover_planner`'s `drill.rs`), recording the outcome on the cluster
//! drilled (`status.lastDrill`).
//!
//! Invariants:
//! - A drill changes nothing of the cluster drilled but its status: the
//!   drill cluster has its own name, UID, machines and endpoint; it gets a
//!   copy of the drilled cluster's CAs and keys (what the restored data was
//!   signed with), under its own UID.
//! - Every check a restore makes of the snapshot (its cluster's UID, its
//!   sealed file whole and opening with the key) passes before anything is
//!   written, and the drill cluster, its PKI and the drilled cluster's
//!   `status.drill` are written in one transaction.
//! - One drill of a cluster at a time; the snapshot it restores stays
//!   (retention keeps it) until it ends.

use drover_common::api::{
    set_condition, Cluster, ClusterRestore, ClusterStatus, ControlPlaneEndpoint, DrillDone,
    DrillOf, DrillTrigger, DrillUnderWay, Machine, ObjectMeta, RestoreRequest, RestoreSource,
    DRILL_CONDITION, DRILL_OF_LABEL,
};
use drover_common::wire::InventoryReport;

use crate::app::App;
use crate::cluster_restore::{find, verify_file, RestoreError};
use crate::domain::secrets::{cluster_pki_name, load_pki, ClusterPki};
use crate::store::{encode, Kind, Op, StoreError};

/// The spec of the drill cluster of `source`: the same version, provider,
/// machines and files, with one control plane, no workers, no addons (the
/// restored data holds what they made), no backups, and an endpoint of its
/// own (a managed one if the source's is, else the provider's or its
/// control plane's address).
fn drill_spec(source: &Cluster) -> drover_common::api::ClusterSpec {
    let mut spec = source.spec.clone();
    spec.control_plane.replicas = 1;
    spec.worker_pools.clear();
    spec.addons.clear();
    spec.backup = None;
    spec.control_plane_endpoint = match spec.control_plane_endpoint {
        Some(e @ ControlPlaneEndpoint::Managed { .. }) => Some(e),
        _ => None,
    };
    spec
}

/// Starts a drill of cluster `name` as `req` asks (`req.into` names the
/// drill cluster); the drilled cluster as recorded, with `status.drill`.
/// Asking again for the drill under way answers it.
pub fn start(
    app: &App,
    name: &str,
    req: &RestoreRequest,
    by: &str,
    trigger: DrillTrigger,
) -> Result<Cluster, RestoreError> {
    let refused = |why: String| Err(RestoreError::Refused(why));
    let Some(into) = req.into.as_deref() else {
        return refused("a drill needs the name of the cluster to restore into".into());
    };
    let source = app.cluster(name)?.ok_or_else(|| RestoreError::NotFound {
        kind: "cluster",
        name: name.to_owned(),
    })?;
    if req.force {
        return refused(format!(
            "--force has no meaning for a drill into {into}: nothing of cluster {name} is replaced"
        ));
    }
    if let Some(d) = &source.status.drill {
        if d.cluster == into {
            return Ok(source);
        }
        return refused(format!(
            "a drill of cluster {name} into {} is under way (since {}); one drill of a cluster runs at a time. Wait for it (`drover describe cluster {name}`)",
            d.cluster, d.started_at
        ));
    }
    if source.metadata.deletion_timestamp.is_some() {
        return refused(format!(
            "cluster {name} is being deleted; it is not drilled"
        ));
    }
    if source.status.drill_of.is_some() {
        return refused(format!(
            "cluster {name} is itself a drill cluster; drill the cluster it restores"
        ));
    }
    if into == name {
        return refused(format!(
            "a drill restores into a new cluster, not into {name} itself; to restore {name}, leave out --into"
        ));
    }
    if app.cluster(into)?.is_some() {
        return refused(format!(
            "cluster {into} exists already; a drill restores into a new cluster: choose another name, or delete {into} first"
        ));
    }
    let uid = source.metadata.uid.clone().unwrap_or_default();
    let snapshot = find(app, &source, req.snapshot.as_deref())?;
    let unusable = |detail: String| RestoreError::Unusable {
        cluster: name.to_owned(),
        snapshot: snapshot.metadata.name.clone(),
        detail,
    };
    if snapshot.spec.cluster_uid != uid {
        return Err(unusable(format!(
            "it was taken of another cluster of the same name (UID {})",
            snapshot.spec.cluster_uid
        )));
    }
    verify_file(app, &source, &snapshot).map_err(|e| unusable(e.to_string()))?;
    let pki = load_pki(&app.store, &source)?.ok_or_else(|| {
        RestoreError::Refused(format!(
            "cluster {name} has no CAs yet (it never came up); there is nothing to drill"
        ))
    })?;

    let now = drover_common::now();
    let drill_uid = uuid::Uuid::new_v4().to_string();
    let mut labels = source.metadata.labels.clone();
    labels.insert(DRILL_OF_LABEL.into(), name.to_owned());
    let drill = Cluster {
        api_version: source.api_version.clone(),
        kind: source.kind.clone(),
        metadata: ObjectMeta {
            name: into.to_owned(),
            uid: Some(drill_uid.clone()),
            generation: 1,
            creation_timestamp: Some(now),
            labels,
            ..Default::default()
        },
        spec: drill_spec(&source),
        status: ClusterStatus {
            restore: Some(ClusterRestore {
                snapshot: snapshot.metadata.name.clone(),
                revision: snapshot.status.revision,
                requested_at: now,
                requested_by: by.to_owned(),
                forced: false,
                replaced: vec![],
                machine: None,
                source: Some(RestoreSource {
                    cluster: name.to_owned(),
                    uid: uid.clone(),
                }),
            }),
            drill_of: Some(DrillOf {
                source: RestoreSource {
                    cluster: name.to_owned(),
                    uid: uid.clone(),
                },
                snapshot: snapshot.metadata.name.clone(),
                revision: snapshot.status.revision,
                trigger,
                started_at: now,
                inventory: None,
                failed: None,
            }),
            ..Default::default()
        },
    };
    if let Err(errors) = drill.validate() {
        let why: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        return refused(format!(
            "the drill cluster {into} would be invalid ({}); nothing was changed",
            why.join("; ")
        ));
    }
    let pki = ClusterPki {
        cluster_uid: drill_uid,
        ..pki
    };
    let pki_name = cluster_pki_name(into);
    let pki_op = match app.store.get_json::<ClusterPki>(Kind::Secret, &pki_name)? {
        // A leftover of a deleted namesake.
        Some((_, rev)) => Op::Update {
            kind: Kind::Secret,
            name: pki_name,
            body: encode(&pki),
            expected_revision: Some(rev),
        },
        None => Op::Create {
            kind: Kind::Secret,
            name: pki_name,
            body: encode(&pki),
        },
    };
    let mut drilled = source.clone();
    let rev = drilled
        .metadata
        .resource_version
        .take()
        .and_then(|r| r.parse().ok());
    drilled.status.drill = Some(DrillUnderWay {
        cluster: into.to_owned(),
        snapshot: snapshot.metadata.name.clone(),
        trigger,
        started_at: now,
    });
    app.store.txn(vec![
        Op::Create {
            kind: Kind::Cluster,
            name: into.to_owned(),
            body: encode(&drill),
        },
        pki_op,
        Op::Update {
            kind: Kind::Cluster,
            name: name.to_owned(),
            body: encode(&drilled),
            expected_revision: rev,
        },
    ])?;
    tracing::info!(cluster = %name, drill = %into, snapshot = %snapshot.metadata.name, %trigger, %by, "restore drill started");
    app.reconcile_cluster(into);
    Ok(app.cluster(name)?.unwrap_or(drilled))
}

/// Ends drill cluster `drill`'s drill with `done`: recorded on the cluster
/// drilled (when it is still the one drilled, and the drill it records is
/// this one), and the drill cluster's deletion asked.
pub fn finish(app: &App, drill: &Cluster, done: &DrillDone) -> Result<(), StoreError> {
    let Some(of) = &drill.status.drill_of else {
        return Ok(());
    };
    record_on_source(app, of, done)?;
    let uid = drill.metadata.uid.clone();
    app.update_cluster::<StoreError>(&drill.metadata.name, |c| {
        if c.metadata.uid != uid || c.metadata.deletion_timestamp.is_some() {
            return Ok(false);
        }
        c.metadata.deletion_timestamp = Some(drover_common::now());
        Ok(true)
    })?;
    if done.ok {
        tracing::info!(cluster = %of.source.cluster, drill = %done.cluster, snapshot = %done.snapshot, message = %done.message, "restore drill passed; deleting the drill cluster");
    } else {
        tracing::warn!(cluster = %of.source.cluster, drill = %done.cluster, snapshot = %done.snapshot, message = %done.message, "restore drill failed; deleting the drill cluster");
    }
    Ok(())
}

/// Records `done` on the cluster `of` names, if it is still that one and
/// its drill under way is this one (or none is).
fn record_on_source(app: &App, of: &DrillOf, done: &DrillDone) -> Result<(), StoreError> {
    app.update_cluster::<StoreError>(&of.source.cluster, |c| {
        if c.metadata.uid.as_deref() != Some(of.source.uid.as_str()) {
            return Ok(false);
        }
        let ours = |d: &DrillUnderWay| d.cluster == done.cluster && d.started_at == done.started_at;
        if c.status.drill.as_ref().is_some_and(|d| !ours(d)) {
            return Ok(false);
        }
        if c.status.last_drill.as_ref() == Some(done) {
            return Ok(false);
        }
        c.status.drill = None;
        c.status.last_drill = Some(done.clone());
        set_condition(
            &mut c.status.conditions,
            DRILL_CONDITION,
            done.ok,
            if done.ok {
                "DrillPassed"
            } else {
                "DrillFailed"
            },
            &done.message,
        );
        Ok(true)
    })?;
    Ok(())
}

/// A scheduled drill of `cluster` could not start: recorded as its last
/// drill (failed), so that the schedule waits for its next turn.
pub fn record_not_started(
    app: &App,
    cluster: &Cluster,
    done: &DrillDone,
) -> Result<(), StoreError> {
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let of = DrillOf {
        source: RestoreSource {
            cluster: cluster.metadata.name.clone(),
            uid,
        },
        snapshot: done.snapshot.clone(),
        revision: done.revision,
        trigger: done.trigger,
        started_at: done.started_at,
        inventory: None,
        failed: Some(done.message.clone()),
    };
    record_on_source(app, &of, done)
}

/// Drill cluster `drill` is gone: if its drill had not ended (it was
/// deleted by hand), the cluster drilled records it as failed, so that
/// its next drill may start.
pub fn forget(app: &App, drill: &Cluster) -> Result<(), StoreError> {
    let Some(of) = &drill.status.drill_of else {
        return Ok(());
    };
    let Some(source) = app.cluster(&of.source.cluster)? else {
        return Ok(());
    };
    let under_way = source
        .status
        .drill
        .as_ref()
        .is_some_and(|d| d.cluster == drill.metadata.name && d.started_at == of.started_at);
    if !under_way {
        return Ok(());
    }
    let done = DrillDone {
        cluster: drill.metadata.name.clone(),
        snapshot: of.snapshot.clone(),
        revision: of.revision,
        trigger: of.trigger,
        started_at: of.started_at,
        completed_at: drover_common::now(),
        ok: false,
        message: format!(
            "drill cluster {} was deleted before the drill ended",
            drill.metadata.name
        ),
        inventory: None,
    };
    record_on_source(app, of, &done)
}

/// Why an inventory report was refused.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("machine {machine} was not asked for inventory {id}: {detail}")]
    NotAsked {
        machine: String,
        id: String,
        detail: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Records the inventory `report` of `machine`, which its drill cluster
/// asked of it; the drill cluster's name.
pub fn record_inventory(
    app: &App,
    machine: &Machine,
    report: &InventoryReport,
) -> Result<String, InventoryError> {
    let not_asked = |detail: &str| InventoryError::NotAsked {
        machine: machine.metadata.name.clone(),
        id: report.id.clone(),
        detail: detail.to_owned(),
    };
    let a = machine
        .spec
        .assignment
        .as_ref()
        .ok_or_else(|| not_asked("it is in no cluster"))?;
    let mut asked = false;
    app.update_cluster::<InventoryError>(&a.cluster, |c| {
        asked = false;
        if c.metadata.uid.as_deref() != Some(a.cluster_uid.as_str()) {
            return Ok(false);
        }
        let Some(ask) = c
            .status
            .drill_of
            .as_mut()
            .and_then(|d| d.inventory.as_mut())
            .filter(|i| i.via == machine.metadata.name && i.directive_id() == report.id)
        else {
            return Ok(false);
        };
        asked = true;
        if ask.result.as_ref() == Some(&report.inventory) {
            return Ok(false);
        }
        ask.result = Some(report.inventory.clone());
        ask.error = None;
        Ok(true)
    })?;
    if !asked {
        return Err(not_asked(
            "its cluster is no drill asking it for one (the drill ended, or another machine was asked)",
        ));
    }
    app.reconcile_cluster(&a.cluster);
    Ok(a.cluster.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{InventoryAsk, MachineRole};
    use drover_planner::fixtures::running;

    use crate::cluster_restore::tests::{with_snapshot, SNAP};
    use crate::cluster_restore::{file_for, RestoreError};
    use crate::domain::etcd_restore::for_init_machine;

    fn drill_of(snapshot: Option<&str>, into: &str) -> RestoreRequest {
        RestoreRequest {
            snapshot: snapshot.map(str::to_owned),
            force: false,
            into: Some(into.to_owned()),
        }
    }

    /// A drill is checked like a restore, then made in one write: a new
    /// cluster restoring the source's snapshot with a copy of its CAs, and
    /// the source's `status.drill`; its init machine is handed the
    /// source's snapshot and key; its inventory is recorded only from the
    /// machine asked; its end is recorded on the source and deletes it.
    #[tokio::test]
    async fn a_drill_restores_the_sources_snapshot_into_a_new_cluster_and_reports_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let app = App::for_tests(dir.path());
        let source = with_snapshot(&app, "v1.31.2");
        let drill = |snapshot: Option<&str>, into: &str| {
            start(
                &app,
                "c",
                &drill_of(snapshot, into),
                "admin",
                DrillTrigger::Manual,
            )
        };
        let refused = |e: RestoreError| match e {
            RestoreError::Refused(why) => why,
            e => panic!("not a refusal: {e}"),
        };
        // No CAs yet: nothing to drill.
        let why = refused(drill(None, "d").unwrap_err());
        assert!(why.contains("no CAs yet"), "{why}");
        let pki = ClusterPki::generate("cu").unwrap();
        app.store
            .create_json(Kind::Secret, &cluster_pki_name("c"), &pki)
            .unwrap();
        // Not into itself, nor an existing cluster, nor with --force.
        let why = refused(drill(None, "c").unwrap_err());
        assert!(why.contains("leave out --into"), "{why}");
        let forced = RestoreRequest {
            force: true,
            ..drill_of(None, "d")
        };
        let why = refused(start(&app, "c", &forced, "admin", DrillTrigger::Manual).unwrap_err());
        assert!(why.contains("no meaning"), "{why}");
        assert!(app.cluster("d").unwrap().is_none());

        let drilled = drill(Some(SNAP), "d").unwrap();
        let under_way = drilled.status.drill.clone().unwrap();
        assert_eq!(
            (under_way.cluster.as_str(), under_way.snapshot.as_str()),
            ("d", SNAP)
        );
        assert_eq!(drilled.spec, source.spec, "a drill changes only the status");
        let d = app.cluster("d").unwrap().unwrap();
        let duid = d.metadata.uid.clone().unwrap();
        assert_ne!(duid, "cu");
        assert_eq!(d.metadata.labels[DRILL_OF_LABEL], "c");
        assert_eq!(d.spec.control_plane.replicas, 1);
        assert!(d.spec.worker_pools.is_empty() && d.spec.backup.is_none());
        let r = d.status.restore.clone().unwrap();
        assert_eq!(r.snapshot_uid(&duid), "cu");
        assert!(!d.status.initialized);
        let copied = load_pki(&app.store, &d).unwrap().expect("the PKI copied");
        assert_eq!(copied.cluster_uid, duid);
        assert_eq!(copied.ca.cert_pem, pki.ca.cert_pem);
        // Asked again: the same drill; another: refused.
        drill(Some(SNAP), "d").unwrap();
        let why = refused(drill(None, "e").unwrap_err());
        assert!(why.contains("under way"), "{why}");

        // Its init machine restores the source's snapshot with its key.
        let mut n = running("n", "control-plane", MachineRole::Init);
        let a = n.spec.assignment.as_mut().unwrap();
        a.cluster = "d".into();
        a.cluster_uid = duid.clone();
        n.status.addresses = vec!["10.0.0.9".into()];
        app.update_cluster::<StoreError>("d", |c| {
            c.status.init_machine = Some("n".into());
            Ok(true)
        })
        .unwrap();
        let d = app.cluster("d").unwrap().unwrap();
        let bundle = for_init_machine(&app.store, &d, &n).unwrap().unwrap();
        assert_eq!(bundle.cluster_uid, "cu");
        assert_eq!(
            bundle.key,
            crate::snapshots::cluster_key(&app, &source)
                .unwrap()
                .to_base64()
        );
        assert_eq!(
            file_for(&app, &n, SNAP).unwrap(),
            crate::snapshots::file_of(&app, "cu", SNAP)
        );

        // The inventory: only from the machine asked, for the ask.
        let now = drover_common::now();
        app.update_cluster::<StoreError>("d", |c| {
            c.status.restore = None;
            c.status.initialized = true;
            c.status.drill_of.as_mut().unwrap().inventory = Some(InventoryAsk {
                via: "n".into(),
                requested_at: now,
                result: None,
                error: None,
            });
            Ok(true)
        })
        .unwrap();
        let d = app.cluster("d").unwrap().unwrap();
        let ask = d
            .status
            .drill_of
            .as_ref()
            .unwrap()
            .inventory
            .clone()
            .unwrap();
        let inventory = drover_common::api::Inventory {
            namespaces: vec!["default".into()],
            objects: [("namespaces".to_string(), 1u64)].into_iter().collect(),
            total: 1,
            revision: 9,
        };
        let report = |id: String| InventoryReport {
            id,
            inventory: inventory.clone(),
        };
        let wrong = record_inventory(&app, &n, &report("inventory-n-1".into())).unwrap_err();
        assert!(wrong.to_string().contains("was not asked"), "{wrong}");
        let mut other = n.clone();
        other.metadata.name = "o".into();
        assert!(record_inventory(&app, &other, &report(ask.directive_id())).is_err());
        assert_eq!(
            record_inventory(&app, &n, &report(ask.directive_id())).unwrap(),
            "d"
        );
        let d = app.cluster("d").unwrap().unwrap();
        let recorded = d
            .status
            .drill_of
            .as_ref()
            .unwrap()
            .inventory
            .as_ref()
            .unwrap();
        assert_eq!(recorded.result.as_ref(), Some(&inventory));

        // Its end: on the source, and the drill cluster goes.
        let done = DrillDone {
            cluster: "d".into(),
            snapshot: SNAP.into(),
            revision: 77,
            trigger: DrillTrigger::Manual,
            started_at: under_way.started_at,
            completed_at: now,
            ok: true,
            message: "restored".into(),
            inventory: Some(inventory),
        };
        finish(&app, &d, &done).unwrap();
        let c = app.cluster("c").unwrap().unwrap();
        assert!(c.status.drill.is_none());
        assert_eq!(c.status.last_drill.as_ref(), Some(&done));
        assert!(c
            .status
            .conditions
            .iter()
            .any(|x| x.type_ == DRILL_CONDITION
                && x.status == "True"
                && x.reason == "DrillPassed"));
        assert!(app
            .cluster("d")
            .unwrap()
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some());

        // A drill cluster deleted by hand before its end fails the drill,
        // so that the next may start.
        app.store.delete(Kind::Cluster, "d", None).unwrap();
        drill(None, "e").unwrap();
        let e = app.cluster("e").unwrap().unwrap();
        forget(&app, &e).unwrap();
        let c = app.cluster("c").unwrap().unwrap();
        assert!(c.status.drill.is_none());
        let last = c.status.last_drill.unwrap();
        assert!(!last.ok && last.message.contains("deleted before the drill ended"));
    }
}
