//! The operations in flight on a cluster's status, behind one trait: which
//! directive each yields, to which machine, and how its result is recorded.
//!
//! Invariant: a result is recorded only when it answers the directive under
//! way (its id, from the machine it was asked of, not yet answered): a
//! result for an operation the planner replaced or retried since changes
//! nothing.

use drover_common::api::{
    AddonApply, AddonSource, CertificateRenewal, Cluster, ClusterStatus, DrainResult, DrillOf,
    EssentialAddonsUpgrade, EtcdRemoval, MachineUpgrade, MachineUpgradeStep, NodeDrain,
    NodeRemoval, SnapshotSave, VersionUpdate, ADDON_APPLY_PREFIX, CERTIFICATE_RENEWAL_PREFIX,
    DRAIN_PREFIX, ESSENTIAL_ADDONS_PREFIX, ETCD_REMOVAL_PREFIX, INVENTORY_PREFIX,
    MACHINE_UPGRADE_PREFIX, NODE_DELETE_PREFIX, SNAPSHOT_PREFIX, UNCORDON_PREFIX,
    VERSION_UPDATE_PREFIX,
};
use drover_common::wire::{Directive, DirectiveAction, DirectiveResult};
use time::OffsetDateTime;

/// An operation the planner keeps on a cluster's status and asks of one
/// machine through a heartbeat directive until that machine reports.
pub trait InFlight: Sized {
    /// The id prefixes of its directives: a result whose id starts with one
    /// is offered to [`InFlight::record`].
    const PREFIXES: &'static [&'static str];

    /// The operation under way on a cluster's status, if any.
    fn under_way(status: &ClusterStatus) -> Option<&Self>;

    /// The directive asking machine `me` of `cluster` to carry it out, while
    /// it waits for `me`.
    fn directive(&self, cluster: &Cluster, me: &str) -> Option<Directive>;

    /// Records `result`, reported by machine `by`, on `status`; what it
    /// tells, for the log and a new look at the cluster. `None` when it is
    /// not worth saying (not the result of the directive under way, or
    /// nothing new). Some operations record nothing: the planner sees their
    /// outcome in what the machines report next.
    fn record(
        _status: &mut ClusterStatus,
        _by: &str,
        _result: &DirectiveResult,
        _now: OffsetDateTime,
    ) -> Option<Reported> {
        None
    }

    /// Whether `result` may be this operation's.
    fn answers(result: &DirectiveResult) -> bool {
        Self::PREFIXES.iter().any(|p| result.id.starts_with(p))
    }
}

/// What a directive result told, once recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// A drain attempt of machine `leaving` (Node `node`) ended.
    Drain {
        leaving: String,
        node: String,
        ok: bool,
        message: String,
    },
    /// A change of the `kubeadm-config` version ended (a failure is kept).
    VersionSet { ok: bool, message: String },
    /// kube-proxy and CoreDNS were upgraded, or why not.
    EssentialAddons { ok: bool, message: String },
    /// A certificate renewal ended (a failure is kept).
    Renewal { ok: bool, message: String },
    /// A step of machine `machine`'s in-place upgrade ended.
    UpgradeStep {
        machine: String,
        step: MachineUpgradeStep,
        ok: bool,
        message: String,
    },
    /// An addon apply ended.
    Addon {
        addon: String,
        ok: bool,
        message: String,
    },
    /// An etcd snapshot failed (one saved is recorded by the machine's
    /// report, before its directive's result).
    SnapshotFailed { snapshot: String, message: String },
    /// A drill cluster's inventory failed (one taken is recorded by the
    /// machine's report, before its directive's result).
    InventoryFailed { message: String },
}

impl Reported {
    /// Whether the cluster is to be looked at again now. A kept failure is
    /// asked again after a while by the planner: the write itself wakes it.
    pub fn wakes(&self) -> bool {
        match self {
            Reported::VersionSet { ok, .. } | Reported::Renewal { ok, .. } => *ok,
            _ => true,
        }
    }
}

