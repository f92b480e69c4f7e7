//! Leadership: which replica runs the reconcile loops, holds the heartbeat
//! deadlines and answers the machine API.
//!
//! On SQLite the one replica always leads (term 0). On etcd every replica
//! campaigns for a leader key bound to its own lease of `--leader-lease`;
//! the one that creates the key leads until its lease ends, and the key's
//! create revision is its term. Everything the leader writes on behalf of
//! leadership (a reconcile pass, a machine API request) runs inside
//! [`crate::store::fenced`] with that term, so etcd commits it only while
//! the term is current: a leader paused past its lease that wakes up late
//! has its writes refused before it notices it was deposed.
//!
//! The leader steps down when it cannot renew its lease for a whole TTL,
//! when the lease has expired, or when the leader key names another term;
//! a new leader forgets every heartbeat deadline and gives every machine a
//! fresh grace period, since machines were heartbeating to the old leader.

use std::sync::Arc;
use std::time::Duration;

use crate::app::App;
use crate::domain::leadership::Role;
use crate::domain::replicas::{MachineUrls, REPLICA_RETENTION};
use crate::store::{Election, Fence};
use crate::types::ReplicaInfo;

/// The `leader-election` task (etcd stores only). Each run renews the
/// lease when it is due (every third of its TTL) — or gets a new one when
/// it was lost — then campaigns as a follower or checks the leader key as
/// the leader. A follower runs every tenth of the TTL (a cheap compare in
/// etcd), so it takes over within about a tenth of the TTL of the old
/// lease expiring. On shutdown a leader resigns, so another replica takes
/// over at once instead of after the lease.
pub struct LeaderElection {
    app: Arc<App>,
    election: Election,
    ttl: Duration,
    /// This replica's record, as announced.
    value: Vec<u8>,
    /// This replica among the known ones (see `REPLICA_RETENTION`).
    known: Known,
    lease: Option<Held>,
}

/// A lease this replica holds.
struct Held {
    id: i64,
    /// When it was last renewed (or asked for: it is safe to count on
    /// from before it was asked for).
    renewed: tokio::time::Instant,
    next_renewal: tokio::time::Instant,
}

impl LeaderElection {
    pub fn new(app: Arc<App>, election: Election, ttl: Duration) -> Self {
        let value = serde_json::to_vec(&app.leadership.me).expect("replica info serializes");
        Self {
            app,
            election,
            ttl,
            value,
            known: Known::default(),
            lease: None,
        }
    }

    /// The lease is renewed every third of its TTL.
    fn renewal_period(&self) -> Duration {
        self.ttl / 3
    }

    /// Renews the lease if it is due; drops it (stepping down) when it
    /// expired or could not be renewed for a whole TTL.
    async fn renew_if_due(&mut self) {
        let Some(held) = &mut self.lease else { return };
        if tokio::time::Instant::now() < held.next_renewal {
            return;
        }
        self.known
            .renew(&self.election, &self.app.leadership.me.id, &self.value)
            .await;
        let before = tokio::time::Instant::now();
        held.next_renewal = before + self.ttl / 3;
        match self.election.keep_alive(held.id).await {
            Ok(left) if !left.is_zero() => held.renewed = before,
            Ok(_) => {
                self.lose_lease("its lease expired");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot renew the leadership lease"),
        }
        if held.renewed.elapsed() >= self.ttl {
            self.lose_lease("its lease could not be renewed within its TTL");
        }
    }

    fn lose_lease(&mut self, why: &str) {
        if self.app.leadership.term().is_some() {
            step_down(&self.app, why);
        }
        self.lease = None;
    }

    /// Gets a lease and announces this replica under it.
    async fn acquire(&mut self) -> Result<(), crate::store::StoreError> {
        let asked = tokio::time::Instant::now();
        let id = self.election.grant(self.ttl).await.inspect_err(|e| {
            tracing::warn!(error = %e, "cannot get a leadership lease; retrying");
        })?;
        self.lease = Some(Held {
            id,
            renewed: asked,
            next_renewal: asked + self.renewal_period(),
        });
        if let Err(e) = self
            .election
            .announce(&self.app.leadership.me.id, self.value.clone(), id)
            .await
        {
            tracing::warn!(error = %e, "cannot announce this coordinator");
        }
        self.known
            .renew(&self.election, &self.app.leadership.me.id, &self.value)
            .await;
        Ok(())
    }
}

impl crate::tasks::BackgroundTask for LeaderElection {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        self.renew_if_due().await;
        if self.lease.is_none() {
            if let Err(e) = self.acquire().await {
                return crate::tasks::Outcome::Failed(crate::tasks::TaskError::new(format!(
                    "cannot get a leadership lease: {e}"
                )));
            }
        }
        let lease = self.lease.as_ref().map(|h| h.id).expect("a lease is held");
        let app = &self.app;
        match app.leadership.term() {
            None => match self.election.campaign(lease, self.value.clone()).await {
                Ok(Ok(term)) => become_leader(app, term),
                Ok(Err(leader)) => app.leadership.set(Role::Follower {
                    leader: serde_json::from_slice(&leader).ok(),
                }),
                Err(e) => tracing::warn!(error = %e, "campaign failed"),
            },
            Some(term) => match self.election.leader().await {
                Ok(Some((_, t))) if t == term => {}
                Ok(Some((_, t))) => step_down(app, &format!("term {} began", t.0)),
                Ok(None) => step_down(app, "the leader key is gone"),
                Err(e) => tracing::warn!(error = %e, "cannot read the leader key"),
            },
        }
        if app.leadership.term().is_some() {
            refresh_machine_urls(app).await;
        }
        crate::tasks::Outcome::Done
    }

