//! Pool registrations, committed in batches.
//!
//! Every pool registration redeems one use of a registration token: the
//! token's use count and the new machine must commit together, and the count
//! must never pass `maxUses`. Committed one by one, registrations on a
//! token serialize on that token's record (each a compare-and-swap that
//! conflicts with every other in flight) and on one durable commit each (an
//! fsync with SQLite, a quorum round trip with etcd).
//!
//! The registrar instead queues them: one committer takes everything queued
//! while its previous commit was in flight (at most [`MAX_BATCH`]), checks
//! each against its token in order, and commits the token updates and all
//! the machines in one transaction. A storm of N registrations then costs
//! about N / batch commits, and a token's limit is enforced exactly: the
//! registrations past it in a batch are refused, the others commit. Only the
//! committer writes registrations, so the batch conflicts only with an
//! admin's concurrent change to a token, and is then checked again.

use std::collections::HashMap;

use drover_common::api::{Machine, RegistrationToken};
use tokio::sync::{mpsc, oneshot};

use crate::store::{encode, Fence, Kind, Op, Store, StoreError};

/// The most registrations one transaction commits. etcd allows 128
/// operations per transaction: a batch is at most this many machine
/// creates plus one update per token involved.
pub const MAX_BATCH: usize = 64;

/// Registrations waiting for the committer; beyond this, registering
/// requests wait for room (back-pressure instead of unbounded memory).
const QUEUE: usize = 4096;

/// A token keeps the names of this many of the machines that registered
/// with it, the most recent last; each machine's `Registered` event names
/// its token, so the record stays small however often the token is used.
pub const RECENT_MACHINES: usize = 16;

/// One pool registration: the machine to create (its certificate already
/// issued), redeeming one use of `token_id`, whose labels it gets (except
/// where it has its own, such as its pool).
pub struct PoolRegistration {
    pub token_id: String,
    /// The token's UID, as the ticket names it (older tickets do not).
    pub token_uid: Option<String>,
    pub machine: Machine,
    pub now: time::OffsetDateTime,
}

/// The handle the API uses; cheap to clone.
#[derive(Clone)]
pub struct Registrar {
    queue: mpsc::Sender<Pending>,
}

/// Why a registration was refused or not committed. The HTTP edge answers
/// each with its problem document.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The token no longer exists, was revoked or expired.
    #[error("{0}")]
    Unauthorized(String),
    /// Every use the token allows is spent (a replayed ticket).
    #[error("{0}")]
    UsedUp(String),
    /// The generated machine name is taken (about one in two billion).
    #[error("the generated machine name {name} is taken; register again")]
    NameTaken { name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The coordinator is stopping, the batch could not be stored, or the
    /// token kept changing.
    #[error("{0}")]
    Internal(String),
}

struct Pending {
    reg: PoolRegistration,
    /// The leadership term of the request, so the commit is fenced as the
    /// request would have been.
    fence: Option<Fence>,
    reply: oneshot::Sender<Result<(), RegistrationError>>,
}

impl Registrar {
    /// Starts the committer as the driver's `registration-committer` task,
    /// which runs when registrations arrive rather than on a period, each
    /// batch it commits a run.
    pub fn start(store: Store, driver: &crate::tasks::Driver) -> Self {
        let (registrar, rx) = Self::unstarted();
        driver.spawn(
            REGISTRAR_TASK,
            None,
            crate::tasks::Start::AfterPeriod,
            Committer {
                store,
                rx,
                first: None,
            },
        );
        registrar
    }

    /// The handle and the queue its committer reads (for tests that fill
    /// the queue before the committer runs).
    fn unstarted() -> (Self, mpsc::Receiver<Pending>) {
        let (queue, rx) = mpsc::channel(QUEUE);
        (Self { queue }, rx)
    }