/// The directives a cluster's operations ask of machine `me`, in the order
/// a heartbeat answer carries them.
pub fn directives(cluster: &Cluster, me: &str) -> Vec<Directive> {
    fn of<O: InFlight>(cluster: &Cluster, me: &str) -> Option<Directive> {
        O::under_way(&cluster.status)?.directive(cluster, me)
    }
    [
        of::<MachineUpgrade>(cluster, me),
        of::<CertificateRenewal>(cluster, me),
        of::<NodeDrain>(cluster, me),
        of::<NodeRemoval>(cluster, me),
        of::<AddonApply>(cluster, me),
        of::<VersionUpdate>(cluster, me),
        of::<EssentialAddonsUpgrade>(cluster, me),
        of::<EtcdRemoval>(cluster, me),
        of::<SnapshotSave>(cluster, me),
        of::<DrillOf>(cluster, me),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// One operation's [`InFlight::answers`] and [`InFlight::record`].
type Recorder = (
    fn(&DirectiveResult) -> bool,
    fn(&mut ClusterStatus, &str, &DirectiveResult, OffsetDateTime) -> Option<Reported>,
);

/// The operations that record results, in the fixed order
/// [`record_results`] offers them each result.
const RECORDERS: &[Recorder] = &[
    (EtcdRemoval::answers, EtcdRemoval::record),
    (NodeDrain::answers, NodeDrain::record),
    (VersionUpdate::answers, VersionUpdate::record),
    (
        EssentialAddonsUpgrade::answers,
        EssentialAddonsUpgrade::record,
    ),
    (CertificateRenewal::answers, CertificateRenewal::record),
    (MachineUpgrade::answers, MachineUpgrade::record),
    (AddonApply::answers, AddonApply::record),
    (SnapshotSave::answers, SnapshotSave::record),
    (DrillOf::answers, DrillOf::record),
];

/// Records the `results` machine `by` reported on its cluster's `status`,
/// each offered to the operations whose prefix it has, in a fixed order;
/// what they told.
pub fn record_results(
    status: &mut ClusterStatus,
    by: &str,
    results: &[DirectiveResult],
    now: OffsetDateTime,
) -> Vec<Reported> {
    let mut out = vec![];
    for (answers, record) in RECORDERS {
        for r in results.iter().filter(|r| answers(r)) {
            out.extend(record(status, by, r, now));
        }
    }
    out
}

/// Whether `result` is one that [`record_results`] may record.
pub fn is_recorded(result: &DirectiveResult) -> bool {
    RECORDERS.iter().any(|(answers, _)| answers(result))
}

/// Whether `result` ends a cleanup of the cluster (a member removal or a
/// Node deletion), which the planner follows whatever it says.
pub fn is_cleanup(result: &DirectiveResult) -> bool {
    EtcdRemoval::answers(result) || NodeRemoval::answers(result)
}

/// An operation that keeps its failure (when and why) until the planner
/// asks it again.
trait Retried {
    fn directive_id(&self) -> String;
    fn failure(&mut self) -> (&mut Option<OffsetDateTime>, &mut String);
}

macro_rules! retried {
    ($($t:ty),*) => {$(
        impl Retried for $t {
            fn directive_id(&self) -> String {
                <$t>::directive_id(self)
            }
            fn failure(&mut self) -> (&mut Option<OffsetDateTime>, &mut String) {
                (&mut self.failed_at, &mut self.error)
            }
        }
    )*};
}
retried!(EtcdRemoval, CertificateRenewal, SnapshotSave);

/// Records a failed `result` on `op` when it answers it (its directive)
/// and `op` has not failed yet; `op` when it did.
fn keep_failure<'a, O: Retried>(
    op: Option<&'a mut O>,
    result: &DirectiveResult,
    now: OffsetDateTime,
) -> Option<&'a mut O> {
    let op = op.filter(|o| !result.ok && o.directive_id() == result.id)?;
    let (failed_at, error) = op.failure();
    if failed_at.is_some() {
        return None;
    }
    *failed_at = Some(now);
    error.clone_from(&result.message);
    Some(op)
}

