//! The tables of `drover get` (and `drover token list`), which the
//! Kubernetes-style API serves as `Table` responses too: one function per
//! kind, a header row then one row per object; `wide` adds columns (a
//! `Table`'s priority-1 columns). What machines report is left as it is:
//! the CLI escapes it when it prints.

use drover_common::api::{Cluster, Machine, RegistrationToken, SecretInfo, Snapshot};

use drover_common::wire::ProbeState;

use crate::types::age;

/// The rows of a table so far: its header, the `wide_columns` after the
/// others when `wide`.
fn header(columns: &[&str], wide_columns: &[&str], wide: bool) -> Vec<Vec<String>> {
    let shown = if wide { wide_columns } else { &[] };
    vec![columns.iter().chain(shown).map(|c| c.to_string()).collect()]
}

pub(crate) fn secrets_table(list: &[SecretInfo], _wide: bool) -> Vec<Vec<String>> {
    let mut rows = header(&["NAME", "KEYS", "BYTES", "AGE"], &[], false);
    for s in list {
        rows.push(vec![
            s.metadata.name.clone(),
            s.keys
                .iter()
                .map(|k| k.key.as_str())
                .collect::<Vec<_>>()
                .join(","),
            s.keys.iter().map(|k| k.bytes).sum::<usize>().to_string(),
            age(s.metadata.creation_timestamp),
        ]);
    }
    rows
}

/// A size in bytes as people read it (KiB, MiB, GiB; powers of 1024).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

pub(crate) fn snapshots_table(list: &[Snapshot], wide: bool) -> Vec<Vec<String>> {
    let columns = [
        "NAME", "CLUSTER", "AGE", "SIZE", "REVISION", "VERSION", "TRIGGER",
    ];
    let mut rows = header(&columns, &["MACHINE", "ETCD", "SHA256"], wide);
    for s in list {
        let mut row = vec![
            s.metadata.name.clone(),
            s.spec.cluster.clone(),
            age(Some(s.status.saved_at)),
            bytes(s.status.size),
            s.status.revision.to_string(),
            s.spec.kubernetes_version.clone(),
            s.spec.trigger.to_string(),
        ];
        if wide {
            row.push(s.spec.machine.clone());
            row.push(s.status.etcd_version.clone());
            row.push(s.status.sha256.clone());
        }
        rows.push(row);
    }
    rows
}

pub(crate) fn tasks_table(list: &[crate::types::TaskStatus], _wide: bool) -> Vec<Vec<String>> {
    let columns = ["NAME", "PERIOD", "LAST RUN", "LAST ERROR", "NEXT RUN"];
    let mut rows = header(&columns, &[], false);
    for t in list {
        rows.push(vec![
            t.name.clone(),
            format!("{:?}", std::time::Duration::from_millis(t.period_millis)),
            match t.last_run_started {
                Some(_) => format!("{} ago ({} runs)", age(t.last_run_started), t.runs),
                None => "-".into(),
            },
            t.last_error.clone().unwrap_or_else(|| "-".into()),
            match (t.queue, t.next_run) {
                (Some(q), _) => format!(
                    "queue: {} ready, {} running, {} waiting (last waited {} ms)",
                    q.ready, q.processing, q.delayed, q.last_wait_millis
                ),
                (None, Some(next)) => {
                    let s = (next - drover_common::now()).whole_seconds().max(0);
                    format!("in {s}s")
                }
                (None, None) => "now".into(),
            },
        ]);
    }
    rows
}

pub(crate) fn coordinators_table(
    list: &[crate::types::CoordinatorEntry],
    _wide: bool,
) -> Vec<Vec<String>> {
    let mut rows = header(&["ID", "ROLE", "URL", "VERSION", "AGE"], &[], false);
    for c in list {
        rows.push(vec![
            c.replica.id.clone(),
            if c.leader { "leader" } else { "follower" }.into(),
            c.replica.url.clone(),
            c.replica.version.clone(),
            age(Some(c.replica.started_at)),
        ]);
    }
    rows
}

pub(crate) fn clusters_table(list: &[Cluster], wide: bool) -> Vec<Vec<String>> {
    let columns = [
        "NAME",
        "PHASE",
        "VERSION",
        "CONTROL-PLANE",
        "WORKERS",
        "ENDPOINT",
        "AGE",
    ];
    let mut rows = header(&columns, &["PROVIDER", "GENERATION"], wide);
    for c in list {
        let cp = c
            .status
            .pools
            .iter()
            .find(|p| p.name == drover_common::api::CONTROL_PLANE_POOL);
        let (wr, wd) = c
            .status
            .pools
            .iter()
            .filter(|p| p.name != drover_common::api::CONTROL_PLANE_POOL)
            .fold((0, 0), |(r, d), p| (r + p.running, d + p.desired));
        let wd = if c.status.pools.is_empty() {
            c.spec.worker_pools.iter().map(|p| p.replicas).sum()
        } else {
            wd
        };
        let phase = if c.metadata.deletion_timestamp.is_some() {
            "Deleting".to_string()
        } else {
            c.status.phase.to_string()
        };
        let mut row = vec![
            c.metadata.name.clone(),
            phase,
            c.spec.kubernetes_version.clone(),
            format!(
                "{}/{}",
                cp.map(|p| p.running).unwrap_or(0),
                c.spec.control_plane.replicas
            ),
            format!("{wr}/{wd}"),
            c.status
                .control_plane_endpoint
                .clone()
                .unwrap_or_else(|| "-".into()),
            age(c.metadata.creation_timestamp),
        ];
        if wide {
            row.push(c.spec.provider.name().into());
            row.push(c.metadata.generation.to_string());
        }
        rows.push(row);
    }
    rows
}

