//! The texts of `drover describe` (a machine, a cluster, a secret) and the
//! lines of `drover rollout status`.

use drover_common::api::{Cluster, Machine, SecretInfo};

use crate::cli::render::{age, health_summary, printable, rfc3339};

/// One line per pool of a cluster's rollout, or that none is under way.
pub fn rollout_lines(c: &Cluster) -> Vec<String> {
    if c.status.observed_generation < c.metadata.generation {
        return vec![format!(
            "the coordinator has not planned generation {} yet",
            c.metadata.generation
        )];
    }
    let Some(r) = &c.status.rollout else {
        return vec![format!(
            "no rollout: every machine is at {}",
            c.spec.kubernetes_version
        )];
    };
    let verb = if c.spec.provider.creates_machines() {
        "replace"
    } else {
        "upgrade"
    };
    let mut out: Vec<String> = r
        .pools
        .iter()
        .map(|p| {
            format!(
                "{}: {}/{} at {}{}",
                p.name,
                p.updated,
                p.desired,
                r.version,
                if p.outdated > 0 {
                    format!(", {} to {verb}", p.outdated)
                } else {
                    String::new()
                }
            )
        })
        .collect();
    if let Some(u) = &c.status.machine_upgrade {
        out.push(format!(
            "upgrading {} in place ({}): {} since {}{}",
            u.machine,
            u.command,
            u.step,
            rfc3339(u.requested_at),
            match &u.result {
                Some(r) if !r.ok => format!(" (failed: {})", printable(&r.message)),
                _ => String::new(),
            }
        ));
    }
    if let Some(w) = &r.waiting_for {
        out.push(format!("waiting for {}", printable(w)));
    }
    for f in &r.failures {
        out.push(format!(
            "new machine {} failed (step {}): {}",
            f.machine,
            f.step,
            printable(&f.reason)
        ));
    }
    if let Some(h) = &r.halted {
        out.push(format!(
            "HALTED at machine {} (step {}): {}; `drover rollout resume {}` to go on",
            h.machine,
            h.step,
            printable(&h.reason),
            c.metadata.name
        ));
    }
    out
}

