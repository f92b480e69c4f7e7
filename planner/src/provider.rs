//! Planning for clusters whose machines a provider (docker, aws) creates
//! and destroys: one pass in named phases, in the order they run (after
//! Omicron's reconfigurator planner, whose `do_plan` is a list of such
//! phases).
//!
//! [`plan_provider`] takes first what must come before any machine
//! ([`before_machines`]: the cluster's deletion, its CA set, its load
//! balancer). Otherwise a [`ProviderPass`] reads the cluster once
//! ([`ProviderPass::new`]: its live machines, whether it is initialized,
//! etcd as the control planes report it) and runs:
//! 1. [`ProviderPass::repair_endpoint`]: a provider-run load balancer that
//!    is down is brought back;
//! 2. [`ProviderPass::finish_deletions`]: machines being deleted are
//!    destroyed, and every machine's `Alive` condition follows what is
//!    heard of it;
//! 3. for each pool in turn, [`ProviderPass::pool`]: creations of recorded
//!    machines, health, remediation, deletions an operator asked for, the
//!    rollout, scale up, scale down or retirement, the pool's status;
//! 4. [`ProviderPass::endpoint_backends`]: the load balancer's backends
//!    change before a control plane that leaves goes;
//! 5. [`ProviderPass::finish`]: the cluster's status (endpoint, etcd member
//!    removal, kubeadm-config, essential addons, Nodes, addons, rollout and
//!    conditions).
//!
//! Each phase adds its steps to the pass in this order; the executor
//! applies them in it.

use super::backup::{waits_for_snapshot, Before};
use super::rollout::{self, PoolRoll, Roll};
use super::shared::*;

use drover_common::api::{
    Cluster, ClusterStatus, Machine, MachinePhase, MachineRole, PoolRollout, PoolStatus,
    ProviderSpec, RolloutHalt, CONTROL_PLANE_POOL,
};

use crate::health::Decision;
use crate::instance::InstanceState;

pub(super) fn plan_provider(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
) -> Vec<Step> {
    let mut steps = forget_steps(mine, observed);
    if let Some(first) = before_machines(cluster, mine, observed) {
        steps.extend(first);
        return steps;
    }
    let mut pass = ProviderPass::new(cluster, mine, observed, steps);
    pass.repair_endpoint();
    pass.finish_deletions();
    pass.restore();
    pass.all_running &= pass.restore_old.is_empty();
    for (pool_name, desired) in super::restore::pools_to_plan(cluster, &pass.restore_old) {
        pass.pool(&pool_name, desired);
    }
    pass.endpoint_backends();
    pass.finish()
}

/// What comes before any machine of the cluster, alone in its pass: a
/// cluster being deleted is taken down; one without its CA set gets it;
/// one that wants a provider load balancer ([`wants_load_balancer`]) gets
/// it before its first machine, since the endpoint goes into the API
/// server's certificate and every kubeconfig. `None` once none is due.
fn before_machines(
    cluster: &Cluster,
    mine: &[&Machine],
    observed: &Observed<'_>,
) -> Option<Vec<Step>> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return Some(deleting_steps(cluster, mine, true));
    }
    if !observed.has_pki {
        return Some(vec![Step::EnsurePki]);
    }
    if wants_load_balancer(cluster, mine) {
        return Some(vec![Step::EnsureEndpoint]);
    }
    None
}