    /// A leader (and a replica without a lease) comes back at the next
    /// renewal; a follower far more often, to campaign.
    fn next_wait(&self, _: Option<Duration>) -> Option<Duration> {
        if self.lease.is_none() || self.app.leadership.term().is_some() {
            Some(self.renewal_period())
        } else {
            Some((self.ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)))
        }
    }

    async fn stop(&mut self) {
        let Some(held) = self.lease.take() else {
            return;
        };
        if self.app.leadership.term().is_some() {
            step_down(&self.app, "shutting down");
        }
        if let Err(e) = self.election.resign(held.id).await {
            tracing::warn!(error = %e, "cannot resign the lease; it expires by itself");
        }
    }
}

fn become_leader(app: &App, term: Fence) {
    // The role change also wakes `provisioner::run_gateway_listeners`, so
    // machines of docker clusters reach this replica on their network's
    // gateway before their grace period ends.
    // Machines heartbeated to the old leader: every deadline starts afresh.
    app.fleet.liveness.lock().expect("liveness lock").clear();
    app.grant_grace_to_all();
    let now = drover_common::now();
    app.leadership.set(Role::Leader { term, since: now });
    tracing::info!(term = term.0, id = %app.leadership.me.id, "this coordinator leads; every machine gets a fresh grace period");
    app.reconcile_soon();
}

/// This replica's registration among the known replicas, under a lease
/// of [`REPLICA_RETENTION`] renewed every minute while it runs.
#[derive(Default)]
struct Known {
    lease: Option<i64>,
    renewed: Option<tokio::time::Instant>,
}

/// How often the known registration is renewed.
const KNOWN_RENEWAL: Duration = Duration::from_secs(60);

impl Known {
    async fn renew(&mut self, election: &Election, id: &str, value: &[u8]) {
        if self.renewed.is_some_and(|at| at.elapsed() < KNOWN_RENEWAL) {
            return;
        }
        let alive = match self.lease {
            Some(lease) => match election.keep_alive(lease).await {
                Ok(left) => !left.is_zero(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew this coordinator's registration among the known replicas");
                    return;
                }
            },
            None => false,
        };
        if !alive {
            match election
                .remember(id, value.to_vec(), REPLICA_RETENTION)
                .await
            {
                Ok(lease) => self.lease = Some(lease),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot register this coordinator among the known replicas");
                    return;
                }
            }
        }
        self.renewed = Some(tokio::time::Instant::now());
    }
}

/// Reads the registry and sets the coordinator URLs machines are told
/// (keeping the last ones when it cannot be read). When they changed, every
/// machine heartbeating by datagram is asked to heartbeat over HTTPS, whose
/// answer names the new list.
async fn refresh_machine_urls(app: &App) {
    let replicas = match known_replicas(app).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the coordinator replicas; machines keep being told the last list");
            return;
        }
    };
    let urls = MachineUrls::compute(&app.leadership.me, &app.settings.advertise_urls, &replicas);
    let (docker, advertised) = (
        urls.docker.as_ref().map(|l| l.urls.clone()),
        urls.advertised.as_ref().map(|l| l.urls.clone()),
    );
    if app.leadership.machine_urls.set(Some(urls)) {
        app.fleet.datagrams.recall_all();
        tracing::info!(
            ?docker,
            ?advertised,
            "the coordinator URLs machines are told changed"
        );
    }
}

fn step_down(app: &App, why: &str) {
    app.leadership.set(Role::Follower { leader: None });
    app.leadership.machine_urls.set(None);
    app.fleet.liveness.lock().expect("liveness lock").clear();
    tracing::warn!(id = %app.leadership.me.id, reason = why, "this coordinator no longer leads");
}

/// Every known replica: registered now, or down for less than
/// [`REPLICA_RETENTION`] (it may lead again), by id; this replica alone on
/// SQLite.
pub async fn known_replicas(app: &App) -> Result<Vec<ReplicaInfo>, crate::store::StoreError> {
    let Some(election) = app.store.election() else {
        return Ok(vec![app.leadership.me.clone()]);
    };
    let parse = |v: Vec<Vec<u8>>| -> Vec<ReplicaInfo> {
        v.iter()
            .filter_map(|v| serde_json::from_slice(v).ok())
            .collect()
    };
    // The live registration wins: a replica from before the known
    // registry is only there.
    let mut list = parse(election.replicas().await?);
    for r in parse(election.known_replicas().await?) {
        if !list.iter().any(|l| l.id == r.id) {
            list.push(r);
        }
    }
    list.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(list)
}

/// Every replica and which one leads.
pub async fn replicas(app: &App) -> Result<Vec<(ReplicaInfo, bool)>, crate::store::StoreError> {
    let Some(election) = app.store.election() else {
        return Ok(vec![(app.leadership.me.clone(), true)]);
    };
    let leader: Option<ReplicaInfo> = election
        .leader()
        .await?
        .and_then(|(v, _)| serde_json::from_slice(&v).ok());
    let mut list: Vec<ReplicaInfo> = election
        .replicas()
        .await?
        .iter()
        .filter_map(|v| serde_json::from_slice(v).ok())
        .collect();
    list.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(list
        .into_iter()
        .map(|r| {
            let leads = leader.as_ref().is_some_and(|l| l.id == r.id);
            (r, leads)
        })
        .collect())
}