/// The text of `drover describe machine`.
pub fn describe_machine(m: &Machine) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let s = &m.status;
    let _ = writeln!(o, "Name:           {}", m.metadata.name);
    let _ = writeln!(
        o,
        "UID:            {}",
        m.metadata.uid.as_deref().unwrap_or("-")
    );
    let _ = writeln!(o, "Registered in:  pool {}", m.spec.pool);
    let labels: Vec<String> = m
        .metadata
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(o, "Labels:         {}", labels.join(","));
    match &m.spec.assignment {
        Some(a) => {
            let _ = writeln!(
                o,
                "Cluster:        {} (pool {}, generation {})",
                a.cluster, a.machine_pool, a.generation
            );
            let _ = writeln!(o, "Role:           {}", a.role);
        }
        None => {
            let _ = writeln!(o, "Cluster:        - (unassigned)");
        }
    }
    let _ = writeln!(o, "Phase:          {}", s.phase);
    let _ = writeln!(o, "Hostname:       {}", printable(&s.hostname));
    let _ = writeln!(o, "Addresses:      {}", s.addresses.join(", "));
    let _ = writeln!(o, "API port:       {}", s.api_server_port);
    let _ = writeln!(o, "Agent version:  {}", printable(&s.agent_version));
    if !s.kubeadm_version.is_empty() {
        let _ = writeln!(o, "kubeadm:        {}", printable(&s.kubeadm_version));
    }
    if let Some(v) = m
        .spec
        .assignment
        .as_ref()
        .and_then(|a| a.kubernetes_version.as_deref())
    {
        let _ = writeln!(o, "Made for:       {}", printable(v));
    }
    let _ = writeln!(o, "Last heartbeat: {} ago", age(s.last_heartbeat_time));
    if let Some(r) = &s.reboot {
        let outcome = match (&r.failed, r.completed_at, r.started_at) {
            (Some(e), _, _) => format!("failed: {}", printable(e)),
            (None, Some(t), _) => format!("back {} ago", age(Some(t))),
            (None, None, Some(_)) => "rebooting".to_owned(),
            (None, None, None) => "asked, not answered yet".to_owned(),
        };
        let _ = writeln!(
            o,
            "Reboot:         {} ({}) asked {} ago: {outcome}",
            printable(&r.id),
            match r.method {
                drover_common::api::RebootMethod::Agent => "by its agent",
                drover_common::api::RebootMethod::PowerCycle => "power cycle by its BMC",
            },
            age(Some(r.requested_at))
        );
    }
    if let Some(b) = &m.spec.bmc {
        let _ = writeln!(
            o,
            "BMC:            {}{} (credentials in Secret {})",
            printable(&b.url),
            b.system
                .as_deref()
                .map(|s| format!(" system {}", printable(s)))
                .unwrap_or_default(),
            printable(&b.credentials_secret)
        );
    }
    if let Some(why) = &s.heartbeat_fallback {
        let _ = writeln!(o, "Heartbeats:     over HTTPS: {}", printable(why));
    }
    if let Some(c) = &s.certificates {
        let _ = writeln!(
            o,
            "kubeadm certs:  first expires {} ({})",
            rfc3339(c.expires_at),
            printable(&c.certificate)
        );
    }
    if let Some(t) = s.certificate_not_after {
        let _ = writeln!(o, "Certificate:    valid until {t}");
    }
    if let Some(t) = s.identity_revoked_at {
        let _ = writeln!(
            o,
            "Identity:       revoked at {t}; its certificates are refused"
        );
    }
    let _ = writeln!(o, "Health:         {}", health_summary(m));
    if let Some(h) = &s.health {
        let _ = writeln!(
            o,
            "  kubelet:      {:?} {}",
            h.kubelet.state,
            printable(&h.kubelet.message)
        );
        if let Some(a) = &h.api_server {
            let _ = writeln!(o, "  apiserver:    {:?} {}", a.state, printable(&a.message));
        }
        let _ = writeln!(
            o,
            "  disk free:    {} MiB",
            h.disk_free_bytes / (1024 * 1024)
        );
    }
    if let Some(b) = &s.bootstrap {
        let _ = writeln!(o, "Bootstrap:      step {}", printable(&b.step));
        if let Some(f) = &b.failure {
            let _ = writeln!(o, "  failed at:    {}", f.at);
            let _ = writeln!(o, "  command:      {}", printable(&f.command));
            let _ = writeln!(
                o,
                "  exit code:    {}",
                f.exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "none (did not run or was killed)".into())
            );
            let _ = writeln!(o, "  output (last {} lines):", f.output_tail.len());
            for l in &f.output_tail {
                let _ = writeln!(o, "    | {}", printable(l));
            }
        }
    }
    if let Some(p) = &s.provider_id {
        let _ = writeln!(
            o,
            "Provider ID:    {} ({})",
            p,
            m.spec.provider.as_deref().unwrap_or("-")
        );
    }
    if let Some(cluster) = m.spec.assignment.as_ref().map(|a| a.cluster.as_str()) {
        let node = s.node_provider_id.clone().unwrap_or_else(|| {
            drover_common::kubeadm::drover_provider_id(cluster, &m.metadata.name)
        });
        let _ = writeln!(o, "Node provider:  {node}");
    }
    if !s.conditions.is_empty() {
        let _ = writeln!(o, "Conditions:");
        for c in &s.conditions {
            let _ = writeln!(
                o,
                "  {} = {} since {} ({}) {}",
                c.type_,
                c.status,
                c.last_transition_time
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                c.reason,
                printable(&c.message)
            );
        }
    }
    if !s.events.is_empty() {
        let _ = writeln!(o, "Events:");
        for e in &s.events {
            let _ = writeln!(
                o,
                "  {:>6} ago  {:<16} {}",
                age(Some(e.time)),
                e.reason,
                printable(&e.message)
            );
        }
    }
    o
}

