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

use tokio::sync::watch;

use crate::app::App;
use crate::domain::leadership::Role;
use crate::domain::replicas::{MachineUrls, REPLICA_RETENTION};
use crate::store::{Election, Fence};
use crate::types::ReplicaInfo;

/// Runs the election until `shutdown`; on shutdown a leader resigns, so
/// another replica takes over at once instead of after the lease.
pub async fn run(
    app: Arc<App>,
    election: Election,
    ttl: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let value = serde_json::to_vec(&app.leadership.me).expect("replica info serializes");
    // The lease is renewed every third of its TTL; a follower campaigns far
    // more often (a cheap compare in etcd), so it takes over within about
    // a tenth of the TTL of the old lease expiring.
    let period = ttl / 3;
    let poll = (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    // This replica among the known ones (see `REPLICA_RETENTION`).
    let mut known = Known::default();
    'lease: loop {
        let asked = tokio::time::Instant::now();
        let lease = match election.grant(ttl).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot get a leadership lease; retrying");
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(period) => continue 'lease,
                }
            }
        };
        // The lease is safe to count on from before it was asked for.
        let mut renewed = asked;
        let mut next_renewal = asked + period;
        if let Err(e) = election
            .announce(&app.leadership.me.id, value.clone(), lease)
            .await
        {
            tracing::warn!(error = %e, "cannot announce this coordinator");
        }
        known.renew(&election, &app.leadership.me.id, &value).await;
        loop {
            match app.leadership.term() {
                None => match election.campaign(lease, value.clone()).await {
                    Ok(Ok(term)) => become_leader(&app, term),
                    Ok(Err(leader)) => app.leadership.set(Role::Follower {
                        leader: serde_json::from_slice(&leader).ok(),
                    }),
                    Err(e) => tracing::warn!(error = %e, "campaign failed"),
                },
                Some(term) => match election.leader().await {
                    Ok(Some((_, t))) if t == term => {}
                    Ok(Some((_, t))) => step_down(&app, &format!("term {} began", t.0)),
                    Ok(None) => step_down(&app, "the leader key is gone"),
                    Err(e) => tracing::warn!(error = %e, "cannot read the leader key"),
                },
            }
            if app.leadership.term().is_some() {
                refresh_machine_urls(&app).await;
            }
            tokio::select! {
                _ = shutdown.changed() => {
                    if app.leadership.term().is_some() {
                        step_down(&app, "shutting down");
                    }
                    if let Err(e) = election.resign(lease).await {
                        tracing::warn!(error = %e, "cannot resign the lease; it expires by itself");
                    }
                    return;
                }
                _ = tokio::time::sleep(if app.leadership.term().is_some() { period } else { poll }) => {}
            }
            if tokio::time::Instant::now() < next_renewal {
                continue;
            }
            known.renew(&election, &app.leadership.me.id, &value).await;
            let before = tokio::time::Instant::now();
            next_renewal = before + period;
            match election.keep_alive(lease).await {
                Ok(left) if !left.is_zero() => renewed = before,
                Ok(_) => {
                    if app.leadership.term().is_some() {
                        step_down(&app, "its lease expired");
                    }
                    continue 'lease;
                }
                Err(e) => tracing::warn!(error = %e, "cannot renew the leadership lease"),
            }
            if renewed.elapsed() >= ttl {
                if app.leadership.term().is_some() {
                    step_down(&app, "its lease could not be renewed within its TTL");
                }
                continue 'lease;
            }
        }
    }
}

fn become_leader(app: &App, term: Fence) {
    // The role change also wakes `provisioner::run_gateway_listeners`, so
    // machines of docker clusters reach this replica on their network's
    // gateway before their grace period ends.
    // Machines heartbeated to the old leader: every deadline starts afresh.
    app.liveness.lock().expect("liveness lock").clear();
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
        app.datagrams.recall_all();
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
    app.liveness.lock().expect("liveness lock").clear();
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
