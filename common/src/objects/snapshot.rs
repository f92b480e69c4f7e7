//! Etcd snapshots of a cluster: the spec's schedule and retention
//! (`spec.backup`), the snapshot asked of a control plane (on the
//! cluster's status until it is saved or fails), and the `Snapshot` record
//! of one saved.
//!
//! Invariant: a `Snapshot` record exists only for a snapshot whose sealed
//! file was received whole (its size and SHA-256 as the machine reported
//! them); a snapshot that failed leaves its error on the cluster's status,
//! never a record.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::meta::ObjectMeta;
use super::operations::operation_id;
use crate::units::parse_duration;

/// `spec.backup`: etcd snapshots on a schedule, and how many are kept.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupSpec {
    /// How often a snapshot is taken (`1h`, `30m`; at least `1m`). Unset:
    /// only on demand (`drover backup cluster`).
    pub every: Option<String>,
    /// Which snapshots are kept; older ones are deleted.
    #[serde(default)]
    pub keep: Retention,
    /// Whether a snapshot is saved before every upgrade of the control
    /// plane and every control-plane scale-down, which wait for it. Unset:
    /// yes. `false` lets them go ahead without one (when etcd cannot be
    /// snapshotted and the change must happen anyway).
    pub before_changes: Option<bool>,
    /// Where the sealed snapshots go. Unset: the coordinator keeps them
    /// (under `DATA_DIR/snapshots/`).
    pub destination: Option<BackupDestination>,
    /// Restore drills on a schedule: the newest snapshot restored into a
    /// new cluster `<name>-drill`, inventoried, then deleted
    /// (`status.lastDrill`). Unset: only on demand (`drover restore
    /// cluster NAME --into NEW`).
    pub drill: Option<DrillSchedule>,
}

/// `spec.backup.drill`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrillSchedule {
    /// How often (`24h`, `168h`; at least `10m`), counted from the last
    /// drill's start, or from the cluster's creation.
    pub every: String,
}

/// The shortest `spec.backup.drill.every`: a drill makes a whole cluster.
pub const MIN_DRILL_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// `spec.backup.destination`: somewhere other than the coordinator.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupDestination {
    /// An S3 bucket (or an S3-compatible store's): the machine uploads
    /// through a URL the coordinator presigns for that one object, so no
    /// machine holds storage credentials; the coordinator's own AWS
    /// credentials (its environment, profile or instance role) sign it.
    pub s3: Option<S3Destination>,
}

/// An S3 bucket that holds a cluster's sealed snapshots, as
/// `<prefix><cluster UID>/<snapshot>.drvsnap`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct S3Destination {
    pub bucket: String,
    /// Prepended to every object key (`prod/`). Unset: none.
    pub prefix: Option<String>,
    /// The bucket's region. Unset: `us-east-1`.
    pub region: Option<String>,
    /// An S3-compatible store's URL (`https://minio.example:9000`), reached
    /// with path-style addressing. Unset: AWS S3 (or `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
}

impl S3Destination {
    /// The region its requests are signed for.
    pub fn region(&self) -> &str {
        self.region.as_deref().unwrap_or("us-east-1")
    }

    /// Where snapshot `name` of the cluster with UID `uid` goes.
    pub fn object(&self, uid: &str, name: &str) -> S3Object {
        S3Object {
            bucket: self.bucket.clone(),
            key: format!(
                "{}{uid}/{name}.drvsnap",
                self.prefix.as_deref().unwrap_or_default()
            ),
            region: self.region().to_owned(),
            endpoint: self.endpoint.clone(),
        }
    }