/// ` (failed, retrying: ERROR)` after a step under way, or nothing when
/// it did not fail.
fn failed_retrying(error: &str) -> String {
    if error.is_empty() {
        String::new()
    } else {
        format!(" (failed, retrying: {})", printable(error))
    }
}

/// The control plane of `c` whose kubeadm certificate expires first, and
/// that certificate.
fn earliest_certificates<'m>(
    c: &Cluster,
    machines: &'m [Machine],
) -> Option<(&'m Machine, &'m drover_common::api::CertificateExpiry)> {
    drover_planner::machines_of(c, machines)
        .into_iter()
        .filter_map(|m| Some((m, m.status.certificates.as_ref()?)))
        .min_by_key(|(_, c)| c.expires_at)
}

/// Who owns worker pool `pool`'s `replicas` in `c`'s managedFields (the
/// FieldsV1 tree `f:spec` / `f:workerPools` / `k:{"name":...}` /
/// `f:replicas`), and since when.
fn replicas_setter(c: &Cluster, pool: &str) -> Option<(String, String)> {
    let key = format!("k:{}", serde_json::json!({ "name": pool }));
    c.metadata
        .managed_fields
        .iter()
        .find(|e| {
            e.fields_v1["f:spec"]["f:workerPools"][key.as_str()]
                .get("f:replicas")
                .is_some()
        })
        .map(|e| {
            (
                e.manager.clone(),
                e.time
                    .map(|t| format!(" at {}", rfc3339(t)))
                    .unwrap_or_default(),
            )
        })
}

