//! The receiving side of datagram heartbeats: which machines may send them,
//! with which key, and what each datagram is worth.
//!
//! A machine is offered datagram heartbeats in an HTTPS heartbeat answer
//! (mutual TLS) when nothing waits for it: no directive, not leaving. The
//! offer records, per machine, the key, the digest of the report just
//! accepted and the revision of the machine's stored object; for a running
//! control plane, whose answers carry its cluster's directives, also the
//! revision of its cluster's object. A datagram then counts as a heartbeat
//! when its tag verifies, its counter is fresh, its digest matches and
//! neither stored object has changed since: any change (an assignment, a
//! directive, an operation of the cluster, a deletion, a revoked identity)
//! makes the answer "call me over HTTPS", where every state change goes.
//! What changes elsewhere (a join token the control plane is to register,
//! new coordinator URLs) recalls the machine with [`DatagramTable::recall`]
//! or [`DatagramTable::recall_all`].
//!
//! Nothing here is stored: keys are derived from a master key the replicas
//! share, ids from machine UIDs, and a new leader fills the table from the
//! machines it lists (see [`DatagramTable::fill`]).

use std::collections::HashMap;
use std::sync::Mutex;

use drover_common::api::{Machine, MachinePhase};
use drover_common::wire::datagram::{
    check_fresh, machine_id, peek_id, Answer, Beat, DatagramError, DatagramOffer, Freshness,
    HeartbeatKey, Verdict, ANSWER_LEN,
};

/// Who may send datagram heartbeats, and what each last said.
pub struct DatagramTable {
    master: [u8; 32],
    entries: Mutex<HashMap<u64, Entry>>,
}

/// One machine that may send datagrams.
struct Entry {
    name: Box<str>,
    key: HeartbeatKey,
    /// The counter of the last datagram accepted; when none was, the time
    /// the entry was made less [`NEW_ENTRY_SLACK_MICROS`], so a datagram
    /// captured before cannot be replayed to a new leader.
    last_counter: u64,
    /// The digest of the last report accepted over HTTPS; `None` when this
    /// replica did not see it (it became leader since), in which case the
    /// first authentic datagram's is taken: an agent sends a datagram only
    /// for a report the coordinator accepted.
    digest: Option<[u8; 8]>,
    /// The revision of the stored machine the offer was made at.
    revision: u64,
    /// For a running control plane: its cluster's name and the revision
    /// of the stored cluster the offer was made at.
    cluster: Option<(Box<str>, u64)>,
    /// Whether the machine's last heartbeat was a quiet datagram (not an
    /// HTTPS one, nor a datagram answered "call HTTPS").
    by_datagram: bool,
}

impl Entry {
    /// The entry of machine `name` made at `now_micros`, at its stored
    /// `revision`: no datagram accepted yet, no digest, no cluster.
    fn new(name: &str, key: HeartbeatKey, revision: u64, now_micros: u64) -> Self {
        Self {
            name: name.into(),
            key,
            last_counter: now_micros.saturating_sub(NEW_ENTRY_SLACK_MICROS),
            digest: None,
            revision,
            cluster: None,
            by_datagram: false,
        }
    }
}

/// The revision a recalled entry holds: no stored object is at revision 0,
/// so its next datagram is answered "call HTTPS".
const RECALLED: u64 = 0;

/// How far before an entry was made its first datagram's counter may be
/// (the sender's clock may lag this coordinator's a little).
pub const NEW_ENTRY_SLACK_MICROS: u64 = 5_000_000;

/// Why a datagram was not taken as a heartbeat. Each costs at most one MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a heartbeat datagram (length, magic).
    Malformed(DatagramError),
    /// No machine of this replica's table has the id.
    UnknownMachine,
    /// The tag does not verify under the machine's key: forged or damaged.
    BadTag,
    /// Authentic, but the counter is not fresh.
    Stale(Freshness),
}

impl Refusal {
    /// The `result` label of `drover_heartbeat_datagrams_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::UnknownMachine => "unknown_machine",
            Refusal::BadTag => "bad_tag",
            Refusal::Stale(Freshness::Replayed { .. }) => "replayed",
            Refusal::Stale(Freshness::OutOfWindow { .. }) => "out_of_window",
        }
    }
}

/// The kinds of stored object an offer depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Machine,
    Cluster,
}