    /// Every problem of it, by field.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![];
        let b = &self.bucket;
        // S3's bucket naming rules (docs.aws.amazon.com/AmazonS3/latest/
        // userguide/bucketnamingrules.html), without the rules for
        // reserved prefixes and suffixes.
        let chars_ok = b
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-');
        let ends_ok = b.bytes().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && b.bytes().last().is_some_and(|c| c.is_ascii_alphanumeric());
        if !(3..=63).contains(&b.len()) || !chars_ok || !ends_ok || b.contains("..") {
            out.push((
                "spec.backup.destination.s3.bucket",
                format!("{b:?} is not an S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit"),
            ));
        }
        if let Some(p) = &self.prefix {
            if p.starts_with('/') || p.len() > 512 || p.chars().any(char::is_control) {
                out.push((
                    "spec.backup.destination.s3.prefix",
                    format!("{p:?} must not start with '/', hold control characters or be longer than 512 bytes"),
                ));
            }
        }
        if let Some(r) = &self.region {
            let ok = !r.is_empty()
                && r.len() <= 32
                && r.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
            if !ok {
                out.push((
                    "spec.backup.destination.s3.region",
                    format!("{r:?} is not a region name (e.g. eu-west-1)"),
                ));
            }
        }
        if let Some(e) = &self.endpoint {
            let scheme_ok = e.starts_with("https://") || e.starts_with("http://");
            let host = e.split_once("://").map(|(_, h)| h).unwrap_or_default();
            if !scheme_ok || host.is_empty() || host.contains(['?', '#', ' ']) {
                out.push((
                    "spec.backup.destination.s3.endpoint",
                    format!("{e:?} is not an http(s) URL of an S3-compatible store"),
                ));
            }
        }
        out
    }
}

/// One object of an S3 bucket, with what it takes to reach it: a snapshot
/// keeps where it went, so a later change of the cluster's destination
/// does not lose it.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct S3Object {
    pub bucket: String,
    pub key: String,
    pub region: String,
    pub endpoint: Option<String>,
}

impl std::fmt::Display for S3Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// Which of a cluster's snapshots are kept: the newest `last`, and the
/// newest of each of the last `daily` days (UTC) that has one. A snapshot
/// either rule keeps stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retention {
    #[serde(default = "default_last")]
    pub last: u32,
    #[serde(default = "default_daily")]
    pub daily: u32,
}

fn default_last() -> u32 {
    24
}

fn default_daily() -> u32 {
    7
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            last: default_last(),
            daily: default_daily(),
        }
    }
}

/// The shortest schedule.
pub const MIN_BACKUP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl BackupSpec {
    /// Whether a cluster with `spec` saves a snapshot before each risky
    /// change: it has a `backup` and did not turn this off.
    pub fn before_changes(spec: Option<&BackupSpec>) -> bool {
        spec.is_some_and(|b| b.before_changes != Some(false))
    }

    /// The drill schedule (validated at apply), if any.
    pub fn drill_every(spec: Option<&BackupSpec>) -> Option<std::time::Duration> {
        spec.and_then(|b| b.drill.as_ref())
            .and_then(|d| parse_duration(&d.every).ok())
    }

    /// The snapshot schedule (validated at apply), if any.
    pub fn every(spec: Option<&BackupSpec>) -> Option<std::time::Duration> {
        spec.and_then(|b| b.every.as_deref())
            .and_then(|t| parse_duration(t).ok())
    }

    /// Every problem of the spec, by field under `spec.backup`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![];
        if let Some(t) = &self.every {
            match parse_duration(t) {
                Ok(d) if d < MIN_BACKUP_EVERY => out.push((
                    "spec.backup.every",
                    format!("must be at least 1m, got {t:?}"),
                )),
                Ok(_) => {}
                Err(e) => out.push(("spec.backup.every", e.to_string())),
            }
        }
        if let Some(s3) = self.destination.as_ref().and_then(|d| d.s3.as_ref()) {
            out.extend(s3.problems());
        }
        if let Some(d) = &self.drill {
            match parse_duration(&d.every) {
                Ok(t) if t < MIN_DRILL_EVERY => out.push((
                    "spec.backup.drill.every",
                    format!("must be at least 10m, got {:?}", d.every),
                )),
                Ok(_) => {}
                Err(e) => out.push(("spec.backup.drill.every", e.to_string())),
            }
        }
        if self.keep.last == 0 {
            out.push((
                "spec.backup.keep.last",
                "must be at least 1: the newest snapshot is always kept".into(),
            ));
        }
        out
    }
}

/// Why a snapshot was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum SnapshotTrigger {
    /// `spec.backup.every` came round.
    #[default]
    Scheduled,
    /// `drover backup cluster` asked for it.
    Manual,
    /// Before the control plane's upgrade to a new version or image.
    BeforeUpgrade,
    /// Before a control plane is removed for a lower `replicas`.
    BeforeScaleDown,
}

impl std::fmt::Display for SnapshotTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotTrigger::Scheduled => "Scheduled",
            SnapshotTrigger::Manual => "Manual",
            SnapshotTrigger::BeforeUpgrade => "BeforeUpgrade",
            SnapshotTrigger::BeforeScaleDown => "BeforeScaleDown",
        })
    }
}