/// A result's outcome as the status keeps it.
fn outcome(result: &DirectiveResult) -> DrainResult {
    DrainResult {
        ok: result.ok,
        message: result.message.clone(),
    }
}

impl InFlight for MachineUpgrade {
    const PREFIXES: &'static [&'static str] = &[MACHINE_UPGRADE_PREFIX, UNCORDON_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.machine_upgrade.as_ref()
    }

    /// Only the uncordon, asked of a control plane: the upgrade itself is
    /// asked of the machine through its own record (`status.upgrade`).
    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.step == MachineUpgradeStep::Uncordon && self.via == me && self.result.is_none()).then(
            || Directive {
                id: self.directive_id(),
                action: DirectiveAction::UncordonNode {
                    node: self.node.clone(),
                },
            },
        )
    }

    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        _: OffsetDateTime,
    ) -> Option<Reported> {
        let u = status.machine_upgrade.as_mut()?;
        let asked = match u.step {
            MachineUpgradeStep::Upgrade => u.machine == by,
            MachineUpgradeStep::Uncordon => u.via == by,
            MachineUpgradeStep::Drain | MachineUpgradeStep::Settle => false,
        };
        if !asked || u.directive_id() != result.id || u.result.is_some() {
            return None;
        }
        u.result = Some(outcome(result));
        Some(Reported::UpgradeStep {
            machine: u.machine.clone(),
            step: u.step,
            ok: result.ok,
            message: result.message.clone(),
        })
    }
}

impl InFlight for SnapshotSave {
    const PREFIXES: &'static [&'static str] = &[SNAPSHOT_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.snapshot.as_ref().filter(|s| s.under_way())
    }

    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.via == me && self.under_way()).then(|| Directive {
            id: self.directive_id(),
            action: DirectiveAction::SaveEtcdSnapshot {
                snapshot: self.name.clone(),
            },
        })
    }

    /// Only a failure: a snapshot saved was recorded by the machine's
    /// report (`POST /v1/machine/snapshots/{name}`), which comes first.
    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        now: OffsetDateTime,
    ) -> Option<Reported> {
        let s = keep_failure(
            status.snapshot.as_mut().filter(|s| s.via == by),
            result,
            now,
        )?;
        Some(Reported::SnapshotFailed {
            snapshot: s.name.clone(),
            message: result.message.clone(),
        })
    }
}

impl InFlight for DrillOf {
    const PREFIXES: &'static [&'static str] = &[INVENTORY_PREFIX];

    /// The inventory a drill cluster asked, until reported.
    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status
            .drill_of
            .as_ref()
            .filter(|d| d.inventory.as_ref().is_some_and(|i| i.under_way()))
    }

    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        let ask = self.inventory.as_ref().filter(|i| i.via == me)?;
        Some(Directive {
            id: ask.directive_id(),
            action: DirectiveAction::TakeInventory {
                snapshot: self.snapshot.clone(),
            },
        })
    }

    /// Only a failure, or a success whose inventory never arrived: one
    /// taken was recorded by the machine's report (`POST
    /// /v1/machine/inventory`), which comes first.
    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        _: OffsetDateTime,
    ) -> Option<Reported> {
        let ask = status
            .drill_of
            .as_mut()?
            .inventory
            .as_mut()
            .filter(|i| i.via == by && i.directive_id() == result.id && i.under_way())?;
        let message = if result.ok {
            format!(
                "{by} reported the inventory taken ({}), but it never reached the coordinator",
                result.message
            )
        } else {
            result.message.clone()
        };
        ask.error = Some(message.clone());
        Some(Reported::InventoryFailed { message })
    }
}

impl InFlight for CertificateRenewal {
    const PREFIXES: &'static [&'static str] = &[CERTIFICATE_RENEWAL_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.certificate_renewal.as_ref()
    }

    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.machine == me && self.failed_at.is_none()).then(|| Directive {
            id: self.directive_id(),
            action: DirectiveAction::RenewCertificates {
                reason: self.reason.clone(),
            },
        })
    }

    /// A success is only said (the machine's next report shows the new
    /// expiry); a failure is kept, so the planner asks again a while later.
    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        now: OffsetDateTime,
    ) -> Option<Reported> {
        let asked = status.certificate_renewal.as_mut();
        keep_failure(asked.filter(|r| r.machine == by), result, now);
        Some(Reported::Renewal {
            ok: result.ok,
            message: result.message.clone(),
        })
    }
}