/// What the store says of a machine or cluster now, as the table needs it.
pub trait StoredRevision {
    /// The revision of the stored object `name` of `kind`, `None` when it
    /// is gone or not at hand without reading the backend.
    fn revision(&self, kind: Stored, name: &str) -> Option<u64>;
}

impl<F: Fn(Stored, &str) -> Option<u64>> StoredRevision for F {
    fn revision(&self, kind: Stored, name: &str) -> Option<u64> {
        self(kind, name)
    }
}

/// Whether a machine may heartbeat by datagram: in the pool or running its
/// assignment, with nothing asked of it that only an HTTPS answer carries.
pub fn may_use_datagrams(m: &Machine) -> bool {
    let steady = matches!(
        m.status.phase,
        MachinePhase::Registered | MachinePhase::Running
    );
    steady
        && m.status.upgrade.is_none()
        && m.status.identity_revoked_at.is_none()
        && m.metadata.deletion_timestamp.is_none()
        && m.metadata.uid.is_some()
}

/// The cluster whose stored object an offer to `m` depends on: a running
/// control plane's, whose answers carry the cluster's directives.
fn watched_cluster(m: &Machine) -> Option<&str> {
    let a = m.spec.assignment.as_ref()?;
    (m.status.phase == MachinePhase::Running && a.role.is_control_plane())
        .then_some(a.cluster.as_str())
}