/// The snapshot asked of one running control plane, on the cluster's
/// status until the machine reports it saved (then `lastSnapshot` names
/// it) or failed (then its error stays until it is asked again).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotSave {
    /// The snapshot's name: `<cluster>-<yyyymmdd>-<hhmmss>`.
    pub name: String,
    /// The machine asked to save it.
    pub via: String,
    pub trigger: SnapshotTrigger,
    /// The change it is taken before (`upgrade to v1.31.2`), which waits
    /// for it; once it is saved the status's `snapshotTakenBefore` names
    /// it.
    pub before: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub requested_at: time::OffsetDateTime,
    /// When it failed and why, as the machine reported it (or as the
    /// coordinator judged it: too long, the machine gone).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub failed_at: Option<time::OffsetDateTime>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The id prefix of snapshot directives.
pub const SNAPSHOT_PREFIX: &str = "etcd-snapshot-";

impl SnapshotSave {
    /// The id of the directive that carries this request.
    pub fn directive_id(&self) -> String {
        operation_id(SNAPSHOT_PREFIX, Some(&self.name), self.requested_at)
    }

    /// Whether it is still waited for.
    pub fn under_way(&self) -> bool {
        self.failed_at.is_none()
    }
}

/// The name of the snapshot of `cluster` asked for at `at`.
pub fn snapshot_name(cluster: &str, at: time::OffsetDateTime) -> String {
    format!(
        "{cluster}-{:04}{:02}{:02}-{:02}{:02}{:02}",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// The newest snapshot saved of a cluster, on its status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotRef {
    pub name: String,
    #[serde(with = "time::serde::rfc3339")]
    pub saved_at: time::OffsetDateTime,
    pub revision: i64,
    /// Unsealed, in bytes.
    pub size: u64,
}

/// A saved etcd snapshot of a cluster (`drover get snapshots`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Snapshot {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: SnapshotSpec,
    pub status: SnapshotStatus,
}

/// What a snapshot is of and why it was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotSpec {
    pub cluster: String,
    /// The UID of the cluster it was taken of: a restore refuses another's.
    pub cluster_uid: String,
    pub trigger: SnapshotTrigger,
    /// The cluster's Kubernetes version when it was taken.
    pub kubernetes_version: String,
    /// The control-plane machine that saved it.
    pub machine: String,
    /// Where the sealed file is: `coordinator`, or `s3://bucket/key`.
    pub destination: String,
    /// The S3 object it went to, when it went to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Object>,
}

/// What was saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotStatus {
    #[serde(with = "time::serde::rfc3339")]
    pub saved_at: time::OffsetDateTime,
    /// The etcd revision it holds.
    pub revision: i64,
    /// Unsealed, in bytes.
    pub size: u64,
    /// SHA-256 of the unsealed snapshot (hex).
    pub sha256: String,
    /// The sealed file's size and SHA-256 (hex).
    pub sealed_size: u64,
    pub sealed_sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub etcd_version: String,
}

/// The condition that says whether a cluster's snapshots are current: False
/// when the last one asked failed (reason `SnapshotFailed`) or when none was
/// saved within twice `spec.backup.every` (reason `SnapshotLate`).
pub const SNAPSHOTS_CURRENT_CONDITION: &str = "SnapshotsCurrent";