impl InFlight for NodeDrain {
    const PREFIXES: &'static [&'static str] = &[DRAIN_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.drain.as_ref()
    }

    fn directive(&self, cluster: &Cluster, me: &str) -> Option<Directive> {
        if self.via != me || self.result.is_some() {
            return None;
        }
        let policy = cluster.spec.drain.as_ref();
        Some(Directive {
            id: self.directive_id(),
            action: DirectiveAction::DrainNode {
                node: self.node.clone(),
                delete_pods_without_controller: policy
                    .is_some_and(|p| p.delete_pods_without_controller),
                delete_empty_dir_data: policy.is_some_and(|p| p.delete_empty_dir_data),
            },
        })
    }

    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        _: OffsetDateTime,
    ) -> Option<Reported> {
        let d = status
            .drain
            .as_mut()
            .filter(|d| d.via == by && d.directive_id() == result.id && d.result.is_none())?;
        d.result = Some(outcome(result));
        Some(Reported::Drain {
            leaving: d.machine.clone(),
            node: d.node.clone(),
            ok: result.ok,
            message: result.message.clone(),
        })
    }
}

/// Its result records nothing: the planner follows the Nodes the control
/// planes report.
impl InFlight for NodeRemoval {
    const PREFIXES: &'static [&'static str] = &[NODE_DELETE_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.node_removal.as_ref()
    }

    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.via == me).then(|| Directive {
            id: self.directive_id(),
            action: DirectiveAction::DeleteNode {
                node: self.node.clone(),
            },
        })
    }
}

impl InFlight for AddonApply {
    const PREFIXES: &'static [&'static str] = &[ADDON_APPLY_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.addon_apply.as_ref()
    }

    /// Only with the manifests the request was made for.
    fn directive(&self, cluster: &Cluster, me: &str) -> Option<Directive> {
        if self.via != me {
            return None;
        }
        let addons = cluster.spec.effective_addons();
        let addon = addons
            .iter()
            .find(|x| x.name == self.addon && x.hash() == self.hash)?;
        let action = match addon.source {
            AddonSource::Spec(manifests) => DirectiveAction::ApplyManifests {
                addon: self.addon.clone(),
                manifests: manifests.to_owned(),
            },
            AddonSource::Image => DirectiveAction::ApplyImageManifests {
                addon: self.addon.clone(),
            },
        };
        Some(Directive {
            id: self.directive_id(),
            action,
        })
    }

    /// Ends the apply and keeps its outcome on the addon's status; the
    /// planner asks for the next addon, or again after a back-off.
    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        now: OffsetDateTime,
    ) -> Option<Reported> {
        let r = status
            .addon_apply
            .clone()
            .filter(|r| r.via == by && r.directive_id() == result.id)?;
        status.addon_apply = None;
        let st = status.addons.iter_mut().find(|x| x.name == r.addon)?;
        st.record_attempt(r.hash, result.ok, &result.message, now);
        Some(Reported::Addon {
            addon: r.addon,
            ok: result.ok,
            message: result.message.clone(),
        })
    }
}

impl InFlight for VersionUpdate {
    const PREFIXES: &'static [&'static str] = &[VERSION_UPDATE_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.version_update.as_ref()
    }

    /// Asked until the version is reported set: a failed attempt is asked
    /// again by the planner as a new request.
    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.via == me).then(|| Directive {
            id: self.directive_id(),
            action: DirectiveAction::SetKubernetesVersion {
                version: self.version.clone(),
            },
        })
    }

    /// A success is only said (the next report shows the version); a
    /// failure is kept, so the planner asks again a while later.
    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        _: OffsetDateTime,
    ) -> Option<Reported> {
        if !result.ok {
            match status.version_update.as_mut() {
                Some(u)
                    if u.via == by
                        && u.directive_id() == result.id
                        && u.error != result.message =>
                {
                    u.error.clone_from(&result.message);
                }
                _ => {}
            }
        }
        Some(Reported::VersionSet {
            ok: result.ok,
            message: result.message.clone(),
        })
    }
}

