//! Objects the planners' unit tests share.

use drover_common::api::{Assignment, Cluster, Machine, MachineRole};
use time::OffsetDateTime;

/// The tests' "now".
pub fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

/// An assignment to the tests' cluster `c` (uid `cu`).
pub fn assignment(pool: &str, role: MachineRole) -> Assignment {
    Assignment {
        cluster: "c".into(),
        cluster_uid: "cu".into(),
        machine_pool: pool.into(),
        role,
        generation: 1,
        assigned_at: None,
        replaces: None,
        kubernetes_version: None,
        image: None,
    }
}

/// A Running machine of cluster `c` whose host name is its name.
pub fn running(name: &str, pool: &str, role: MachineRole) -> Machine {
    let mut m: Machine = serde_json::from_value(serde_json::json!({
        "apiVersion": drover_common::API_VERSION,
        "kind": "Machine",
        "metadata": {"name": name, "uid": format!("{name}-uid")},
        "spec": {},
        "status": {"phase": "Running", "hostname": name},
    }))
    .unwrap();
    m.spec.assignment = Some(assignment(pool, role));
    m
}

/// Cluster `c` (uid `cu`) at `version`, with `control_planes`, a worker
/// pool `w` of `workers`, `provider` (its JSON) and a 30 s settle time.
pub fn cluster(
    version: &str,
    control_planes: u32,
    workers: u32,
    provider: serde_json::Value,
) -> Cluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": drover_common::API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": "c", "uid": "cu", "generation": 2},
        "spec": {
            "kubernetesVersion": version,
            "controlPlane": {"replicas": control_planes},
            "workerPools": [{"name": "w", "replicas": workers}],
            "provider": provider,
            "upgrade": {"settleTime": "30s"},
        },
    }))
    .unwrap()
}