/// Which of a cluster's snapshots (name and when saved) `keep` lets go:
/// all but the newest `last` and the newest of each of the `daily` most
/// recent days (UTC) that have one.
pub fn to_prune(saved: &[(String, time::OffsetDateTime)], keep: &Retention) -> Vec<String> {
    let mut newest_first: Vec<&(String, time::OffsetDateTime)> = saved.iter().collect();
    newest_first.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let mut kept = std::collections::BTreeSet::new();
    for (name, _) in newest_first.iter().take(keep.last.max(1) as usize) {
        kept.insert(name.as_str());
    }
    let mut days = std::collections::BTreeSet::new();
    for (name, at) in &newest_first {
        if days.len() >= keep.daily as usize {
            break;
        }
        if days.insert(at.date()) {
            kept.insert(name.as_str());
        }
    }
    newest_first
        .iter()
        .filter(|(name, _)| !kept.contains(name.as_str()))
        .map(|(name, _)| name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_keeps_the_newest_and_one_a_day() {
        let start = time::macros::datetime!(2026-11-20 00:30 UTC);
        // Every 6 hours for 8 days: 32 snapshots, 4 a day.
        let saved: Vec<(String, time::OffsetDateTime)> = (0..32)
            .map(|i| {
                let at = start + time::Duration::hours(6 * i);
                (snapshot_name("c", at), at)
            })
            .collect();
        let gone = to_prune(&saved, &Retention { last: 6, daily: 7 });
        let kept: Vec<&String> = saved
            .iter()
            .map(|(n, _)| n)
            .filter(|n| !gone.contains(n))
            .collect();
        // The newest 6 (the last day and a half), then the newest of each
        // of the 7 newest days: days 27-28 are among the 6; 5 more days.
        assert_eq!(kept.len(), 6 + 5, "{kept:?}");
        assert!(kept.contains(&&saved[31].0) && kept.contains(&&saved[26].0));
        assert!(
            !kept.contains(&&saved[25].0),
            "beyond the newest 6, a day keeps only its newest"
        );
        assert!(kept.contains(&&saved[23].0) && kept.contains(&&saved[7].0));
        assert!(!kept.contains(&&saved[3].0), "the 8th day back goes");
        // One snapshot is never pruned, whatever the rules.
        assert!(to_prune(&saved[..1], &Retention { last: 1, daily: 0 }).is_empty());
    }

    #[test]
    fn a_backup_spec_round_trips_and_says_what_is_wrong() {
        let spec: BackupSpec = serde_saphyr::from_str("every: 1h\n").unwrap();
        assert_eq!(spec.keep, Retention { last: 24, daily: 7 });
        assert_eq!(
            BackupSpec::every(Some(&spec)),
            Some(std::time::Duration::from_secs(3600))
        );
        assert!(spec.problems().is_empty());
        let bad = BackupSpec {
            every: Some("10s".into()),
            keep: Retention { last: 0, daily: 1 },
            before_changes: None,
            destination: None,
            drill: Some(DrillSchedule { every: "5m".into() }),
        };
        let problems = bad.problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
        let drill = problems
            .iter()
            .find(|p| p.0 == "spec.backup.drill.every")
            .unwrap_or_else(|| panic!("{problems:?}"));
        assert!(drill.1.contains("at least 10m"), "{problems:?}");
        let drilled: BackupSpec = serde_saphyr::from_str("drill:\n  every: 24h\n").unwrap();
        assert!(drilled.problems().is_empty());
        assert_eq!(
            BackupSpec::drill_every(Some(&drilled)),
            Some(std::time::Duration::from_secs(86400))
        );
        // An S3 destination: every field checked, the object key made of
        // the prefix, the cluster's UID and the snapshot's name.
        let s3: BackupSpec = serde_saphyr::from_str(
            "destination:\n  s3:\n    bucket: drover-snaps\n    prefix: prod/\n    endpoint: http://127.0.0.1:5000\n",
        )
        .unwrap();
        assert!(s3.problems().is_empty(), "{:?}", s3.problems());
        let dest = s3.destination.unwrap().s3.unwrap();
        let object = dest.object("u1", "c-20261128-010000");
        assert_eq!(object.key, "prod/u1/c-20261128-010000.drvsnap");
        assert_eq!(object.region, "us-east-1");
        assert_eq!(
            object.to_string(),
            "s3://drover-snaps/prod/u1/c-20261128-010000.drvsnap"
        );
        let bad: BackupSpec = serde_saphyr::from_str(
            "destination:\n  s3:\n    bucket: Bad_Bucket\n    prefix: /abs\n    region: EU\n    endpoint: ftp://x\n",
        )
        .unwrap();
        let fields: Vec<&str> = bad.problems().iter().map(|p| p.0).collect();
        assert_eq!(
            fields,
            [
                "spec.backup.destination.s3.bucket",
                "spec.backup.destination.s3.prefix",
                "spec.backup.destination.s3.region",
                "spec.backup.destination.s3.endpoint"
            ]
        );
        assert!(problems[0].1.contains("at least 1m"));
        assert!(serde_saphyr::from_str::<BackupSpec>("evry: 1h\n").is_err());
        let at = time::macros::datetime!(2026-11-28 00:15:03 UTC);
        assert_eq!(snapshot_name("prod", at), "prod-20261128-001503");
    }
}