/// One planning pass over a provider cluster: what it read of the cluster
/// at its start, the steps so far, and what the phases found for the
/// status.
struct ProviderPass<'a, 'o> {
    cluster: &'a Cluster,
    observed: &'a Observed<'o>,
    /// The cluster's machines, tombstones included (they still link a
    /// replacement to the machine it replaces).
    mine: &'a [&'a Machine],
    /// The cluster's machines that are not tombstones, leaving ones included.
    live: Vec<&'a Machine>,
    /// Why the provider-run endpoint is down this pass ([`endpoint_down`]).
    endpoint_down: Option<String>,
    /// The init machine while it is needed; `None` once the cluster is
    /// initialized and it is gone (new control planes join), or from the
    /// pass that asks for it (the executor names it).
    init_machine: Option<String>,
    initialized: bool,
    /// Remediation was paused in the last pass: it resumes one pass later.
    was_paused: bool,
    /// The control planes not being deleted: the owners of etcd members.
    cp_owners: Vec<&'a Machine>,
    /// The Running control planes not asked to leave: those through which
    /// etcd members are removed and kubeadm-config, addons and Nodes are
    /// changed.
    via: Vec<&'a Machine>,
    /// etcd membership as the control planes report it is settled: joins
    /// wait until it is.
    etcd_settled: bool,
    /// etcd is whole: a healthy voting member for every control plane, no
    /// other.
    etcd_whole: bool,
    /// The recorded rollout is halted for its target.
    halted: bool,
    /// The new machines of the current rollout that failed in earlier passes.
    failed_before: &'a [RolloutHalt],
    steps: Vec<Step>,
    status: ClusterStatus,
    /// Control planes that leave by their etcd member's removal first.
    etcd_leaving: Vec<&'a Machine>,
    /// Why remediation is paused, per pool.
    paused: Vec<String>,
    /// Unhealthy members: the name, and "pool: machine why" without ages.
    degraded: Vec<(String, String)>,
    all_running: bool,
    assigned_any: bool,
    /// The first pool still rolling: the later ones wait for it.
    rolling_pool: Option<String>,
    /// What the rollout waits for (the first pool that says).
    waiting: Option<String>,
    rollouts: Vec<PoolRollout>,
    new_halt: Option<RolloutHalt>,
    new_failures: Vec<RolloutHalt>,
    /// A control plane would be created at the version kubeadm-config does
    /// not name yet: kubeadm-config changes first.
    config_behind: bool,
    /// The control-plane pool has nothing outdated and all its machines run.
    cp_rolled: bool,
    /// The change that waits for a snapshot of etcd saved before it.
    snapshot_before: Option<Before>,
    /// Why a control-plane scale-down waits (for that snapshot).
    removal_waits: Option<String>,
    /// The control planes of before a restore under way still removes
    /// ([`super::restore`]).
    restore_old: Vec<String>,
}

/// One pool of a pass, as it is at the start of its phases.
struct PoolView<'a> {
    name: String,
    desired: u32,
    /// It is the control plane: one change at a time, under etcd quorum.
    control_plane: bool,
    /// Its live machines, leaving ones included.
    members: Vec<&'a Machine>,
    /// Its machines not being deleted.
    active: Vec<&'a Machine>,
    /// How many of its machines are being deleted.
    deleting: usize,
}