pub(crate) fn describe_cluster(c: &Cluster, machines: &[Machine]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "Name:           {}", c.metadata.name);
    let _ = writeln!(
        o,
        "UID:            {}",
        c.metadata.uid.as_deref().unwrap_or("-")
    );
    let _ = writeln!(o, "Version:        {}", c.spec.kubernetes_version);
    let _ = writeln!(o, "Provider:       {}", c.spec.provider.name());
    let _ = writeln!(o, "Phase:          {}", c.status.phase);
    let _ = writeln!(
        o,
        "Endpoint:       {}{}",
        c.status.control_plane_endpoint.as_deref().unwrap_or("-"),
        match c.status.endpoint_ready {
            Some(true) => " (/readyz ok)",
            Some(false) => " (/readyz does not answer)",
            None => "",
        }
    );
    if let Some(lb) = &c.status.load_balancer {
        let backends = if lb.backends.is_empty() {
            "none yet".to_owned()
        } else {
            lb.backends.join(", ")
        };
        let _ = writeln!(o, "Load balancer:  {} -> {backends}", lb.id);
    }
    if c.status.rollout.is_some() {
        for (i, line) in rollout_lines(c).iter().enumerate() {
            let head = if i == 0 { "Rollout:" } else { "" };
            let _ = writeln!(o, "{head:<16}{line}");
        }
    }
    let _ = writeln!(
        o,
        "Init machine:   {}",
        c.status.init_machine.as_deref().unwrap_or("-")
    );
    if let Some(v) = &c.status.kubeadm_config_version {
        let _ = writeln!(o, "kubeadm-config: kubernetesVersion {}", printable(v));
    }
    if let Some(u) = &c.status.version_update {
        let _ = writeln!(
            o,
            "Config update:  to {} through {}{}",
            printable(&u.version),
            printable(&u.via),
            failed_retrying(&u.error)
        );
    }
    if let Some(u) = &c.status.essential_addons {
        let _ = match u.done_at {
            Some(at) => writeln!(
                o,
                "kube-proxy/DNS: at {}'s images since {}",
                printable(&u.version),
                rfc3339(at)
            ),
            None => writeln!(
                o,
                "kube-proxy/DNS: upgrading to {}'s images through {}{}",
                printable(&u.version),
                printable(&u.via),
                failed_retrying(&u.error)
            ),
        };
    }
    if let Some(r) = &c.status.certificate_renewal {
        let _ = writeln!(
            o,
            "Cert renewal:   {} ({}){}",
            printable(&r.machine),
            printable(&r.reason),
            if r.error.is_empty() {
                String::new()
            } else {
                format!(" failed, retrying: {}", printable(&r.error))
            }
        );
    }
    if let Some((m, c)) = earliest_certificates(c, machines) {
        let _ = writeln!(
            o,
            "Certificates:   first expires {} ({} of {})",
            rfc3339(c.expires_at),
            printable(&c.certificate),
            m.metadata.name
        );
    }
    let _ = writeln!(o, "Pools:");
    for p in &c.status.pools {
        let autoscaled = c
            .spec
            .worker_pools
            .iter()
            .find(|w| w.name == p.name)
            .and_then(|w| w.autoscaling)
            .map(|a| {
                let setter = replicas_setter(c, &p.name)
                    .map(|(who, at)| format!(", replicas set by {who}{at}"))
                    .unwrap_or_default();
                format!(
                    ", autoscaled {}..{}{setter}",
                    a.min_replicas, a.max_replicas
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "├─ {}: {}/{} running, {} assigned{autoscaled}",
            p.name, p.running, p.desired, p.assigned
        );
        let uid = c.metadata.uid.as_deref();
        for m in machines.iter().filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| Some(a.cluster_uid.as_str()) == uid && a.machine_pool == p.name)
        }) {
            let _ = writeln!(
                o,
                "│   └─ {} {} {} {}",
                m.metadata.name,
                m.spec
                    .assignment
                    .as_ref()
                    .map(|a| a.role.to_string())
                    .unwrap_or_default(),
                m.status.phase,
                health_summary(m)
            );
        }
    }
    if !c.status.etcd_members.is_empty() {
        let _ = writeln!(
            o,
            "etcd members:   (reported by {} at {})",
            printable(c.status.etcd_reported_by.as_deref().unwrap_or("-")),
            c.status
                .etcd_reported_at
                .map_or_else(|| "-".into(), rfc3339)
        );
        for m in &c.status.etcd_members {
            let _ = writeln!(
                o,
                "  {:<16} {:<20} {:<9} {:<9} {}",
                printable(&m.id),
                printable(if m.name.is_empty() {
                    "(unstarted)"
                } else {
                    &m.name
                }),
                match (m.started, m.is_learner) {
                    (_, true) => "learner",
                    (true, false) => "started",
                    (false, false) => "unstarted",
                },
                if m.healthy { "healthy" } else { "unhealthy" },
                printable(&m.peer_urls.join(","))
            );
        }
    }
    if !c.status.nodes.is_empty() {
        let _ = writeln!(o, "Nodes:");
        for n in &c.status.nodes {
            let _ = writeln!(
                o,
                "  {:<24} Ready={}{}",
                printable(&n.name),
                printable(&n.ready),
                if n.unschedulable { " (cordoned)" } else { "" }
            );
        }
    }
    if let Some(d) = &c.status.drain {
        let state = match &d.result {
            None => "under way".to_owned(),
            Some(r) if r.ok => format!("done: {}", r.message),
            Some(r) => format!("refused, retrying: {}", r.message),
        };
        let _ = writeln!(
            o,
            "Drain:          Node {} of machine {} through {}, since {}: {}",
            printable(&d.node),
            printable(&d.machine),
            printable(&d.via),
            d.started_at,
            printable(&state)
        );
    }
    if let Some(r) = &c.status.node_removal {
        let _ = writeln!(
            o,
            "Node removal:   {} through {} (its machine left)",
            printable(&r.node),
            printable(&r.via)
        );
    }
    if let Some(r) = &c.status.etcd_removal {
        let _ = writeln!(
            o,
            "etcd removal:   member {} ({}) through {}: {}",
            printable(&r.id),
            printable(&r.name),
            printable(&r.via),
            printable(&r.reason)
        );
    }
    describe_snapshots(&mut o, c);
    if !c.status.addons.is_empty() {
        let _ = writeln!(o, "Addons:");
        for (i, a) in c.status.addons.iter().enumerate() {
            let mode = c
                .spec
                .addons
                .iter()
                .find(|s| s.name == a.name)
                .map_or("?".to_owned(), |s| format!("{:?}", s.mode));
            let hash = &a.hash[..a.hash.len().min(12)];
            let state = match a.phase {
                drover_common::api::AddonPhase::Applied => format!(
                    "Applied sha256:{hash} at {}",
                    a.applied_at.map(|t| t.to_string()).unwrap_or_default()
                ),
                drover_common::api::AddonPhase::Failed => format!(
                    "Failed ({} attempts) sha256:{hash}: {}",
                    a.failures,
                    printable(&a.message)
                ),
                drover_common::api::AddonPhase::Pending => "Pending".to_owned(),
            };
            let _ = writeln!(o, "  {}. {} ({mode}): {state}", i + 1, printable(&a.name));
        }
        if let Some(r) = &c.status.addon_apply {
            let _ = writeln!(
                o,
                "  applying {} through {} since {}",
                printable(&r.addon),
                printable(&r.via),
                r.requested_at
            );
        }
    }
    if !c.status.conditions.is_empty() {
        let _ = writeln!(o, "Conditions:");
        for cd in &c.status.conditions {
            let _ = writeln!(
                o,
                "  {} = {} ({}) {}",
                cd.type_, cd.status, cd.reason, cd.message
            );
        }
    }
    o
}

