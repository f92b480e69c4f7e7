//! Planning for clusters of pool machines: claim registered machines that
//! match a pool's selector, judge the members' health, take an unhealthy
//! member out (its agent resets it) and claim a free machine in its place,
//! and release the members past the desired count. Control-plane changes go
//! one at a time and never below etcd quorum, as on the provider path.

use super::backup::{waits_for_snapshot, Before};
use super::in_place;
use super::shared::*;
use std::collections::BTreeSet;

use drover_common::api::{
    set_condition, Cluster, Machine, MachinePhase, MachineRole, PoolProviderSpec, PoolStatus,
    ProviderSpec, CONTROL_PLANE_POOL,
};

use crate::health::{quorum_allows_removal, Decision};

pub(super) fn plan_pool(
    cluster: &Cluster,
    mine: &[&Machine],
    machines: &[Machine],
    observed: &Observed<'_>,
) -> Vec<Step> {
    let mut steps = forget_steps(mine, observed);
    if cluster.metadata.deletion_timestamp.is_some() {
        // A released machine that went silent before its reset finished
        // does not hold the cluster's deletion up: when it comes back, it
        // is told to reset whatever became of its cluster.
        let waiting: Vec<&Machine> = mine
            .iter()
            .copied()
            .filter(|m| {
                m.status.phase != MachinePhase::Releasing || observed.alive(&m.metadata.name)
            })
            .collect();
        steps.extend(deleting_steps(cluster, &waiting, false));
        return steps;
    }
    if !observed.has_pki {
        steps.push(Step::EnsurePki);
        return steps;
    }
    if cluster.spec.endpoint_managed_by_coordinator() && cluster.status.endpoint_port.is_none() {
        // The endpoint goes into the API server's certificate and every
        // kubeconfig, so it is chosen before the init machine is claimed.
        steps.push(Step::AllocateEndpoint);
        return steps;
    }
    let ProviderSpec::Pool(provider) = &cluster.spec.provider else {
        unreachable!("plan_pool is called for pool clusters only")
    };
    let mut pass = PoolPass::new(cluster, mine, machines, provider, observed);
    pass.restore();
    pass.all_running &= pass.restore_old.is_empty();
    for (pool_name, desired) in super::restore::pools_to_plan(cluster, &pass.restore_old) {
        pass.pool(&pool_name, desired);
    }
    steps.extend(pass.finish());
    steps
}

/// One planning pass over a pool cluster.
struct PoolPass<'a, 'o> {
    cluster: &'a Cluster,
    observed: &'a Observed<'o>,
    /// The cluster's machines that are not tombstones, leaving ones included.
    live: Vec<&'a Machine>,
    /// Registered machines that match the cluster's pool and selector, by
    /// name; each is claimed at most once per pass.
    free: Vec<&'a Machine>,
    taken: BTreeSet<&'a str>,
    init_machine: Option<String>,
    initialized: bool,
    was_paused: bool,
    /// Whether every control-plane machine of the initialized cluster is gone.
    lost: bool,
    /// What the reported etcd members call for.
    etcd: EtcdPlan,
    steps: Vec<Step>,
    status: drover_common::api::ClusterStatus,
    /// Why remediation is paused, per pool.
    paused: Vec<String>,
    /// Why a scale-down waits, per pool.
    held: Vec<String>,
    /// The change that waits for a snapshot of etcd saved before it.
    snapshot_before: Option<Before>,
    /// Why a control-plane scale-down waits for that snapshot.
    removal_waits: Option<String>,
    /// Unhealthy members: the name, and "pool: machine why" without ages.
    degraded: Vec<(String, String)>,
    all_running: bool,
    assigned_any: bool,
    /// The control planes of before a restore under way still releases
    /// ([`super::restore`]).
    restore_old: Vec<String>,
}

impl<'a, 'o> PoolPass<'a, 'o> {
    /// A restore under way ([`super::restore`]) first releases the control
    /// planes of before (back to their pool once their agent resets), and
    /// pauses remediation until it is done.
    fn restore(&mut self) {
        let Some(r) = &self.cluster.status.restore else {
            return;
        };
        let members: Vec<&Machine> = self.live.iter().copied().filter(|m| is_member(m)).collect();
        self.restore_old = super::restore::remove_old_control_planes(
            r,
            &members,
            self.init_machine.as_deref(),
            false,
            &mut self.steps,
        );
        self.paused.push(super::restore::pause_reason(r));
    }