    /// Queues a registration and waits for its commit (or refusal).
    pub async fn register(&self, reg: PoolRegistration) -> Result<(), RegistrationError> {
        let (reply, answer) = oneshot::channel();
        let stopped =
            || RegistrationError::Internal("the coordinator is shutting down; retry".into());
        self.queue
            .send(Pending {
                reg,
                fence: crate::store::current_fence(),
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The committer's name in the task set.
pub const REGISTRAR_TASK: &str = "registration-committer";

/// The committer: woken by the first registration queued, it commits it
/// with up to [`MAX_BATCH`] queued behind it.
struct Committer {
    store: Store,
    rx: mpsc::Receiver<Pending>,
    /// The registration that woke it.
    first: Option<Pending>,
}

impl crate::tasks::BackgroundTask for Committer {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        let Some(first) = self.first.take() else {
            return crate::tasks::Outcome::Idle;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match self.rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let store = self.store.clone();
        let size = batch.len();
        // Store writes block; the next batch gathers while this one commits.
        match tokio::task::spawn_blocking(move || commit_by_term(&store, batch)).await {
            Ok(()) => crate::tasks::Outcome::Done,
            Err(e) => {
                // The replies were dropped with the batch: each caller gets
                // "shutting down; retry".
                tracing::error!(error = %e, size, "registration commit panicked");
                crate::tasks::Outcome::Failed(crate::tasks::TaskError::new(format!(
                    "a commit of {size} registrations failed: {e}"
                )))
            }
        }
    }

    /// The next registration queued (mpsc's `recv` is cancel-safe).
    async fn watch(&mut self) {
        match self.rx.recv().await {
            Some(p) => self.first = Some(p),
            None => std::future::pending().await,
        }
    }
}

/// Commits a batch, each leadership term's requests in a transaction fenced
/// by that term (a batch normally holds one term).
fn commit_by_term(store: &Store, batch: Vec<Pending>) {
    let mut by_term: Vec<(Option<Fence>, Vec<Pending>)> = vec![];
    for p in batch {
        match by_term.iter_mut().find(|(f, _)| *f == p.fence) {
            Some((_, group)) => group.push(p),
            None => by_term.push((p.fence, vec![p])),
        }
    }
    for (fence, group) in by_term {
        match fence {
            Some(f) => crate::store::with_fence(f, || commit(store, group)),
            None => commit(store, group),
        }
    }
}

/// Commits one batch: re-checks every token on each attempt and commits
/// what passes in one transaction.
fn commit(store: &Store, mut pending: Vec<Pending>) {
    for _ in 0..16 {
        let mut tokens: HashMap<String, (RegistrationToken, u64)> = HashMap::new();
        let mut accepted: Vec<Pending> = Vec::with_capacity(pending.len());
        for mut p in pending.drain(..) {
            match redeem(store, &mut tokens, &mut p.reg) {
                Ok(()) => accepted.push(p),
                Err(e) => {
                    let _ = p.reply.send(Err(e));
                }
            }
        }
        if accepted.is_empty() {
            return;
        }
        let mut ops: Vec<Op> = tokens
            .iter()
            .map(|(id, (token, rev))| Op::Update {
                kind: Kind::RegistrationToken,
                name: id.clone(),
                body: encode(token),
                expected_revision: Some(*rev),
            })
            .collect();
        ops.extend(accepted.iter().map(|p| Op::Create {
            kind: Kind::Machine,
            name: p.reg.machine.metadata.name.clone(),
            body: encode(&p.reg.machine),
        }));
        match store.txn(ops) {
            Ok(_) => {
                for p in accepted {
                    let _ = p.reply.send(Ok(()));
                }
                return;
            }
            // An admin changed a token meanwhile: check again.
            Err(StoreError::Conflict { .. }) => pending = accepted,
            // A generated name already taken (about one in two billion):
            // that one registration is refused, the rest go again.
            Err(StoreError::AlreadyExists { kind, name }) if kind == Kind::Machine.as_str() => {
                for p in accepted {
                    if p.reg.machine.metadata.name == name {
                        let _ = p
                            .reply
                            .send(Err(RegistrationError::NameTaken { name: name.clone() }));
                    } else {
                        pending.push(p);
                    }
                }
            }
            Err(e) => {
                let detail = e.to_string();
                tracing::error!(error = %detail, size = accepted.len(), "registration batch failed");
                let fenced = matches!(e, StoreError::Fenced { .. });
                for p in accepted {
                    let err = if fenced {
                        // The same answer a fenced single write gets.
                        RegistrationError::Store(StoreError::Fenced {
                            term: p.fence.map_or(0, |f| f.0),
                            detail: detail.clone(),
                        })
                    } else {
                        RegistrationError::Internal(format!(
                            "cannot store the registration: {detail}"
                        ))
                    };
                    let _ = p.reply.send(Err(err));
                }
                return;
            }
        }
    }
    for p in pending {
        let _ = p.reply.send(Err(RegistrationError::Internal(format!(
            "registration token {} kept changing during 16 attempts; retry",
            p.reg.token_id
        ))));
    }
}

/// Checks one registration against its token (read once per attempt) and
/// counts the use.
fn redeem(
    store: &Store,
    tokens: &mut HashMap<String, (RegistrationToken, u64)>,
    reg: &mut PoolRegistration,
) -> Result<(), RegistrationError> {
    let id = &reg.token_id;
    if !tokens.contains_key(id) {
        let found = store
            .get_json::<RegistrationToken>(Kind::RegistrationToken, id)?
            .ok_or_else(|| {
                RegistrationError::Unauthorized(format!(
                    "registration token {id} no longer exists; create a new one with `drover token create`"
                ))
            })?;
        tokens.insert(id.clone(), found);
    }
    let (token, _) = tokens.get_mut(id).expect("inserted above");
    if reg
        .token_uid
        .as_ref()
        .is_some_and(|uid| token.metadata.uid.as_ref() != Some(uid))
    {
        return Err(RegistrationError::Unauthorized(format!(
            "registration token {id} was deleted and made again; this ticket was issued under the one deleted, so mint a new one"
        )));
    }
    if token.spec.revoked {
        return Err(RegistrationError::Unauthorized(format!(
            "registration token {id} was revoked"
        )));
    }
    if token.spec.expires_at <= reg.now {
        return Err(RegistrationError::Unauthorized(format!(
            "registration token {id} expired at {}",
            token.spec.expires_at
        )));
    }
    if token.status.uses >= token.spec.max_uses {
        tracing::warn!(token = %id, hostname = %reg.machine.status.hostname, "replayed ticket refused");
        return Err(RegistrationError::UsedUp(format!(
            "ticket already used: registration token {id} allows {} registration(s) and all were used; create a new token with `drover token create`",
            token.spec.max_uses
        )));
    }
    token.status.uses += 1;
    for (k, v) in &token.spec.labels {
        reg.machine
            .metadata
            .labels
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    let recent = &mut token.status.machines;
    recent.push(reg.machine.metadata.name.clone());
    if recent.len() > RECENT_MACHINES {
        recent.drain(..recent.len() - RECENT_MACHINES);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ApiError;
    use axum::http::StatusCode;
    use drover_common::api::{MachineSpec, MachineStatus, ObjectMeta, RegistrationTokenSpec};

    fn token(max_uses: u32, now: time::OffsetDateTime) -> RegistrationToken {
        RegistrationToken {
            api_version: drover_common::API_VERSION.into(),
            kind: "RegistrationToken".into(),
            metadata: ObjectMeta {
                name: "t1".into(),
                ..Default::default()
            },
            spec: RegistrationTokenSpec {
                pool: "edge".into(),
                labels: [
                    ("rack".to_owned(), "r7".to_owned()),
                    ("drover.dev/pool".to_owned(), "from-token".to_owned()),
                ]
                .into(),
                max_uses,
                expires_at: now + time::Duration::hours(1),
                revoked: false,
            },
            status: Default::default(),
        }
    }

    fn machine(i: usize) -> Machine {
        Machine {
            api_version: drover_common::API_VERSION.into(),
            kind: "Machine".into(),
            metadata: ObjectMeta {
                name: format!("edge-{i:03}"),
                labels: [("drover.dev/pool".to_owned(), "edge".to_owned())].into(),
                ..Default::default()
            },
            spec: MachineSpec {
                bmc: None,
                pool: "edge".into(),
                provider: None,
                assignment: None,
            },
            status: MachineStatus::default(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_storm_commits_in_batches_and_never_passes_max_uses() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("drover.db")).unwrap();
        let now = drover_common::now();
        store
            .create_json(Kind::RegistrationToken, "t1", &token(50, now))
            .unwrap();
        let before = store.txn(vec![]).unwrap();
        let (registrar, rx) = Registrar::unstarted();
        let tasks: Vec<_> = (0..80)
            .map(|i| {
                let registrar = registrar.clone();
                tokio::spawn(async move {
                    registrar
                        .register(PoolRegistration {
                            token_id: "t1".into(),
                            token_uid: None,
                            machine: machine(i),
                            now,
                        })
                        .await
                })
            })
            .collect();
        // Every registration is queued before the committer starts, so the
        // batches are exactly MAX_BATCH and the rest.
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while QUEUE - registrar.queue.capacity() < 80 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("80 registrations queued");
        let driver = crate::tasks::Driver::default();
        driver.spawn(
            REGISTRAR_TASK,
            None,
            crate::tasks::Start::AfterPeriod,
            Committer {
                store: store.clone(),
                rx,
                first: None,
            },
        );
        let mut ok = 0;
        let mut used_up = 0;
        for t in tasks {
            match t.await.unwrap().map_err(ApiError::from) {
                Ok(()) => ok += 1,
                Err(e) if e.status == StatusCode::CONFLICT => {
                    assert!(e.detail.contains("ticket already used"), "{}", e.detail);
                    used_up += 1;
                }
                Err(e) => panic!("unexpected refusal: {} {}", e.status, e.detail),
            }
        }
        assert_eq!((ok, used_up), (50, 30));
        let (t, _) = store
            .get_json::<RegistrationToken>(Kind::RegistrationToken, "t1")
            .unwrap()
            .unwrap();
        assert_eq!(t.status.uses, 50);
        assert_eq!(t.status.machines.len(), RECENT_MACHINES);
        let machines = store.list_json::<Machine>(Kind::Machine).unwrap();
        assert_eq!(machines.len(), 50);
        for (m, _) in &machines {
            // The token's labels join the machine's; its own pool label stays.
            assert_eq!(m.metadata.labels["rack"], "r7");
            assert_eq!(m.metadata.labels["drover.dev/pool"], "edge");
        }
        // The first batch (MAX_BATCH) holds every accepted registration in
        // one transaction; the second is all refusals and commits nothing.
        // Each commit advances the revision by one.
        let commits = store.txn(vec![]).unwrap() - before - 1;
        assert_eq!(commits, 1, "80 registrations, 50 accepted");
    }

    #[tokio::test]
    async fn a_revoked_token_refuses_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("drover.db")).unwrap();
        let now = drover_common::now();
        let mut t = token(5, now);
        t.spec.revoked = true;
        store
            .create_json(Kind::RegistrationToken, "t1", &t)
            .unwrap();
        let driver = crate::tasks::Driver::default();
        let registrar = Registrar::start(store.clone(), &driver);
        for (n, token_id, says) in [(1, "t1", "revoked"), (2, "nope", "no longer exists")] {
            let err = registrar
                .register(PoolRegistration {
                    token_id: token_id.into(),
                    token_uid: None,
                    machine: machine(n),
                    now,
                })
                .await
                .map_err(ApiError::from)
                .unwrap_err();
            assert_eq!(err.status, StatusCode::UNAUTHORIZED, "{token_id}");
            assert!(err.detail.contains(says), "{token_id}: {}", err.detail);
        }
        assert!(store.list(Kind::Machine).unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_ticket_of_a_deleted_token_does_not_work_for_one_made_again_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("drover.db")).unwrap();
        let now = drover_common::now();
        let mut t = token(5, now);
        t.metadata.uid = Some("uid-now".into());
        store
            .create_json(Kind::RegistrationToken, "t1", &t)
            .unwrap();
        let driver = crate::tasks::Driver::default();
        let registrar = Registrar::start(store.clone(), &driver);
        let register = |n, uid: &str| {
            registrar.register(PoolRegistration {
                token_id: "t1".into(),
                token_uid: Some(uid.into()),
                machine: machine(n),
                now,
            })
        };
        let err = register(1, "uid-before")
            .await
            .map_err(ApiError::from)
            .unwrap_err();
        assert_eq!(err.status, StatusCode::UNAUTHORIZED);
        assert!(
            err.detail.contains("deleted and made again"),
            "{}",
            err.detail
        );
        assert!(store.list(Kind::Machine).unwrap().is_empty());
        // The token's own tickets work.
        register(2, "uid-now").await.unwrap();
        assert_eq!(store.list(Kind::Machine).unwrap().len(), 1);
    }
}