impl InFlight for EssentialAddonsUpgrade {
    const PREFIXES: &'static [&'static str] = &[ESSENTIAL_ADDONS_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.essential_addons.as_ref()
    }

    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.via == me && !self.is_done()).then(|| Directive {
            id: self.directive_id(),
            action: DirectiveAction::UpgradeEssentialAddons {
                version: self.version.clone(),
            },
        })
    }

    /// Done (the rollout may finish), or why it failed (the planner asks
    /// again a while later); the same failure twice is said once.
    fn record(
        status: &mut ClusterStatus,
        by: &str,
        result: &DirectiveResult,
        now: OffsetDateTime,
    ) -> Option<Reported> {
        let u = status
            .essential_addons
            .as_mut()
            .filter(|u| u.via == by && u.directive_id() == result.id && !u.is_done())?;
        if result.ok {
            u.done_at = Some(now);
            u.message.clone_from(&result.message);
            u.error.clear();
        } else if u.error == result.message {
            return None;
        } else {
            u.error.clone_from(&result.message);
        }
        Some(Reported::EssentialAddons {
            ok: result.ok,
            message: result.message.clone(),
        })
    }
}

impl InFlight for EtcdRemoval {
    const PREFIXES: &'static [&'static str] = &[ETCD_REMOVAL_PREFIX];

    fn under_way(status: &ClusterStatus) -> Option<&Self> {
        status.etcd_removal.as_ref()
    }

    /// Asked until the member is gone: a retry is a new directive.
    fn directive(&self, _: &Cluster, me: &str) -> Option<Directive> {
        (self.via == me).then(|| Directive {
            id: self.directive_id(),
            action: DirectiveAction::RemoveEtcdMember {
                id: self.id.clone(),
                name: self.name.clone(),
            },
        })
    }

    /// Keeps a failure, so the planner asks again shortly instead of
    /// waiting out the request; a success shows in the members reported.
    /// Either is said as a cleanup ([`is_cleanup`]), not here.
    fn record(
        status: &mut ClusterStatus,
        _: &str,
        result: &DirectiveResult,
        now: OffsetDateTime,
    ) -> Option<Reported> {
        keep_failure(status.etcd_removal.as_mut(), result, now);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{AddonPhase, AddonStatus, Cluster};

    fn t0() -> OffsetDateTime {
        time::macros::datetime!(2026-01-01 00:00 UTC)
    }

    fn cluster() -> Cluster {
        serde_saphyr::from_str(
            "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\n\
             spec:\n  kubernetesVersion: v1.31.2\n  controlPlane:\n    replicas: 1\n  \
             provider:\n    pool:\n      selector: {}\n",
        )
        .unwrap()
    }

    use crate::protocol::fixtures::result;

    #[test]
    fn a_failed_version_change_is_kept_once_and_a_success_only_said() {
        let mut c = cluster();
        c.status.version_update = Some(VersionUpdate {
            version: "v1.32.0".into(),
            via: "cp".into(),
            requested_at: t0(),
            error: String::new(),
        });
        let id = c.status.version_update.as_ref().unwrap().directive_id();
        assert_eq!(directives(&c, "cp").len(), 1);
        assert!(directives(&c, "other").is_empty());
        let failed = [result(&id, false, "etcd is slow")];
        let said = record_results(&mut c.status, "cp", &failed, t0());
        assert_eq!(
            said,
            [Reported::VersionSet {
                ok: false,
                message: "etcd is slow".into()
            }]
        );
        assert!(!said[0].wakes());
        assert_eq!(
            c.status.version_update.as_ref().unwrap().error,
            "etcd is slow"
        );
        // Asked until the planner asks anew.
        assert_eq!(directives(&c, "cp").len(), 1);
        let before = c.status.clone();
        let done = record_results(&mut c.status, "cp", &[result(&id, true, "")], t0());
        assert!(done[0].wakes());
        assert_eq!(c.status, before);
    }

    #[test]
    fn the_same_essential_addons_failure_is_said_once_and_done_ends_the_asking() {
        let mut c = cluster();
        c.status.essential_addons = Some(EssentialAddonsUpgrade {
            version: "v1.32.0".into(),
            via: "cp".into(),
            requested_at: t0(),
            done_at: None,
            message: String::new(),
            error: String::new(),
        });
        let id = c.status.essential_addons.as_ref().unwrap().directive_id();
        let failed = [result(&id, false, "409 Conflict")];
        assert_eq!(record_results(&mut c.status, "cp", &failed, t0()).len(), 1);
        assert!(record_results(&mut c.status, "cp", &failed, t0()).is_empty());
        // Not the machine asked: nothing.
        let ok = [result(&id, true, "kube-proxy v1.32.0")];
        assert!(record_results(&mut c.status, "other", &ok, t0()).is_empty());
        assert_eq!(record_results(&mut c.status, "cp", &ok, t0()).len(), 1);
        let u = c.status.essential_addons.as_ref().unwrap();
        assert_eq!((u.done_at, u.error.as_str()), (Some(t0()), ""));
        assert!(directives(&c, "cp").is_empty());
    }

    #[test]
    fn an_addon_result_ends_the_apply_and_is_kept_on_the_addon() {
        let mut c = cluster();
        let apply = AddonApply {
            addon: "cni".into(),
            hash: "0123456789abcdef".into(),
            via: "cp".into(),
            requested_at: t0(),
        };
        c.status.addon_apply = Some(apply.clone());
        c.status.addons = vec![serde_json::from_value::<AddonStatus>(serde_json::json!({
            "name": "cni",
            "phase": "Pending",
        }))
        .unwrap()];
        // The spec has no such addon with these manifests: nothing is sent.
        assert!(directives(&c, "cp").is_empty());
        let failed = [result(&apply.directive_id(), false, "no CRD")];
        let said = record_results(&mut c.status, "cp", &failed, t0());
        assert_eq!(
            said,
            [Reported::Addon {
                addon: "cni".into(),
                ok: false,
                message: "no CRD".into()
            }]
        );
        assert_eq!(c.status.addon_apply, None);
        let st = &c.status.addons[0];
        assert_eq!(
            (st.phase, st.failures, st.message.as_str()),
            (AddonPhase::Failed, 1, "no CRD")
        );
        // The apply is over: a second copy of the result is no one's.
        assert!(record_results(&mut c.status, "cp", &failed, t0()).is_empty());
    }

    #[test]
    fn a_failed_member_removal_is_kept_for_a_quick_retry_and_a_node_deletion_records_nothing() {
        let mut c = cluster();
        c.status.etcd_removal = Some(EtcdRemoval {
            id: "8e9e05c52164694d".into(),
            name: "cp-2".into(),
            via: "cp".into(),
            reason: "replaced".into(),
            requested_at: t0(),
            failed_at: None,
            error: String::new(),
        });
        c.status.node_removal = Some(NodeRemoval {
            node: "n".into(),
            via: "cp".into(),
            requested_at: t0(),
        });
        let asked: Vec<String> = directives(&c, "cp").into_iter().map(|d| d.id).collect();
        let removal = c.status.etcd_removal.as_ref().unwrap().directive_id();
        let deletion = c.status.node_removal.as_ref().unwrap().directive_id();
        assert_eq!(asked, [deletion.clone(), removal.clone()]);
        let results = [
            result(&deletion, false, "forbidden"),
            result(&removal, false, "learner not started"),
        ];
        assert!(results.iter().all(is_cleanup));
        assert!(record_results(&mut c.status, "cp", &results, t0()).is_empty());
        let r = c.status.etcd_removal.as_ref().unwrap();
        assert_eq!(
            (r.failed_at, r.error.as_str()),
            (Some(t0()), "learner not started")
        );
    }
}