    fn new(
        cluster: &'a Cluster,
        mine: &[&'a Machine],
        machines: &'a [Machine],
        provider: &'a PoolProviderSpec,
        observed: &'a Observed<'o>,
    ) -> Self {
        let live: Vec<&Machine> = mine
            .iter()
            .copied()
            .filter(|m| m.status.phase != MachinePhase::Deleted)
            .collect();
        let mut free: Vec<&Machine> = machines
            .iter()
            .filter(|m| {
                m.spec.assignment.is_none()
                    && m.status.phase == MachinePhase::Registered
                    && m.metadata.deletion_timestamp.is_none()
                    && provider.pool.as_ref().is_none_or(|p| *p == m.spec.pool)
                    && provider.selector.matches(&m.metadata.labels)
                    && observed.alive(&m.metadata.name)
            })
            .collect();
        free.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let init_machine = current_init(cluster, &live);
        let initialized = initialized(cluster, &live, init_machine.as_deref());
        let lost = initialized
            && cluster.spec.control_plane.replicas > 0
            && !live.iter().any(|m| is_member(m) && is_control_plane(m));
        // Control planes whose members stay: those that serve the cluster,
        // and released ones still alive (their reset removes their member).
        let cp = |m: &&Machine| is_control_plane(m);
        let owners: Vec<&Machine> = live
            .iter()
            .copied()
            .filter(cp)
            .filter(|m| {
                is_member(m)
                    || (m.status.phase == MachinePhase::Releasing
                        && observed.alive(&m.metadata.name))
            })
            .collect();
        let via: Vec<&Machine> = owners
            .iter()
            .copied()
            .filter(|m| m.status.phase == MachinePhase::Running && is_member(m))
            .collect();
        let etcd = plan_etcd(cluster, &owners, &[], &via, observed.now);
        Self {
            cluster,
            observed,
            etcd,
            live,
            free,
            taken: BTreeSet::new(),
            init_machine,
            initialized,
            was_paused: remediation_was_paused(cluster),
            lost,
            steps: vec![],
            status: base_status(cluster),
            paused: vec![],
            held: vec![],
            snapshot_before: None,
            removal_waits: None,
            degraded: vec![],
            all_running: true,
            assigned_any: false,
            restore_old: vec![],
        }
    }

    /// Plans one pool of the cluster.
    fn pool(&mut self, pool_name: &str, desired: u32) {
        let members: Vec<&'a Machine> = self
            .live
            .iter()
            .copied()
            .filter(|m| is_member(m) && pool_of(m) == Some(pool_name))
            .collect();
        let in_flight = self.in_flight(pool_name, desired, &members);
        let judged = judge(
            pool_name,
            desired,
            &members,
            in_flight,
            nodes_to_judge(self.cluster, false),
            &self.cluster.spec.remediation(pool_name).conditions,
            self.observed,
        );
        let unhealthy = &judged.unhealthy;
        for (m, u) in unhealthy {
            self.degraded.push((
                m.metadata.name.clone(),
                format!("{pool_name}: {} {}", m.metadata.name, u.summary()),
            ));
        }
        let chosen = self.remediation(pool_name, &members, &judged);
        let remediate = repairs(
            self.cluster,
            pool_name,
            chosen,
            &judged,
            self.observed,
            &mut self.steps,
        );
        for (m, why) in &remediate {
            self.steps.push(Step::Release {
                machine: m.metadata.name.clone(),
                reason: format!("unhealthy: {why}"),
                remediation: true,
            });
        }
        let requested = self.requested(pool_name, &members, &judged, &remediate);
        for m in &requested {
            let reason = match m
                .metadata
                .annotations
                .get(drover_common::names::SCALE_DOWN_ANNOTATION)
            {
                Some(by) if m.metadata.deletion_timestamp.is_none() => {
                    format!("scaled down by {by}; back to its pool")
                }
                _ => "deletion requested by an operator".into(),
            };
            self.steps.push(Step::Release {
                machine: m.metadata.name.clone(),
                reason,
                remediation: false,
            });
        }
        let leaving = |m: &Machine| {
            remediate
                .iter()
                .any(|(r, _)| r.metadata.name == m.metadata.name)
                || requested.iter().any(|r| r.metadata.name == m.metadata.name)
        };
        let remaining: Vec<&'a Machine> = members.iter().copied().filter(|m| !leaving(m)).collect();
        // Machines taken out (unhealthy, or on request) that no member
        // replaces yet.
        let mut to_replace: Vec<String> = self
            .live
            .iter()
            .filter(|m| {
                m.status.phase == MachinePhase::Releasing
                    && pool_of(m) == Some(pool_name)
                    && (was_remediated(m) || m.metadata.deletion_timestamp.is_some())
            })
            .map(|m| m.metadata.name.clone())
            .chain(remediate.iter().map(|(m, _)| m.metadata.name.clone()))
            .chain(requested.iter().map(|m| m.metadata.name.clone()))
            // A machine whose place another took is history, even when that
            // one left in turn: the newest in a chain is the one replaced.
            .filter(|old| !self.live.iter().any(|m| replaces(m) == Some(old.as_str())))
            .collect();
        to_replace.sort();
        to_replace.dedup();

        let mut count = remaining.len() as u32;
        if count < desired {
            count += self.scale_up(pool_name, desired - count, &remaining, &mut to_replace);
        } else if count > desired {
            count -= self.scale_down(pool_name, desired, &remaining, &judged);
        }
        let running = count_running(&remaining);
        self.all_running &= running >= desired && unhealthy.is_empty();
        self.assigned_any |= count > 0;
        self.status.pools.push(PoolStatus {
            name: pool_name.to_owned(),
            desired,
            assigned: count,
            running: running.min(desired),
        });
    }

    /// Replacements not Running yet, and machines taken out that nothing
    /// replaces yet: they count against `maxUnhealthy` too. A machine taken
    /// out counts only while its place is still empty (the pool has fewer
    /// members than desired): once a later machine holds the place, even
    /// one that replaced another replacement, the old one is history and
    /// counting it would pause remediation for good.
    fn in_flight(&self, pool_name: &str, desired: u32, members: &[&'a Machine]) -> Vec<&'a str> {
        let empty_places = (desired as usize).saturating_sub(members.len());
        let mut in_flight: Vec<&str> = members
            .iter()
            .filter(|m| replaces(m).is_some() && m.status.phase != MachinePhase::Running)
            .map(|m| m.metadata.name.as_str())
            .collect();
        in_flight.extend(
            self.live
                .iter()
                .filter(|m| {
                    m.status.phase == MachinePhase::Releasing
                        && pool_of(m) == Some(pool_name)
                        && was_remediated(m)
                        && !members
                            .iter()
                            .any(|r| replaces(r) == Some(m.metadata.name.as_str()))
                })
                .map(|m| m.metadata.name.as_str())
                .take(empty_places),
        );
        in_flight
    }

    /// The unhealthy members to take out now, under `maxUnhealthy` and, for
    /// the control plane, one at a time and only while the rest keeps etcd
    /// quorum.
    fn remediation(
        &mut self,
        pool_name: &str,
        members: &[&'a Machine],
        judged: &Judgement<'a>,
    ) -> Vec<(&'a Machine, String)> {
        let names = match &judged.decision {
            Decision::Paused(msg) => {
                self.paused.push(msg.clone());
                return vec![];
            }
            Decision::Remediate(names) => names,
        };
        if self.was_paused || self.cluster.status.restore.is_some() {
            return vec![];
        }
        let chosen = judged
            .unhealthy
            .iter()
            .filter(|(m, _)| names.contains(&m.metadata.name));
        if pool_name != CONTROL_PLANE_POOL {
            return chosen.map(|(m, u)| (*m, u.to_string())).collect();
        }
        let Some((m, why)) = chosen.clone().next() else {
            return vec![];
        };
        if self.cp_change_in_flight(members, Some(m)) {
            return vec![];
        }
        let etcd = &self.cluster.status.etcd_members;
        match judged.quorum_without(members, m, etcd) {
            Err(count) if self.initialized => {
                self.paused.push(format!(
                    "control plane: {} is {} but taking it out would break etcd quorum ({count}); not remediated",
                    m.metadata.name,
                    why.summary(),
                ));
                vec![]
            }
            _ => vec![(*m, why.to_string())],
        }
    }

    /// The members an operator asked to delete that may leave now: every
    /// worker, and one control-plane machine when no other change is under
    /// way and the rest keeps etcd quorum.
    fn requested(
        &mut self,
        pool_name: &str,
        members: &[&'a Machine],
        judged: &Judgement<'a>,
        remediate: &[(&'a Machine, String)],
    ) -> Vec<&'a Machine> {
        let asked = asked_to_leave(members, remediate);
        if pool_name != CONTROL_PLANE_POOL {
            return asked;
        }
        let Some(m) = asked.first().copied() else {
            return vec![];
        };
        if !remediate.is_empty() || self.cp_change_in_flight(members, Some(m)) {
            self.held.push(format!(
                "control plane: {} leaves once the change under way is done",
                m.metadata.name
            ));
            return vec![];
        }
        let etcd = &self.cluster.status.etcd_members;
        if let (true, Err(count)) = (self.initialized, judged.quorum_without(members, m, etcd)) {
            self.held.push(format!(
                "control plane: {} stays until the others keep etcd quorum without it ({count})",
                m.metadata.name
            ));
            return vec![];
        }
        vec![m]
    }

    /// Whether a control-plane change is under way: a member other than
    /// `except` that has not reached Running (it is joining), or a released
    /// control-plane machine still resetting (its etcd member is leaving),
    /// or one rebooting.
    /// A released machine that went silent is not waited for.
    fn cp_change_in_flight(&self, members: &[&Machine], except: Option<&Machine>) -> bool {
        let other = |m: &&&Machine| except.is_none_or(|e| e.metadata.name != m.metadata.name);
        let joining = members
            .iter()
            .filter(other)
            .any(|m| m.status.phase != MachinePhase::Running || m.status.rebooting());
        let leaving = self.live.iter().filter(other).any(|m| {
            m.status.phase == MachinePhase::Releasing
                && pool_of(m) == Some(CONTROL_PLANE_POOL)
                && self.observed.alive(&m.metadata.name)
        });
        joining || leaving
    }

    /// Claims up to `missing` free machines for the pool; the control plane
    /// gets at most one per pass, and only when no other control-plane
    /// change is under way. Returns how many were claimed.
    fn scale_up(
        &mut self,
        pool_name: &str,
        missing: u32,
        remaining: &[&'a Machine],
        to_replace: &mut Vec<String>,
    ) -> u32 {
        if self.lost {
            return 0;
        }
        let is_cp = pool_name == CONTROL_PLANE_POOL;
        let mut claimed = 0;
        while claimed < missing {
            let role = if !is_cp {
                MachineRole::Worker
            } else if self.cp_change_in_flight(remaining, None)
                || claimed > 0
                || !self.etcd.settled
                || self.releasing_control_plane_now()
            {
                // One control-plane change at a time: the last join's
                // member started and healthy, no member change under way.
                break;
            } else if self.initialized {
                MachineRole::ControlPlane
            } else if self.init_machine.is_none() && remaining.is_empty() {
                MachineRole::Init
            } else {
                // The other control-plane machines wait for `kubeadm init`.
                break;
            };
            let selector = pool_selector(self.cluster, pool_name);
            // A free machine that reports a problem the pool's remediation
            // lists would be unhealthy once claimed: it waits.
            let problems = &self.cluster.spec.remediation(pool_name).conditions;
            let Some(pos) = self.free.iter().position(|m| {
                selector.matches(&m.metadata.labels)
                    && !self.taken.contains(m.metadata.name.as_str())
                    && !m
                        .status
                        .conditions
                        .iter()
                        .any(|c| c.status == "True" && problems.contains(&c.type_))
            }) else {
                break;
            };
            let m = self.free.remove(pos);
            self.taken.insert(&m.metadata.name);
            if role == MachineRole::Init {
                self.init_machine = Some(m.metadata.name.clone());
                self.status.control_plane_endpoint = Some(endpoint_for(self.cluster, m));
            }
            self.steps.push(Step::Assign {
                machine: m.metadata.name.clone(),
                machine_pool: pool_name.to_owned(),
                role,
                replaces: to_replace.pop(),
            });
            claimed += 1;
        }
        claimed
    }

    /// Whether this pass takes a control-plane machine out: its member
    /// must be gone before another joins, which a later pass sees.
    fn releasing_control_plane_now(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(s, Step::Release { machine, .. }
                if self.live.iter().any(|m| &m.metadata.name == machine
                    && pool_of(m) == Some(CONTROL_PLANE_POOL)))
        })
    }

    /// Releases members past `desired`: unhealthy ones first, then the
    /// newest, never the init machine while it is needed. The control plane
    /// gives up one machine per pass, only when no other change is under
    /// way and the rest keeps etcd quorum. Returns how many were released.
    fn scale_down(
        &mut self,
        pool_name: &str,
        desired: u32,
        remaining: &[&'a Machine],
        judged: &Judgement<'a>,
    ) -> u32 {
        let is_unhealthy = |m: &Machine| judged.is_unhealthy(m);
        let mut victims: Vec<&Machine> = remaining.to_vec();
        victims.sort_by_key(|m| {
            (
                !is_unhealthy(m),
                Some(&m.metadata.name) == self.init_machine.as_ref(),
                m.status.phase == MachinePhase::Running,
                std::cmp::Reverse(m.metadata.creation_timestamp),
            )
        });
        let excess = remaining.len() as u32 - desired;
        let reason = format!(
            "pool {pool_name} of cluster {} scaled down to {desired}",
            self.cluster.metadata.name
        );
        if pool_name != CONTROL_PLANE_POOL {
            for m in victims.iter().take(excess as usize) {
                self.steps.push(Step::Release {
                    machine: m.metadata.name.clone(),
                    reason: reason.clone(),
                    remediation: false,
                });
            }
            return excess;
        }
        let Some(victim) = victims.first() else {
            return 0;
        };
        if self.cp_change_in_flight(remaining, Some(victim)) {
            self.held.push(format!(
                "control plane: scale-down to {desired} waits for the change under way"
            ));
            return 0;
        }
        let healthy_others = remaining
            .iter()
            .filter(|o| o.metadata.name != victim.metadata.name)
            .filter(|o| o.status.phase == MachinePhase::Running && !is_unhealthy(o))
            .count() as u32;
        if self.initialized && !quorum_allows_removal(remaining.len() as u32, healthy_others) {
            self.held.push(format!(
                "control plane: taking {} out would leave {healthy_others} healthy of {} members, below etcd quorum; scale-down waits",
                victim.metadata.name,
                remaining.len() - 1
            ));
            return 0;
        }
        if let (true, Err(count)) = (
            self.initialized,
            etcd_quorum_without(&self.cluster.status.etcd_members, victim),
        ) {
            self.held.push(format!(
                "control plane: taking {} out would break etcd quorum ({count}); scale-down waits",
                victim.metadata.name,
            ));
            return 0;
        }
        let before = Before::scale_down(self.cluster, desired);
        if let Some(why) = waits_for_snapshot(self.cluster, &before) {
            self.removal_waits = Some(format!(
                "control plane: scale-down to {desired} waits for {why}"
            ));
            self.snapshot_before = Some(before);
            return 0;
        }
        self.steps.push(Step::Release {
            machine: victim.metadata.name.clone(),
            reason,
            remediation: false,
        });
        1
    }

    /// The backends of the coordinator's own endpoint, when the cluster has
    /// one: recorded in its status (every replica's proxy reads them there)
    /// by the rule of a provider's load balancer. A control plane that
    /// leaves gets no new connection from the moment it is chosen, and is
    /// released, unless it is already dead, only in a later pass, once the
    /// backends without it are recorded.
    fn managed_endpoint_backends(&mut self) {
        if !self.cluster.spec.endpoint_managed_by_coordinator()
            || self.cluster.status.endpoint_port.is_none()
        {
            return;
        }
        let leaving: Vec<String> = self
            .steps
            .iter()
            .filter_map(|s| Some(s.removal()?.0.clone()))
            .collect();
        let backends = endpoint_backends(&self.live, &leaving);
        let recorded = self.cluster.status.load_balancer.as_ref();
        if recorded.map(|lb| &lb.backends) != Some(&backends) {
            self.steps.insert(0, Step::SetEndpointBackends { backends });
        }
        let recorded: &[String] = recorded.map(|lb| &lb.backends[..]).unwrap_or_default();
        let live = &self.live;
        self.steps.retain(|s| match s.removal() {
            Some((machine, false)) => !still_served(live, recorded, machine),
            _ => true,
        });
    }

    /// Plans the in-place upgrade of the members to the spec's version:
    /// records the machine upgrading and the rollout's progress.
    fn upgrade_in_place(&mut self, members: &[&'a Machine]) {
        let mut members = members.to_vec();
        in_place::upgrade_order(self.cluster, &mut members);
        let nodes_ready = members.iter().all(|m| {
            self.cluster
                .status
                .nodes
                .iter()
                .any(|n| n.name == m.status.hostname && n.ready == "True")
        });
        let changing = self
            .steps
            .iter()
            .any(|s| matches!(s, Step::Assign { .. } | Step::Release { .. }));
        let may_start = self.initialized
            && !self.lost
            && self.all_running
            && self.degraded.is_empty()
            && self.paused.is_empty()
            && self.held.is_empty()
            && !changing
            && nodes_ready
            && self
                .live
                .iter()
                .all(|m| is_member(m) && m.status.phase == MachinePhase::Running)
            && self.etcd.settled
            && self.etcd.removal.is_none()
            && self.cluster.status.drain.is_none()
            && self.cluster.status.certificate_renewal.is_none()
            && self.cluster.status.endpoint_ready != Some(false);
        // An upgrade's first step (and any later one, until a snapshot
        // was saved before this upgrade) waits for one.
        let target = &self.cluster.spec.kubernetes_version;
        let upgrading = members.iter().any(|m| {
            in_place::kubelet_version(self.cluster, m)
                .is_some_and(|v| !in_place::same_version(v, target))
        });
        let snapshot_wait = match upgrading {
            true => {
                let before = Before::upgrade(target);
                let why = waits_for_snapshot(self.cluster, &before);
                if why.is_some() {
                    self.snapshot_before = Some(before);
                }
                why
            }
            false => None,
        };
        let may_start = may_start && snapshot_wait.is_none();
        let observed = self.observed;
        let alive = |name: &str| observed.alive(name);
        let plan = in_place::plan_in_place(
            self.cluster,
            &in_place::InPlace {
                members: &members,
                unhealthy: &self.degraded,
                may_start,
                alive: &alive,
            },
            self.observed.now,
        );
        // The machine asked to upgrade carries the request, so its
        // heartbeats answer it without reading the cluster.
        for m in &self.live {
            let wanted = plan
                .upgrade
                .as_ref()
                .filter(|u| u.machine == m.metadata.name)
                .and_then(|u| u.request());
            if m.status.upgrade != wanted {
                self.steps.push(Step::SetUpgradeRequest {
                    machine: m.metadata.name.clone(),
                    request: wanted,
                });
            }
        }
        if let Some((machine, version)) = plan.upgraded {
            self.steps.push(Step::MarkUpgraded { machine, version });
        }
        self.status.machine_upgrade = plan.upgrade;
        self.status.rollout = plan.rollout;
        super::rollout::set_halted_condition(&mut self.status);
        super::rollout::set_waiting_condition(&mut self.status);
    }

    /// The status and the steps every pass ends with.
    fn finish(mut self) -> Vec<Step> {
        self.managed_endpoint_backends();
        let members: Vec<&Machine> = self.live.iter().copied().filter(|m| is_member(m)).collect();
        self.steps.extend(alive_steps(&members, self.observed));
        self.steps.extend(node_found_steps(
            self.cluster,
            &members,
            nodes_to_judge(self.cluster, false),
            self.observed,
        ));
        finish_status(
            self.cluster,
            &self.live,
            &mut self.status,
            self.init_machine.clone(),
            self.all_running && !self.lost,
            self.assigned_any,
            &self.degraded,
        );
        self.status.initialized = self.initialized;
        self.status.etcd_removal = self.etcd.removal.clone();
        self.upgrade_in_place(&members);
        self.status.certificate_renewal = if self.status.machine_upgrade.is_some() {
            // `kubeadm upgrade` renews the certificates itself.
            None
        } else {
            plan_certificate_renewal(self.cluster, &members, self.observed.now)
        };
        let owners: Vec<&Machine> = self
            .live
            .iter()
            .copied()
            .filter(|m| {
                is_member(m)
                    || (m.status.phase == MachinePhase::Releasing
                        && self.observed.alive(&m.metadata.name))
            })
            .collect();
        let via: Vec<&Machine> = owners
            .iter()
            .copied()
            .filter(|m| {
                is_member(m)
                    && m.status.phase == MachinePhase::Running
                    && pool_of(m) == Some(CONTROL_PLANE_POOL)
            })
            .collect();
        apply_nodes(
            &mut self.status,
            &plan_nodes(self.cluster, &owners, &via, self.observed.now),
        );
        super::addons::apply_addons(&mut self.status, self.cluster, &via, self.observed.now);
        super::backup::apply_backup(
            &mut self.status,
            self.cluster,
            &via,
            self.snapshot_before.as_ref(),
            self.observed.now,
        );
        super::drill::apply_drill(
            &mut self.status,
            self.cluster,
            &via,
            self.initialized,
            self.observed.now,
        );
        if let Some(r) = &self.cluster.status.restore {
            let init = self
                .live
                .iter()
                .copied()
                .find(|m| Some(&m.metadata.name) == self.status.init_machine.as_ref());
            super::restore::finish(
                &mut self.status,
                r,
                &self.restore_old,
                init,
                self.initialized,
                self.observed.now,
            );
        }
        set_remediation_condition(&mut self.status, &self.paused);
        set_control_plane_lost(&mut self.status, &self.cluster.metadata.name, self.lost);
        set_removal_condition(&mut self.status, &self.held, self.removal_waits.as_deref());
        let waiting: u32 = self
            .status
            .pools
            .iter()
            .map(|p| p.desired.saturating_sub(p.assigned))
            .sum();
        let msg = if self.lost {
            "no machine is claimed while the control plane is lost".to_string()
        } else if waiting > 0 {
            format!("waiting for {waiting} more matching machine(s) to register in the pool")
        } else {
            String::new()
        };
        set_condition(
            &mut self.status.conditions,
            "MachinesAvailable",
            waiting == 0,
            if waiting == 0 {
                "AllClaimed"
            } else {
                "WaitingForMachines"
            },
            &msg,
        );
        if self.status != self.cluster.status {
            self.steps.push(Step::SetStatus(Box::new(self.status)));
        }
        self.steps
    }
}

/// The condition a pool cluster carries while a control-plane machine that
/// should leave (scale-down, or an operator's request) waits for quorum or
/// for another change to finish.
pub const REMOVAL_CONDITION: &str = "RemovalAllowed";

/// Sets `RemovalAllowed` False while a control plane's removal waits:
/// for etcd quorum (`held`, reason `WaitingForQuorum`) or for a snapshot
/// saved before a scale-down (`snapshot`, reason `WaitingForSnapshot`);
/// removes it when nothing waits.
pub(crate) fn set_removal_condition(
    status: &mut drover_common::api::ClusterStatus,
    held: &[String],
    snapshot: Option<&str>,
) {
    let (reason, message) = match (held.is_empty(), snapshot) {
        (false, _) => ("WaitingForQuorum", held.join("; ")),
        (true, Some(why)) => ("WaitingForSnapshot", why.to_owned()),
        (true, None) => {
            status.conditions.retain(|c| c.type_ != REMOVAL_CONDITION);
            return;
        }
    };
    set_condition(
        &mut status.conditions,
        REMOVAL_CONDITION,
        false,
        reason,
        &message,
    );
}

/// Whether a machine serves its cluster (it is not being released).
fn is_member(m: &Machine) -> bool {
    !matches!(
        m.status.phase,
        MachinePhase::Releasing | MachinePhase::Deleting | MachinePhase::Deleted
    )
}

fn pool_of(m: &Machine) -> Option<&str> {
    m.spec.assignment.as_ref().map(|a| a.machine_pool.as_str())
}

fn replaces(m: &Machine) -> Option<&str> {
    m.spec
        .assignment
        .as_ref()
        .and_then(|a| a.replaces.as_deref())
}

/// Whether the machine's latest release was a remediation (an earlier one
/// of a machine claimed again since does not count).
fn was_remediated(m: &Machine) -> bool {
    m.status
        .events
        .iter()
        .rev()
        .find(|e| matches!(e.reason.as_str(), "Assigned" | "Released" | "Remediating"))
        .is_some_and(|e| e.reason == "Remediating")
}