impl<'a, 'o> ProviderPass<'a, 'o> {
    /// Reads the cluster for the pass: its live machines, init machine and
    /// initialization, etcd as the control planes report it, the rollout's
    /// record; `steps` are those taken so far.
    fn new(
        cluster: &'a Cluster,
        mine: &'a [&'a Machine],
        observed: &'a Observed<'o>,
        steps: Vec<Step>,
    ) -> Self {
        let live: Vec<&Machine> = mine
            .iter()
            .copied()
            .filter(|m| !matches!(m.status.phase, MachinePhase::Deleted))
            .collect();
        let init_machine = current_init(cluster, &live);
        let initialized = initialized(cluster, &live, init_machine.as_deref());
        // etcd membership as the control planes report it: joins wait until
        // it is settled, and a control plane that leaves on purpose has its
        // member removed (through another one) before it is deleted.
        let etcd_members = &cluster.status.etcd_members;
        let cp_owners: Vec<&Machine> = live
            .iter()
            .copied()
            .filter(|m| m.status.phase != MachinePhase::Deleting && is_control_plane(m))
            .collect();
        let via: Vec<&Machine> = cp_owners
            .iter()
            .copied()
            .filter(|m| {
                m.status.phase == MachinePhase::Running && m.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let etcd_settled = plan_etcd(cluster, &cp_owners, &[], &via, observed.now).settled;
        let etcd_whole = etcd_settled
            && etcd_members.len() == cp_owners.len()
            && etcd_members.iter().all(|m| m.healthy && !m.is_learner)
            && cp_owners
                .iter()
                .all(|m| member_of(etcd_members, m).is_some());
        Self {
            cluster,
            observed,
            mine,
            endpoint_down: endpoint_down(cluster, observed),
            init_machine,
            initialized,
            was_paused: remediation_was_paused(cluster),
            cp_owners,
            via,
            etcd_settled,
            etcd_whole,
            halted: rollout::is_halted(cluster),
            failed_before: rollout::failed_before(cluster),
            live,
            steps,
            status: base_status(cluster),
            etcd_leaving: vec![],
            paused: vec![],
            degraded: vec![],
            all_running: true,
            assigned_any: false,
            rolling_pool: None,
            waiting: None,
            rollouts: vec![],
            new_halt: None,
            new_failures: vec![],
            config_behind: false,
            cp_rolled: false,
            snapshot_before: None,
            removal_waits: None,
            restore_old: vec![],
        }
    }

    /// A restore under way ([`super::restore`]) first removes the control
    /// planes of before, and pauses remediation until it is done.
    fn restore(&mut self) {
        let Some(r) = &self.cluster.status.restore else {
            return;
        };
        self.restore_old = super::restore::remove_old_control_planes(
            r,
            &self.live,
            self.init_machine.as_deref(),
            true,
            &mut self.steps,
        );
        self.paused.push(super::restore::pause_reason(r));
    }

    /// The load balancer is part of the cluster: checked every pass, and
    /// brought back (started, unpaused, made again) when it is down.
    fn repair_endpoint(&mut self) {
        if self.endpoint_down.is_some() {
            self.steps.push(Step::EnsureEndpoint);
        }
    }

    /// Machines already being deleted are finished first; every machine's
    /// `Alive` and `NodeFound` conditions follow what is heard of it.
    fn finish_deletions(&mut self) {
        for m in &self.live {
            if m.status.phase == MachinePhase::Deleting {
                self.steps.push(Step::Destroy {
                    machine: m.metadata.name.clone(),
                });
            }
        }
        self.steps.extend(alive_steps(&self.live, self.observed));
        self.steps.extend(node_found_steps(
            self.cluster,
            &self.live,
            nodes_to_judge(self.cluster, self.endpoint_down.is_some()),
            self.observed,
        ));
    }

    /// One pool's phases, in order: creations, health and remediation,
    /// requested deletions, the rollout, scale up, scale down or
    /// retirement, and its status.
    fn pool(&mut self, pool_name: &str, desired: u32) {
        let pool = self.view(pool_name, desired);
        self.provision(&pool);
        let judged = self.judge(&pool);
        let mut remediate = self.remediate(&pool, &judged);
        self.delete_requested(&pool, &judged, &mut remediate);
        let remaining: Vec<&'a Machine> = pool
            .active
            .iter()
            .copied()
            .filter(|m| {
                !remediate
                    .iter()
                    .any(|(r, _)| r.metadata.name == m.metadata.name)
            })
            .collect();
        let roll = self.roll(&pool, &judged, &remediate, &remaining);
        let count = self.scale_up(&pool, &remediate, &remaining, roll.ceiling);
        let count = self.scale_down_or_retire(&pool, &remaining, &roll, count);
        self.pool_status(&pool, &judged, &remaining, count);
    }

    /// The pool's machines as the pass starts on it.
    fn view(&self, pool_name: &str, desired: u32) -> PoolView<'a> {
        let members: Vec<&'a Machine> = self
            .live
            .iter()
            .copied()
            .filter(|m| {
                m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(pool_name)
            })
            .collect();
        let active: Vec<&'a Machine> = members
            .iter()
            .copied()
            .filter(|m| m.status.phase != MachinePhase::Deleting)
            .collect();
        PoolView {
            name: pool_name.to_owned(),
            desired,
            control_plane: pool_name == CONTROL_PLANE_POOL,
            deleting: members.len() - active.len(),
            members,
            active,
        }
    }

    /// Creations: what was recorded but not yet created is asked of the
    /// provider, unless its last attempt failed and its back-off has not
    /// run out.
    fn provision(&mut self, pool: &PoolView<'a>) {
        let observed = self.observed;
        for m in &pool.active {
            if m.status.provider_id.is_none()
                && (observed.retry_not_before)(&m.metadata.name).is_none_or(|t| t <= observed.now)
            {
                self.steps.push(Step::Provision {
                    machine: m.metadata.name.clone(),
                });
            }
        }
    }

    /// Health, decided over the whole pool: the unhealthy members and the
    /// replacements of earlier remediations not Running yet count together
    /// against maxUnhealthy. The unhealthy degrade the cluster.
    fn judge(&mut self, pool: &PoolView<'a>) -> Judgement<'a> {
        let in_flight = in_flight_replacements(self.mine, &self.live, &pool.name);
        let judged = judge(
            &pool.name,
            pool.desired,
            &pool.active,
            in_flight,
            nodes_to_judge(self.cluster, self.endpoint_down.is_some()),
            &self.cluster.spec.remediation(&pool.name).conditions,
            self.observed,
        );
        for (m, u) in &judged.unhealthy {
            self.degraded.push((
                m.metadata.name.clone(),
                format!("{}: {} {}", pool.name, m.metadata.name, u.summary()),
            ));
        }
        judged
    }

    /// Remediation: the unhealthy machines [`remediation`] lets go are
    /// deleted (none in the pass that ends a pause). Returns them, with why.
    fn remediate(
        &mut self,
        pool: &PoolView<'a>,
        judged: &Judgement<'a>,
    ) -> Vec<(&'a Machine, String)> {
        let mut remediate = remediation(
            judged,
            &pool.active,
            Gate {
                control_plane: pool.control_plane,
                // A control plane rebooting is a change under way too.
                busy: pool.deleting > 0 || pool.active.iter().any(|m| m.status.rebooting()),
                initialized: self.initialized,
                etcd: &self.cluster.status.etcd_members,
            },
            &mut self.paused,
        );
        if self.was_paused || self.cluster.status.restore.is_some() {
            // Remediation resumes one pass after a pause ends, and waits
            // for a restore.
            remediate.clear();
        }
        let remediate = repairs(
            self.cluster,
            &pool.name,
            remediate,
            judged,
            self.observed,
            &mut self.steps,
        );
        for (m, why) in &remediate {
            self.steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason: format!("unhealthy: {why}"),
                remediation: true,
            });
        }
        remediate
    }

    /// Requested deletions: machines an operator asked to delete leave the
    /// same way as remediated ones, and are replaced; a control-plane
    /// machine only when no other change is under way and the rest keeps
    /// quorum, and one with an etcd member by its member's removal first.
    /// Those deleted now join `remediate`.
    fn delete_requested(
        &mut self,
        pool: &PoolView<'a>,
        judged: &Judgement<'a>,
        remediate: &mut Vec<(&'a Machine, String)>,
    ) {
        let active = &pool.active;
        let requested = requested_deletions(
            judged,
            active,
            remediate,
            Gate {
                control_plane: pool.control_plane,
                busy: pool.deleting > 0
                    || !remediate.is_empty()
                    || active.iter().any(|m| {
                        m.status.phase != MachinePhase::Running
                            && m.metadata.deletion_timestamp.is_none()
                    }),
                initialized: self.initialized,
                etcd: &self.cluster.status.etcd_members,
            },
        );
        let etcd_members = &self.cluster.status.etcd_members;
        let (requested, first_member): (Vec<&Machine>, Vec<&Machine>) = requested
            .into_iter()
            .partition(|m| member_of(etcd_members, m).is_none());
        self.etcd_leaving.extend(first_member);
        for m in &requested {
            let reason = match m
                .metadata
                .annotations
                .get(drover_common::names::SCALE_DOWN_ANNOTATION)
            {
                Some(by) => format!("scaled down by {by}"),
                None => "deletion requested by an operator".into(),
            };
            self.steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason,
                remediation: false,
            });
            remediate.push((m, "deletion requested".into()));
        }
    }

    /// The rollout: a rollout may grow the pool above its replicas (surge)
    /// and retires outdated machines; pools roll one at a time. Records
    /// the pool's progress, what it waits for, and a halt or failures.
    fn roll(
        &mut self,
        pool: &PoolView<'a>,
        judged: &Judgement<'a>,
        remediate: &[(&'a Machine, String)],
        remaining: &[&'a Machine],
    ) -> Roll<'a> {
        let cluster = self.cluster;
        let etcd_members = &cluster.status.etcd_members;
        let unhealthy_why: Vec<(&Machine, String)> = judged
            .unhealthy
            .iter()
            .map(|(m, u)| (*m, u.summary()))
            .collect();
        let leaving: Vec<&Machine> = remaining
            .iter()
            .copied()
            .filter(|m| {
                pool.control_plane
                    && self.initialized
                    && m.status.phase == MachinePhase::Running
                    && rollout::is_outdated(cluster, m, self.observed.now)
                    && match member_of(etcd_members, m) {
                        // Its member was removed: it alone of the control
                        // planes has none (an empty or partial report
                        // says nothing).
                        None => {
                            !etcd_members.is_empty()
                                && self
                                    .cp_owners
                                    .iter()
                                    .filter(|o| member_of(etcd_members, o).is_none())
                                    .count()
                                    == 1
                        }
                        Some(member) => cluster
                            .status
                            .etcd_removal
                            .as_ref()
                            .is_some_and(|r| r.id == member.id),
                    }
            })
            .collect();
        let mut blocked = self.rollout_blocked(pool, judged, remediate);
        // The control plane's upgrade waits for a snapshot saved before it.
        if blocked.is_none()
            && pool.control_plane
            && remaining
                .iter()
                .any(|m| rollout::made_for_another(cluster, m))
        {
            let before = Before::upgrade(&rollout::target(cluster));
            blocked = waits_for_snapshot(cluster, &before);
            if blocked.is_some() {
                self.snapshot_before = Some(before);
            }
        }
        let roll = rollout::roll_pool(
            cluster,
            &PoolRoll {
                pool: &pool.name,
                desired: pool.desired,
                control_plane: pool.control_plane,
                policy: cluster.rollout_policy(&pool.name),
                remaining,
                unhealthy: &unhealthy_why,
                failed_before: self.failed_before,
                blocked,
                halted: self.halted,
                leaving: &leaving,
            },
            self.observed.now,
        );
        if roll.rolling && self.rolling_pool.is_none() {
            self.rolling_pool = Some(pool.name.clone());
        }
        if pool.control_plane {
            self.cp_rolled = !roll.rolling && count_running(remaining) >= pool.desired;
        }
        if self.waiting.is_none() {
            self.waiting = roll.waiting.clone().map(|w| format!("{}: {w}", pool.name));
        }
        self.rollouts.push(roll.progress.clone());
        if self.new_halt.is_none() {
            self.new_halt = roll.halt.clone();
        }
        self.new_failures.extend(roll.failures.iter().cloned());
        roll
    }

    /// Why the pool's rollout may take no step now, the first of: an
    /// earlier pool still rolling, the cluster not initialized, machines of
    /// the pool leaving or replaced, an unhealthy one, (control plane) etcd
    /// not whole, the endpoint not answering. `None`: it may.
    fn rollout_blocked(
        &self,
        pool: &PoolView<'a>,
        judged: &Judgement<'a>,
        remediate: &[(&'a Machine, String)],
    ) -> Option<String> {
        if let Some(rolling) = &self.rolling_pool {
            Some(format!("pool {rolling} to finish its rollout first"))
        } else if !self.initialized {
            Some("the cluster to initialize".into())
        } else if pool.deleting > 0 {
            Some(format!(
                "{} machine(s) of pool {} to finish leaving",
                pool.deleting, pool.name
            ))
        } else if let Some((m, why)) = remediate.first() {
            Some(format!(
                "machine {} to be replaced ({why})",
                m.metadata.name
            ))
        } else if let Some((m, u)) = judged.unhealthy.first() {
            Some(format!(
                "machine {} to be healthy: {}",
                m.metadata.name,
                u.summary()
            ))
        } else if pool.control_plane && !self.etcd_whole {
            Some(
                "etcd to be whole (a healthy member for every control plane, as they report)"
                    .into(),
            )
        } else if self.cluster.status.endpoint_ready == Some(false) {
            Some("the cluster's endpoint to answer /readyz".into())
        } else {
            None
        }
    }

    /// Scale up to `ceiling`, replacing the machines the pool lost first.
    /// Control-plane machines come one at a time, and the others only once
    /// the first has initialized the cluster. Returns the pool's count.
    fn scale_up(
        &mut self,
        pool: &PoolView<'a>,
        remediate: &[(&'a Machine, String)],
        remaining: &[&'a Machine],
        ceiling: u32,
    ) -> u32 {
        let cluster = self.cluster;
        let is_cp = pool.control_plane;
        let mut count = remaining.len() as u32;
        let mut to_replace = unreplaced(self.mine, &pool.members, &pool.name, remediate);
        while count < ceiling {
            if is_cp {
                let busy = remaining
                    .iter()
                    .any(|m| m.status.phase != MachinePhase::Running);
                // A control plane leaving in this pass still counts as a
                // healthy etcd member in what was last reported; its
                // replacement is created once its member is gone, or the
                // join would meet a cluster with a member down.
                let leaving_now = !remediate.is_empty();
                if busy || leaving_now || !self.etcd_settled || (count > 0 && !self.initialized) {
                    break;
                }
            }
            let role = if is_cp {
                if !self.initialized && self.init_machine.is_none() {
                    MachineRole::Init
                } else {
                    MachineRole::ControlPlane
                }
            } else {
                MachineRole::Worker
            };
            if role == MachineRole::ControlPlane
                && !config_names(cluster, &cluster.spec.kubernetes_version)
            {
                // It would deploy the version kubeadm-config names: that
                // changes first.
                self.config_behind = true;
                break;
            }
            if role == MachineRole::Init {
                // The executor names it; the status records it after creation.
                self.init_machine = None;
            }
            self.steps.push(Step::CreateMachine {
                machine_pool: pool.name.clone(),
                role,
                replaces: to_replace.pop(),
            });
            count += 1;
            if is_cp {
                break;
            }
        }
        count
    }

    /// Above `roll.ceiling`, the pool scales down ([`scale_down`]);
    /// otherwise the outdated machines the rollout retires leave. Both
    /// leave by the safe path ([`Leave`]). Returns the pool's count.
    fn scale_down_or_retire(
        &mut self,
        pool: &PoolView<'a>,
        remaining: &[&'a Machine],
        roll: &Roll<'a>,
        count: u32,
    ) -> u32 {
        let cluster = self.cluster;
        let now = self.observed.now;
        let leave = Leave {
            control_plane: pool.control_plane,
            etcd_members: &cluster.status.etcd_members,
        };
        if count > roll.ceiling && pool.control_plane && !roll.rolling {
            let before = Before::scale_down(cluster, pool.desired);
            if let Some(why) = waits_for_snapshot(cluster, &before) {
                self.removal_waits = Some(format!(
                    "control plane: scale-down to {} waits for {why}",
                    pool.desired
                ));
                self.snapshot_before = Some(before);
                return count;
            }
        }
        if count > roll.ceiling {
            let victims = scale_down(
                remaining,
                (count - roll.ceiling) as usize,
                self.init_machine.as_deref(),
                pool.control_plane,
            );
            leave.apply(victims, &mut self.etcd_leaving, &mut self.steps, |_| {
                format!(
                    "pool {} of cluster {} scaled down to {}",
                    pool.name, cluster.metadata.name, pool.desired
                )
            });
            return roll.ceiling;
        }
        if !roll.retire.is_empty() {
            // Outdated machines leave by the safe path, as in a
            // scale-down.
            leave.apply(
                roll.retire.iter().copied(),
                &mut self.etcd_leaving,
                &mut self.steps,
                |m| match rollout::expiring_certificates(cluster, m, now) {
                    Some(c) => format!(
                        "its certificates are renewed: {} expires at {}",
                        c.certificate,
                        c.expires_at.date()
                    ),
                    None => format!(
                        "rolled out: made for {}, cluster {} now runs {}",
                        made_for(m),
                        cluster.metadata.name,
                        rollout::target(cluster)
                    ),
                },
            );
        }
        count
    }

    /// The pool's line of the status, and whether it counts as all running.
    fn pool_status(
        &mut self,
        pool: &PoolView<'a>,
        judged: &Judgement<'a>,
        remaining: &[&'a Machine],
        count: u32,
    ) {
        let running = count_running(remaining);
        self.all_running &= running >= pool.desired && judged.unhealthy.is_empty();
        self.assigned_any |= !pool.members.is_empty();
        self.status.pools.push(PoolStatus {
            name: pool.name.clone(),
            desired: pool.desired,
            assigned: count.min(remaining.len() as u32),
            running: running.min(pool.desired),
        });
    }

    /// The load balancer's backends: a control plane that leaves gets no
    /// new connection from the moment it is chosen, so the backends change
    /// (first of all steps) before it goes, and it goes (its member
    /// removed, or its machine deleted on purpose) only once the load
    /// balancer was told: a later pass.
    fn endpoint_backends(&mut self) {
        let cluster = self.cluster;
        let Some(lb) = &cluster.status.load_balancer else {
            return;
        };
        let leaving: Vec<String> = self
            .steps
            .iter()
            .filter_map(|s| Some(s.removal()?.0.clone()))
            .chain(self.etcd_leaving.iter().map(|m| m.metadata.name.clone()))
            .collect();
        let backends = endpoint_backends(&self.live, &leaving);
        if backends != lb.backends {
            self.steps.insert(0, Step::SetEndpointBackends { backends });
        }
        let live = &self.live;
        self.steps.retain(|s| match s.removal() {
            Some((machine, false)) => !still_served(live, &lb.backends, machine),
            _ => true,
        });
        self.etcd_leaving
            .retain(|m| !still_served(live, &lb.backends, &m.metadata.name));
    }

    /// The cluster's status from what the phases found: its endpoint and
    /// phase, the etcd member removal and the kubeadm-config update to ask
    /// for, the essential addons of a rollout, the Nodes and the addons,
    /// the rollout and the conditions. A changed status is the last step.
    fn finish(mut self) -> Vec<Step> {
        let cluster = self.cluster;
        let now = self.observed.now;
        let via = &self.via;
        let mut status = std::mem::take(&mut self.status);
        finish_status(
            cluster,
            &self.live,
            &mut status,
            self.init_machine.take(),
            self.all_running,
            self.assigned_any,
            &self.degraded,
        );
        status.initialized = self.initialized;
        status.etcd_removal =
            plan_etcd(cluster, &self.cp_owners, &self.etcd_leaving, via, now).removal;
        status.version_update = plan_version_update(
            cluster,
            self.config_behind
                .then_some(cluster.spec.kubernetes_version.as_str()),
            via,
            now,
        );
        // Once the last new control plane of a rollout is in, kube-proxy and
        // CoreDNS follow, as `kubeadm upgrade apply` upgrades them after the
        // control plane; the rollout is done only once they are.
        let version = cluster.spec.kubernetes_version.as_str();
        let rollout_under_way = self.rolling_pool.is_some()
            || cluster
                .status
                .rollout
                .as_ref()
                .is_some_and(|r| r.target == rollout::target(cluster));
        let addons_wanted = (self.initialized
            && self.cp_rolled
            && rollout_under_way
            && config_names(cluster, version))
        .then_some(version);
        status.essential_addons = rollout::plan_essential_addons(cluster, addons_wanted, via, now);
        let addons_pending = addons_wanted.is_some()
            && !status
                .essential_addons
                .as_ref()
                .is_some_and(|u| u.version == version && u.is_done());
        let mut waiting = self.waiting.take();
        if addons_pending && waiting.is_none() {
            waiting = Some(rollout::essential_addons_waiting(
                version,
                status.essential_addons.as_ref(),
                now,
            ));
        }
        let owners: Vec<&Machine> = self
            .live
            .iter()
            .copied()
            .filter(|m| m.status.phase != MachinePhase::Deleting)
            .collect();
        apply_nodes(&mut status, &plan_nodes(cluster, &owners, via, now));
        super::addons::apply_addons(&mut status, cluster, via, now);
        super::backup::apply_backup(
            &mut status,
            cluster,
            via,
            self.snapshot_before.as_ref(),
            now,
        );
        super::pool::set_removal_condition(&mut status, &[], self.removal_waits.as_deref());
        super::drill::apply_drill(&mut status, cluster, via, self.initialized, now);
        if let Some(r) = &cluster.status.restore {
            let init = self
                .live
                .iter()
                .copied()
                .find(|m| Some(&m.metadata.name) == status.init_machine.as_ref());
            super::restore::finish(
                &mut status,
                r,
                &self.restore_old,
                init,
                self.initialized,
                now,
            );
        }
        set_remediation_condition(&mut status, &self.paused);
        status.rollout = rollout::rollout_status(
            cluster,
            std::mem::take(&mut self.rollouts),
            self.rolling_pool.is_some() || addons_pending,
            self.new_halt.take(),
            std::mem::take(&mut self.new_failures),
            waiting,
            now,
        );
        rollout::set_halted_condition(&mut status);
        rollout::set_waiting_condition(&mut status);
        set_endpoint_condition(&mut status, self.endpoint_down.as_deref());
        if status != cluster.status {
            self.steps.push(Step::SetStatus(Box::new(status)));
        }
        self.steps
    }
}

/// Whether the cluster gets a provider load balancer as its endpoint: a
/// docker cluster without one of the user's, before its first machine (a
/// cluster that has machines from before load balancers keeps its
/// machine-address endpoint: its certificates do not name another). An aws
/// cluster gets its Network Load Balancer the same way, or, when the spec
/// names the user's target group, has that recorded as its load balancer
/// (Drover then only registers control planes in it).
fn wants_load_balancer(cluster: &Cluster, mine: &[&Machine]) -> bool {
    let wanted = match &cluster.spec.provider {
        ProviderSpec::Docker(_) => cluster.spec.control_plane_endpoint.is_none(),
        ProviderSpec::Aws(a) => {
            cluster.spec.control_plane_endpoint.is_none() || a.user_target_group().is_some()
        }
        ProviderSpec::Pool(_) => false,
    };
    wanted
        && cluster.status.load_balancer.is_none()
        && mine.iter().all(|m| m.status.phase == MachinePhase::Deleted)
}

/// Why the cluster's provider-run endpoint (docker's load-balancer
/// container) is down, as observed this pass; `None` while it runs or is
/// not observed (another provider, a listing that failed).
fn endpoint_down(cluster: &Cluster, observed: &Observed<'_>) -> Option<String> {
    let lb = cluster.status.load_balancer.as_ref()?;
    if !matches!(cluster.spec.provider, ProviderSpec::Docker(_)) {
        return None;
    }
    let uid = cluster.metadata.uid.as_deref()?;
    let state = (observed.instance)(&crate::instance::endpoint_key(uid))?;
    let what = match state {
        InstanceState::Running | InstanceState::Pending => return None,
        InstanceState::Paused => "paused",
        InstanceState::Stopped => "stopped or removed",
    };
    Some(format!(
        "load balancer {} ({}) is {what}; the coordinator brings it back",
        lb.id, lb.address
    ))
}

/// What a machine was made for: its version and image, as recorded.
fn made_for(m: &Machine) -> String {
    let a = m.spec.assignment.as_ref();
    let version = a
        .and_then(|a| a.kubernetes_version.as_deref())
        .unwrap_or("an unrecorded version");
    match a.and_then(|a| a.image.as_deref()) {
        Some(image) => format!("{version} from {image}"),
        None => version.to_owned(),
    }
}

/// What limits a pool's changes in one pass.
#[derive(Debug, Clone, Copy)]
struct Gate<'e> {
    /// The pool is the control plane: one machine at a time, under quorum.
    control_plane: bool,
    /// Another change of the pool is under way.
    busy: bool,
    /// `kubeadm init` has run: there is etcd quorum to keep.
    initialized: bool,
    /// etcd's members, as the control planes last reported them.
    etcd: &'e [drover_common::api::EtcdMember],
}

/// The unhealthy machines to replace now: those `maxUnhealthy` allows, and
/// of the control plane one at a time and only while the rest keeps etcd
/// quorum (before init there is no etcd to protect). Why a control plane
/// waits goes into `paused`.
fn remediation<'a>(
    judged: &Judgement<'a>,
    active: &[&'a Machine],
    gate: Gate,
    paused: &mut Vec<String>,
) -> Vec<(&'a Machine, String)> {
    let names = match &judged.decision {
        Decision::Paused(msg) => {
            paused.push(msg.clone());
            return vec![];
        }
        Decision::Remediate(names) => names,
    };
    let mut chosen = judged
        .unhealthy
        .iter()
        .filter(|(m, _)| names.contains(&m.metadata.name));
    if !gate.control_plane {
        return chosen.map(|(m, why)| (*m, why.to_string())).collect();
    }
    let Some((m, why)) = chosen.next().filter(|_| !gate.busy) else {
        return vec![];
    };
    match judged.quorum_without(active, m, gate.etcd) {
        Err(count) if gate.initialized => {
            // With no healthy member left, etcd is lost: only a snapshot
            // brings it back.
            let lost = if judged.healthy_others(active, m) == 0 {
                "; if no control plane comes back, restore etcd from a snapshot: `drover restore cluster`"
            } else {
                ""
            };
            paused.push(format!(
                "control plane: {} is {} but removing it would break etcd quorum ({count}); not remediated{lost}",
                m.metadata.name,
                why.summary(),
            ));
            vec![]
        }
        _ => vec![(*m, why.to_string())],
    }
}

/// The machines an operator asked to delete that may leave now (and are
/// replaced): every worker, and one control-plane machine when no other
/// change is under way and the rest keeps quorum.
fn requested_deletions<'a>(
    judged: &Judgement<'a>,
    active: &[&'a Machine],
    remediate: &[(&'a Machine, String)],
    gate: Gate,
) -> Vec<&'a Machine> {
    let requested = asked_to_leave(active, remediate);
    if !gate.control_plane {
        return requested;
    }
    requested
        .into_iter()
        .take(1)
        .filter(|m| !gate.busy && judged.quorum_without(active, m, gate.etcd).is_ok())
        .collect()
}

/// Machines this pool lost (to remediation or an operator's request) that
/// no machine replaces yet, by name; the last is replaced first.
fn unreplaced(
    mine: &[&Machine],
    members: &[&Machine],
    pool: &str,
    leaving_now: &[(&Machine, String)],
) -> Vec<String> {
    let mut out: Vec<String> = members
        .iter()
        .chain(mine.iter().filter(|m| {
            m.status.phase == MachinePhase::Deleted
                && m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str()) == Some(pool)
        }))
        .filter(|m| needs_replacement_link(m))
        .map(|m| m.metadata.name.clone())
        .chain(leaving_now.iter().map(|(m, _)| m.metadata.name.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Which of `remaining` a scale-down by `excess` deletes now: the newest
/// first, never the init machine while it is needed, and of the control
/// plane one per pass. They leave through [`Leave`].
fn scale_down<'a>(
    remaining: &[&'a Machine],
    excess: usize,
    init_machine: Option<&str>,
    control_plane: bool,
) -> Vec<&'a Machine> {
    let mut victims: Vec<&Machine> = remaining.to_vec();
    victims.sort_by_key(|m| {
        (
            Some(m.metadata.name.as_str()) == init_machine,
            m.status.phase == MachinePhase::Running,
            std::cmp::Reverse(m.metadata.creation_timestamp),
        )
    });
    let take = if control_plane { excess.min(1) } else { excess };
    victims.truncate(take);
    victims
}

/// How machines leave a pool by the safe path: a control plane with an etcd
/// member has the member removed first, the others are deleted at once.
struct Leave<'e> {
    control_plane: bool,
    etcd_members: &'e [drover_common::api::EtcdMember],
}

impl Leave<'_> {
    /// Sends each of `machines` on its way: into `etcd_leaving`, or a
    /// `DeleteMachine` step with the reason `why` gives.
    fn apply<'a>(
        &self,
        machines: impl IntoIterator<Item = &'a Machine>,
        etcd_leaving: &mut Vec<&'a Machine>,
        steps: &mut Vec<Step>,
        why: impl Fn(&Machine) -> String,
    ) {
        for m in machines {
            if self.control_plane && member_of(self.etcd_members, m).is_some() {
                etcd_leaving.push(m);
                continue;
            }
            steps.push(Step::DeleteMachine {
                machine: m.metadata.name.clone(),
                reason: why(m),
                remediation: false,
            });
        }
    }
}