/// `drover describe secret NAME`: its keys and sizes, and the files of
/// clusters that read it.
pub(crate) fn describe_secret(s: &SecretInfo, clusters: &[Cluster]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "Name:        {}", s.metadata.name);
    let _ = writeln!(
        out,
        "Created:     {} ago",
        age(s.metadata.creation_timestamp)
    );
    let _ = writeln!(out, "Generation:  {}", s.metadata.generation);
    let _ = writeln!(out, "Keys:");
    for k in &s.keys {
        let _ = writeln!(out, "  {:<24} {} bytes", k.key, k.bytes);
    }
    let _ = writeln!(out, "Read by:");
    let mut any = false;
    for c in clusters {
        for (field, r) in c.spec.secret_refs() {
            if r.secret == s.metadata.name {
                any = true;
                let _ = writeln!(out, "  cluster {} {field} (key {})", c.metadata.name, r.key);
            }
        }
    }
    if !any {
        let _ = writeln!(out, "  no cluster");
    }
    out
}

/// The cluster's etcd snapshots: the schedule, the last one saved, the one
/// asked or its failure.
fn describe_snapshots(o: &mut String, c: &Cluster) {
    use std::fmt::Write;
    let s = &c.status;
    let every = c.spec.backup.as_ref().and_then(|b| b.every.as_deref());
    if every.is_none()
        && s.last_snapshot.is_none()
        && s.snapshot.is_none()
        && s.restore.is_none()
        && s.last_restore.is_none()
        && s.drill.is_none()
        && s.last_drill.is_none()
        && s.drill_of.is_none()
    {
        return;
    }
    let _ = writeln!(
        o,
        "Snapshots:      {}",
        match every {
            Some(e) => format!("every {}", printable(e)),
            None => "on demand (`drover backup cluster`)".to_owned(),
        }
    );
    if let Some(l) = &s.last_snapshot {
        let _ = writeln!(
            o,
            "  last saved:   {} at {} (etcd revision {}, {} bytes)",
            printable(&l.name),
            l.saved_at,
            l.revision,
            l.size
        );
    }
    match &s.snapshot {
        Some(op) if op.under_way() => {
            let _ = writeln!(
                o,
                "  saving:       {} on {} since {}",
                printable(&op.name),
                printable(&op.via),
                op.requested_at
            );
        }
        Some(op) => {
            let _ = writeln!(
                o,
                "  failed:       {} on {}: {}",
                printable(&op.name),
                printable(&op.via),
                printable(&op.error)
            );
        }
        None => {}
    }
    if let Some(r) = &s.restore {
        let _ = writeln!(
            o,
            "  restoring:    {} (etcd revision {}) since {}{}",
            printable(&r.snapshot),
            r.revision,
            r.requested_at,
            r.machine
                .as_ref()
                .map(|m| format!(" onto {}", printable(m)))
                .unwrap_or_default()
        );
    }
    if let Some(r) = &s.last_restore {
        let _ = writeln!(
            o,
            "  restored:     {} (etcd revision {}) by {} at {}",
            printable(&r.snapshot),
            r.revision,
            printable(&r.machine),
            r.completed_at
        );
    }
    describe_drills(o, c);
}