pub(crate) fn machines_table(list: &[Machine], wide: bool) -> Vec<Vec<String>> {
    machines_rows(list, wide, &Default::default())
}

/// The machines table; `kubelets` holds each Node's kubelet version by
/// (cluster, Node name).
pub(crate) fn machines_rows(
    list: &[Machine],
    wide: bool,
    kubelets: &std::collections::HashMap<(String, String), String>,
) -> Vec<Vec<String>> {
    let columns = [
        "NAME",
        "CLUSTER",
        "POOL",
        "ROLE",
        "PHASE",
        "ADDRESS",
        "HEARTBEAT",
        "HEALTH",
        "AGE",
    ];
    let wide_columns = [
        "HOSTNAME",
        "REG-POOL",
        "GENERATION",
        "AGENT",
        "MADE-FOR",
        "KUBEADM",
        "KUBELET",
        "UID",
    ];
    let mut rows = header(&columns, &wide_columns, wide);
    for m in list {
        let a = m.spec.assignment.as_ref();
        let mut row = vec![
            m.metadata.name.clone(),
            a.map(|a| a.cluster.clone()).unwrap_or_else(|| "-".into()),
            a.map(|a| a.machine_pool.clone())
                .unwrap_or_else(|| "-".into()),
            a.map(|a| a.role.to_string()).unwrap_or_else(|| "-".into()),
            m.status.phase.to_string(),
            m.status
                .addresses
                .first()
                .cloned()
                .unwrap_or_else(|| "-".into()),
            age(m.status.last_heartbeat_time),
            health_summary(m),
            age(m.metadata.creation_timestamp),
        ];
        if wide {
            row.extend([
                m.status.hostname.clone(),
                m.spec.pool.clone(),
                a.map(|a| a.generation.to_string())
                    .unwrap_or_else(|| "-".into()),
                m.status.agent_version.clone(),
                a.and_then(|a| a.kubernetes_version.clone())
                    .unwrap_or_else(|| "-".into()),
                if m.status.kubeadm_version.is_empty() {
                    "-".into()
                } else {
                    m.status.kubeadm_version.clone()
                },
                a.and_then(|a| kubelets.get(&(a.cluster.clone(), m.status.hostname.clone())))
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
                m.metadata.uid.clone().unwrap_or_default(),
            ]);
        }
        rows.push(row);
    }
    rows
}

pub(crate) fn tokens_table(list: &[RegistrationToken], _wide: bool) -> Vec<Vec<String>> {
    let columns = ["NAME", "POOL", "USES", "EXPIRES", "REVOKED", "LABELS"];
    let mut rows = header(&columns, &[], false);
    for t in list {
        rows.push(vec![
            t.metadata.name.clone(),
            t.spec.pool.clone(),
            format!("{}/{}", t.status.uses, t.spec.max_uses),
            t.spec
                .expires_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            t.spec.revoked.to_string(),
            t.spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    rows
}

/// A one-word summary of a machine's health.
pub fn health_summary(m: &Machine) -> String {
    use drover_common::api::MachinePhase;
    // A deleted machine has no health; a silent or stopped one is not
    // healthy, whatever its last report said.
    if matches!(
        m.status.phase,
        MachinePhase::Deleting | MachinePhase::Deleted
    ) {
        return "-".into();
    }
    if let Some(c) = m
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::types::ALIVE_CONDITION && c.status == "False")
    {
        return c.reason.clone();
    }
    let Some(h) = &m.status.health else {
        return "-".into();
    };
    let mut bad = vec![];
    let mut unknown = true;
    if h.kubelet.state != ProbeState::Unknown {
        unknown = false;
    }
    if h.kubelet.state == ProbeState::Unhealthy {
        bad.push("kubelet");
    }
    if let Some(a) = &h.api_server {
        if a.state != ProbeState::Unknown {
            unknown = false;
        }
        if a.state == ProbeState::Unhealthy {
            bad.push("apiserver");
        }
    }
    if !bad.is_empty() {
        format!("Unhealthy({})", bad.join(","))
    } else if unknown {
        "Unknown".into()
    } else {
        "Healthy".into()
    }
}