impl DatagramTable {
    /// A table whose keys derive from `master`.
    pub fn new(master: [u8; 32]) -> Self {
        Self {
            master,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Offers datagram heartbeats to `machine` (as stored at its
    /// `resourceVersion`), whose accepted report has `digest`, at
    /// `now_micros`. `cluster_revision` is the revision of the stored
    /// cluster the answer was made from, which a running control plane's
    /// offer depends on. `None` when it may not use them.
    pub fn offer(
        &self,
        machine: &Machine,
        cluster_revision: Option<u64>,
        digest: [u8; 8],
        now_micros: u64,
    ) -> Option<DatagramOffer> {
        let cluster = match watched_cluster(machine) {
            Some(name) => cluster_revision.map(|r| Some((Box::from(name), r))),
            None => Some(None),
        };
        let (true, Some(cluster)) = (may_use_datagrams(machine), cluster) else {
            self.forget(machine);
            return None;
        };
        let uid = machine.metadata.uid.as_deref()?;
        let revision = machine.metadata.resource_version.as_deref()?.parse().ok()?;
        let id = machine_id(uid);
        let key = HeartbeatKey::derive(&self.master, uid);
        let mut entries = self.entries.lock().expect("datagram table lock");
        let fresh = || Entry::new(&machine.metadata.name, key.clone(), revision, now_micros);
        let entry = entries.entry(id).or_insert_with(fresh);
        if *entry.name != *machine.metadata.name {
            // Two UIDs whose ids collide (about one pair in 2^64): the
            // newer offer wins, and the other machine's datagrams fail
            // their tag, so it heartbeats over HTTPS.
            tracing::warn!(machine = %machine.metadata.name, other = %entry.name, id, "two machines share a heartbeat id; the other now heartbeats over HTTPS");
            *entry = fresh();
        }
        entry.digest = Some(digest);
        entry.revision = revision;
        entry.cluster = cluster;
        entry.by_datagram = false;
        Some(DatagramOffer::new(id, &key))
    }

    /// Stops taking datagrams of `machine`.
    pub fn forget(&self, machine: &Machine) {
        if let Some(uid) = machine.metadata.uid.as_deref() {
            let id = machine_id(uid);
            let mut entries = self.entries.lock().expect("datagram table lock");
            if entries
                .get(&id)
                .is_some_and(|e| *e.name == *machine.metadata.name)
            {
                entries.remove(&id);
            }
        }
    }

    /// Stops taking datagrams of `machine` (as just written) when its
    /// identity may no longer be used: revoked or marked for deletion.
    /// Every machine write of this replica goes through it, so a revoke or
    /// a deletion mark drops the entry at once; a write made by another
    /// replica is caught by the stored revision `receive` compares.
    ///
    /// Any other change (an assignment, an upgrade, a control-plane role)
    /// keeps the entry: the machine's next datagram no longer matches the
    /// stored revision, so it is answered "call HTTPS" at once and counts
    /// as no heartbeat, and the HTTPS answer carries what changed. Dropping
    /// it would leave that datagram unanswered, and the machine would learn
    /// of its assignment only after its unanswered-datagram fallback.
    pub fn forget_unless_eligible(&self, machine: &Machine) {
        if machine.status.identity_revoked_at.is_some()
            || machine.metadata.deletion_timestamp.is_some()
        {
            self.forget(machine);
        }
    }

    /// Adds the machines that may send datagrams and are not in the table
    /// yet (a replica that becomes leader did not see their offers), at
    /// `now_micros`. A running control plane is added recalled: this
    /// replica has not made the answer its datagrams would stand for.
    pub fn fill(&self, machines: &[Machine], now_micros: u64) {
        let mut entries = self.entries.lock().expect("datagram table lock");
        for m in machines.iter().filter(|m| may_use_datagrams(m)) {
            let (Some(uid), Some(revision)) = (
                m.metadata.uid.as_deref(),
                m.metadata
                    .resource_version
                    .as_deref()
                    .and_then(|r| r.parse().ok()),
            ) else {
                continue;
            };
            let revision = match watched_cluster(m) {
                Some(_) => RECALLED,
                None => revision,
            };
            entries.entry(machine_id(uid)).or_insert_with(|| {
                let key = HeartbeatKey::derive(&self.master, uid);
                Entry::new(&m.metadata.name, key, revision, now_micros)
            });
        }
    }

    /// Asks every machine that heartbeats by datagram to heartbeat over
    /// HTTPS once: its next datagram is answered call-https (and keeps
    /// nothing alive, as for a changed machine) until an HTTPS heartbeat
    /// offers datagrams again. Used when what an HTTPS answer would tell
    /// every machine changed (the coordinator replicas).
    pub fn recall_all(&self) {
        let mut entries = self.entries.lock().expect("datagram table lock");
        for e in entries.values_mut() {
            e.revision = RECALLED;
        }
    }

    /// Asks the machine with UID `machine_uid` to heartbeat over HTTPS
    /// once, as [`DatagramTable::recall_all`] does for every machine: what
    /// its HTTPS answer would tell changed outside its stored object (a
    /// join token it is to register).
    pub fn recall(&self, machine_uid: &str) {
        let mut entries = self.entries.lock().expect("datagram table lock");
        if let Some(e) = entries.get_mut(&machine_id(machine_uid)) {
            e.revision = RECALLED;
        }
    }

    /// How many machines' last heartbeat was a quiet datagram: running
    /// control planes, and the others.
    pub fn by_datagram(&self) -> (u64, u64) {
        let entries = self.entries.lock().expect("datagram table lock");
        entries
            .values()
            .filter(|e| e.by_datagram)
            .fold((0, 0), |(cps, others), e| match e.cluster {
                Some(_) => (cps + 1, others),
                None => (cps, others + 1),
            })
    }

    /// How many machines may send datagrams.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("datagram table lock").len()
    }

    /// Whether no machine may.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Judges one datagram received at `now_micros` (Unix time). An
    /// authentic, fresh one gets an answer; it calls `seen` with the
    /// machine's name only when the machine is still as offered (quiet):
    /// a datagram for a changed, revoked or deleted machine never counts as
    /// a heartbeat. Anything else is refused and gets no answer, so nothing
    /// unauthenticated is ever answered.
    pub fn receive(
        &self,
        datagram: &[u8],
        now_micros: u64,
        store: &impl StoredRevision,
        seen: impl FnOnce(&str),
    ) -> Result<([u8; ANSWER_LEN], Verdict), Refusal> {
        let id = peek_id(datagram).map_err(Refusal::Malformed)?;
        let mut entries = self.entries.lock().expect("datagram table lock");
        let entry = entries.get_mut(&id).ok_or(Refusal::UnknownMachine)?;
        let beat = Beat::decode(datagram, &entry.key).map_err(|e| match e {
            DatagramError::Tag => Refusal::BadTag,
            other => Refusal::Malformed(other),
        })?;
        check_fresh(beat.counter, entry.last_counter, now_micros).map_err(Refusal::Stale)?;
        entry.last_counter = beat.counter;
        let current = store.revision(Stored::Machine, &entry.name);
        let cluster_holds = entry
            .cluster
            .as_ref()
            .is_none_or(|(name, r)| store.revision(Stored::Cluster, name) == Some(*r));
        let digest_holds = match entry.digest {
            Some(d) => d == beat.digest,
            None => {
                entry.digest = Some(beat.digest);
                true
            }
        };
        // Only a datagram for the machine exactly as offered is a
        // heartbeat. One for a machine changed since (revoked, marked for
        // deletion, assigned, deleted, or its cluster changed) keeps
        // nothing alive: it only asks the agent to call over HTTPS, where a
        // revoked or deleted identity is refused.
        let verdict = if current == Some(entry.revision) && cluster_holds && digest_holds {
            seen(&entry.name);
            Verdict::Quiet
        } else {
            Verdict::CallHttps
        };
        entry.by_datagram = verdict == Verdict::Quiet;
        let answer = Answer {
            id,
            counter: beat.counter,
            verdict,
        }
        .encode(&entry.key);
        if current.is_none() {
            // Gone, or no longer at hand: the HTTPS heartbeat finds out
            // which, and offers again if the machine is still there.
            entries.remove(&id);
        }
        Ok((answer, verdict))
    }
}

#[cfg(test)]
mod tests {
    use drover_common::api::{Assignment, MachineRole, MachineSpec, MachineStatus, ObjectMeta};
    use drover_common::wire::datagram::{unix_micros, Answer};

    use super::*;

    const NOW: u64 = 1_800_000_000_000_000;

    fn machine(name: &str, phase: MachinePhase, rev: u64) -> Machine {
        Machine {
            api_version: drover_common::API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: name.into(),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(rev.to_string()),
                ..Default::default()
            },
            spec: MachineSpec::default(),
            status: MachineStatus {
                phase,
                ..Default::default()
            },
        }
    }

    fn beat(offer: &DatagramOffer, counter: u64, digest: [u8; 8]) -> [u8; 52] {
        Beat {
            id: offer.id,
            counter,
            generation: 0,
            digest,
        }
        .encode(&offer.heartbeat_key().unwrap())
    }

    #[test]
    fn a_quiet_machine_is_seen_and_answered_under_its_key() {
        let table = DatagramTable::new([9; 32]);
        let m = machine("m1", MachinePhase::Registered, 5);
        let offer = table.offer(&m, None, *b"digest01", NOW).unwrap();
        let store = |_: Stored, _: &str| Some(5);
        let mut seen = None;
        let (answer, verdict) = table
            .receive(&beat(&offer, NOW, *b"digest01"), NOW, &store, |n| {
                seen = Some(n.to_owned())
            })
            .unwrap();
        assert_eq!(verdict, Verdict::Quiet);
        assert_eq!(seen.as_deref(), Some("m1"));
        let a = Answer::decode(&answer, &offer.heartbeat_key().unwrap()).unwrap();
        assert_eq!(
            (a.id, a.counter, a.verdict),
            (offer.id, NOW, Verdict::Quiet)
        );
    }

    #[test]
    fn forged_replayed_and_unknown_datagrams_are_refused_and_not_seen() {
        let table = DatagramTable::new([9; 32]);
        let m = machine("m1", MachinePhase::Registered, 5);
        let offer = table.offer(&m, None, [1; 8], NOW).unwrap();
        let store = |_: Stored, _: &str| Some(5);
        let never = |n: &str| panic!("{n} was taken as seen");
        // A forged tag: the same datagram under another key.
        let forged = Beat {
            id: offer.id,
            counter: NOW,
            generation: 0,
            digest: [1; 8],
        }
        .encode(&HeartbeatKey::from_bytes([1; 32]));
        assert_eq!(
            table.receive(&forged, NOW, &store, never),
            Err(Refusal::BadTag)
        );
        // Garbage.
        assert!(matches!(
            table.receive(b"hello", NOW, &store, never),
            Err(Refusal::Malformed(_))
        ));
        // An unknown id.
        let stranger = DatagramOffer::new(42, &HeartbeatKey::from_bytes([2; 32]));
        assert_eq!(
            table.receive(&beat(&stranger, NOW, [1; 8]), NOW, &store, never),
            Err(Refusal::UnknownMachine)
        );
        // A replay: accepted once, refused after.
        let genuine = beat(&offer, NOW, [1; 8]);
        assert!(table.receive(&genuine, NOW, &store, |_| {}).is_ok());
        assert_eq!(
            table
                .receive(&genuine, NOW + 1, &store, never)
                .unwrap_err()
                .label(),
            "replayed"
        );
        // A counter far from the clock.
        let old = beat(&offer, NOW + 1 - 120_000_000, [1; 8]);
        assert!(matches!(
            table.receive(&old, NOW + 2, &store, never),
            Err(Refusal::Stale(_))
        ));
        let _ = unix_micros(std::time::SystemTime::now());
    }

    #[test]
    fn any_change_since_the_offer_asks_for_https() {
        let table = DatagramTable::new([9; 32]);
        let m = machine("m1", MachinePhase::Registered, 5);
        let offer = table.offer(&m, None, [1; 8], NOW).unwrap();
        let changes = [
            // The agent's report changed.
            (NOW, [2; 8], Some(5)),
            // The stored machine changed (an assignment, say).
            (NOW + 1, [1; 8], Some(6)),
            // The machine is gone: asked to call, then forgotten.
            (NOW + 2, [1; 8], None),
        ];
        for (at, report, stored) in changes {
            let (_, v) = table
                .receive(
                    &beat(&offer, at, report),
                    NOW,
                    &(move |_: Stored, _: &str| stored),
                    |_| {},
                )
                .unwrap();
            assert_eq!(v, Verdict::CallHttps);
        }
        assert_eq!(
            table.receive(
                &beat(&offer, NOW + 3, [1; 8]),
                NOW,
                &(|_: Stored, _: &str| Some(5)),
                |_| {}
            ),
            Err(Refusal::UnknownMachine)
        );
    }

    #[test]
    fn a_datagram_for_a_changed_revoked_or_deleted_machine_keeps_nothing_alive() {
        let table = DatagramTable::new([9; 32]);
        let m = machine("m1", MachinePhase::Running, 5);
        let offer = table.offer(&m, None, [1; 8], NOW).unwrap();
        let never = |n: &str| panic!("{n} was taken as seen");
        // Changed since the offer (revoked on another replica, say): an
        // answer asks for HTTPS, and the machine is not seen.
        for (i, stored) in [Some(6), None].into_iter().enumerate() {
            let (_, v) = table
                .receive(
                    &beat(&offer, NOW + i as u64, [1; 8]),
                    NOW,
                    &(move |_: Stored, _: &str| stored),
                    never,
                )
                .unwrap();
            assert_eq!(v, Verdict::CallHttps);
        }
        // Revoked or marked for deletion on this replica: the entry goes at
        // once, so later datagrams are not even answered.
        for change in [
            (|m: &mut Machine| m.status.identity_revoked_at = Some(drover_common::now()))
                as fn(&mut Machine),
            |m: &mut Machine| m.metadata.deletion_timestamp = Some(drover_common::now()),
        ] {
            let mut m = machine("m2", MachinePhase::Running, 7);
            let offer = table.offer(&m, None, [1; 8], NOW).unwrap();
            change(&mut m);
            m.metadata.resource_version = Some("8".into());
            table.forget_unless_eligible(&m);
            assert_eq!(
                table.receive(
                    &beat(&offer, NOW + 5, [1; 8]),
                    NOW,
                    &(|_: Stored, _: &str| Some(7)),
                    never
                ),
                Err(Refusal::UnknownMachine)
            );
        }
    }

    /// An assignment as a control plane of cluster `c`.
    fn control_plane_of_c() -> Assignment {
        drover_planner::fixtures::assignment("control-plane", MachineRole::ControlPlane)
    }

    #[test]
    fn a_pool_machine_just_assigned_is_asked_for_https_at_its_next_datagram() {
        let table = DatagramTable::new([9; 32]);
        let mut m = machine("m3", MachinePhase::Registered, 3);
        let offer = table.offer(&m, None, [1; 8], NOW).unwrap();
        // Claimed as a control plane on this replica: no longer eligible,
        // but its identity stands, so its next datagram is answered.
        m.spec.assignment = Some(control_plane_of_c());
        m.status.phase = MachinePhase::Assigned;
        m.metadata.resource_version = Some("4".into());
        assert!(!may_use_datagrams(&m));
        table.forget_unless_eligible(&m);
        let (_, v) = table
            .receive(
                &beat(&offer, NOW + 1, [1; 8]),
                NOW,
                &(|_: Stored, _: &str| Some(4)),
                |n: &str| panic!("{n} was taken as seen"),
            )
            .unwrap();
        assert_eq!(v, Verdict::CallHttps);
        // Its HTTPS heartbeat is offered nothing and drops the entry.
        assert!(table.offer(&m, None, [1; 8], NOW + 2).is_none());
        assert_eq!(
            table.receive(
                &beat(&offer, NOW + 3, [1; 8]),
                NOW,
                &(|_: Stored, _: &str| Some(4)),
                |n: &str| panic!("{n} was taken as seen"),
            ),
            Err(Refusal::UnknownMachine)
        );
    }

    #[test]
    fn only_quiet_machines_are_offered_and_a_new_leader_fills_in() {
        let table = DatagramTable::new([9; 32]);
        let mut cp = machine("cp", MachinePhase::Running, 1);
        cp.spec.assignment = Some(control_plane_of_c());
        // A control plane's offer needs its cluster's revision.
        assert!(table.offer(&cp, None, [0; 8], NOW).is_none());
        let mut worker = cp.clone();
        worker.metadata.name = "w".into();
        worker.metadata.uid = Some("uid-w".into());
        worker.spec.assignment.as_mut().unwrap().role = MachineRole::Worker;
        assert!(table.offer(&worker, None, [0; 8], NOW).is_some());
        let releasing = machine("r", MachinePhase::Releasing, 1);
        assert!(table.offer(&releasing, None, [0; 8], NOW).is_none());
        assert_eq!(table.len(), 1);

        // A new leader knows the machine but not its last digest: it takes
        // the first authentic datagram's, and holds the machine to it.
        let leader = DatagramTable::new([9; 32]);
        leader.fill(&[machine("m1", MachinePhase::Registered, 5), cp], NOW);
        assert_eq!(leader.len(), 2);
        let offer_of = |name: &str| {
            let uid = format!("uid-{name}");
            DatagramOffer::new(machine_id(&uid), &HeartbeatKey::derive(&[9; 32], &uid))
        };
        let offer = offer_of("m1");
        let store = |_: Stored, _: &str| Some(5);
        // A datagram from before it led (captured, replayed) is refused.
        assert!(matches!(
            leader.receive(&beat(&offer, NOW - 6_000_000, [7; 8]), NOW, &store, |_| {}),
            Err(Refusal::Stale(Freshness::Replayed { .. }))
        ));
        let (_, v) = leader
            .receive(&beat(&offer, NOW, [7; 8]), NOW, &store, |_| {})
            .unwrap();
        assert_eq!(v, Verdict::Quiet);
        let (_, v) = leader
            .receive(&beat(&offer, NOW + 1, [8; 8]), NOW, &store, |_| {})
            .unwrap();
        assert_eq!(v, Verdict::CallHttps);
        // The control plane's first datagram to it calls it over HTTPS:
        // this replica has not answered it yet.
        let (_, v) = leader
            .receive(&beat(&offer_of("cp"), NOW, [7; 8]), NOW, &store, |_| {})
            .unwrap();
        assert_eq!(v, Verdict::CallHttps);
    }

    #[test]
    fn a_running_control_plane_is_held_to_its_cluster_as_offered() {
        let table = DatagramTable::new([9; 32]);
        let mut cp = machine("cp", MachinePhase::Running, 3);
        cp.spec.assignment = Some(control_plane_of_c());
        let offer = table.offer(&cp, Some(10), [1; 8], NOW).unwrap();
        let stored = |cluster_revision: u64| {
            move |kind: Stored, _: &str| match kind {
                Stored::Machine => Some(3),
                Stored::Cluster => Some(cluster_revision),
            }
        };
        let verdict = |counter: u64, cluster_revision: u64| {
            let mut seen = false;
            let (_, v) = table
                .receive(
                    &beat(&offer, counter, [1; 8]),
                    NOW,
                    &stored(cluster_revision),
                    |_| seen = true,
                )
                .unwrap();
            assert_eq!(seen, v == Verdict::Quiet);
            v
        };
        assert_eq!(table.by_datagram(), (0, 0));
        assert_eq!(verdict(NOW, 10), Verdict::Quiet);
        assert_eq!(table.by_datagram(), (1, 0));
        // An operation of the cluster began (a snapshot, a renewal): its
        // directive goes in an HTTPS answer.
        assert_eq!(verdict(NOW + 1, 11), Verdict::CallHttps);
        // Offered again from the new cluster, then recalled: a join token
        // waits for it to register.
        table.offer(&cp, Some(11), [1; 8], NOW).unwrap();
        assert_eq!(verdict(NOW + 2, 11), Verdict::Quiet);
        table.recall("uid-cp");
        assert_eq!(verdict(NOW + 3, 11), Verdict::CallHttps);
        assert_eq!(table.by_datagram(), (0, 0));
    }
}