/// The restore drills of the cluster (`drilling`, `last drill`), or the
/// one it is (`drill of`).
fn describe_drills(o: &mut String, c: &Cluster) {
    use std::fmt::Write;
    let s = &c.status;
    if let Some(every) = c
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.drill.as_ref())
        .map(|d| d.every.as_str())
    {
        let _ = writeln!(o, "  drills:       every {}", printable(every));
    }
    if let Some(d) = &s.drill {
        let _ = writeln!(
            o,
            "  drilling:     {} into cluster {} since {} ({})",
            printable(&d.snapshot),
            printable(&d.cluster),
            d.started_at,
            d.trigger
        );
    }
    if let Some(d) = &s.last_drill {
        let _ = writeln!(
            o,
            "  last drill:   {} at {} ({}): {}",
            if d.ok { "passed" } else { "FAILED" },
            d.completed_at,
            d.trigger,
            printable(&d.message)
        );
        if let Some(i) = &d.inventory {
            let _ = writeln!(
                o,
                "    namespaces: {}",
                i.namespaces
                    .iter()
                    .map(|n| printable(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let Some(d) = &s.drill_of {
        let stage = match (&d.failed, &d.inventory) {
            (Some(why), _) => format!("failed: {}", printable(why)),
            (None, Some(i)) if i.result.is_some() => "inventory taken".to_owned(),
            (None, Some(i)) => format!("inventory asked of {}", printable(&i.via)),
            (None, None) => "restoring".to_owned(),
        };
        let _ = writeln!(
            o,
            "  drill of:     cluster {}, snapshot {} since {}: {stage}",
            printable(&d.source.cluster),
            printable(&d.snapshot),
            d.started_at
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::api::{
        DrillDone, DrillOf, DrillTrigger, DrillUnderWay, Inventory, InventoryAsk, RestoreSource,
    };

    /// A cluster drilled shows the drill under way and the last one, with
    /// what it found; a drill cluster shows what it drills and how far.
    #[test]
    fn drills_are_described_on_both_clusters() {
        let at = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let mut c = drover_planner::fixtures::docker_cluster(1, 0);
        c.status.drill = Some(DrillUnderWay {
            cluster: "c-drill".into(),
            snapshot: "c-1".into(),
            trigger: DrillTrigger::Scheduled,
            started_at: at,
        });
        c.status.last_drill = Some(DrillDone {
            cluster: "c-drill".into(),
            snapshot: "c-0".into(),
            revision: 5,
            trigger: DrillTrigger::Manual,
            started_at: at,
            completed_at: at,
            ok: true,
            message: "restored into c-drill".into(),
            inventory: Some(Inventory {
                namespaces: vec!["default".into(), "kept".into()],
                ..Default::default()
            }),
        });
        let text = describe_cluster(&c, &[]);
        assert!(
            text.contains("drilling:     c-1 into cluster c-drill since")
                && text.contains("(scheduled)"),
            "{text}"
        );
        assert!(
            text.contains("last drill:   passed at") && text.contains("restored into c-drill"),
            "{text}"
        );
        assert!(text.contains("namespaces: default, kept"), "{text}");

        let mut d = drover_planner::fixtures::docker_cluster(1, 0);
        d.status.drill_of = Some(DrillOf {
            source: RestoreSource {
                cluster: "c".into(),
                uid: "cu".into(),
            },
            snapshot: "c-1".into(),
            revision: 5,
            trigger: DrillTrigger::Manual,
            started_at: at,
            inventory: Some(InventoryAsk {
                via: "n".into(),
                requested_at: at,
                result: None,
                error: None,
            }),
            failed: None,
        });
        let text = describe_cluster(&d, &[]);
        assert!(
            text.contains("drill of:     cluster c, snapshot c-1 since")
                && text.contains("inventory asked of n"),
            "{text}"
        );
    }
}
