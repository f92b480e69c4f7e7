//! A running control plane's view of its cluster (its etcd members and the
//! Nodes), read beside the heartbeats rather than in their way.
//!
//! Invariant: a heartbeat waits for the view at most its budget (half the
//! heartbeat interval). A read that takes longer (a hung etcd or API
//! server, a starved host) goes on in the background and its result goes
//! with a later heartbeat, so the coordinator never takes a control plane
//! for silent, or late, because its cluster is slow to answer: that is
//! exactly when the coordinator must see it alive.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_common::wire::{EtcdReport, NodesReport};

use crate::etcd::Etcd;
use crate::kube::Kube;

/// What one read of the view found (each `None` when not read).
pub(super) type View = (Option<EtcdReport>, Option<NodesReport>);

/// The clients a read uses, handed to it and back.
type Clients = (Etcd, Kube);

/// Reads the view, one read at a time.
pub(super) struct ViewReader {
    root: PathBuf,
    /// The clients, while no read is under way.
    idle: Option<Clients>,
    /// The read under way.
    running: Option<tokio::task::JoinHandle<(Clients, View)>>,
}

impl ViewReader {
    pub(super) fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            idle: Some((Etcd::new(root), Kube::new(root))),
            running: None,
        }
    }

    /// The view of the control plane at `ip` (its API server on
    /// `api_server_port`), waiting at most `budget` for it: a read under
    /// way is awaited, else one is started. Nothing when the read is not
    /// done by then (it goes on; a later call takes its result) or when
    /// `ip` is `None` (the machine reports no view: a finished read is
    /// dropped).
    pub(super) async fn read(
        &mut self,
        ip: Option<IpAddr>,
        api_server_port: u16,
        budget: Duration,
    ) -> View {
        if self.running.is_none() {
            let Some(ip) = ip else {
                return (None, None);
            };
            let (mut etcd, mut kube) = self
                .idle
                .take()
                .unwrap_or_else(|| (Etcd::new(&self.root), Kube::new(&self.root)));
            self.running = Some(tokio::spawn(async move {
                let view = tokio::join!(
                    etcd_report(&mut etcd, ip),
                    nodes_report(&mut kube, ip, api_server_port),
                );
                ((etcd, kube), (Some(view.0), Some(view.1)))
            }));
        }
        let Some(running) = self.running.as_mut() else {
            return (None, None);
        };
        let budget = if ip.is_some() { budget } else { Duration::ZERO };
        match tokio::time::timeout(budget, running).await {
            // Still reading: a later heartbeat takes it.
            Err(_) => (None, None),
            Ok(done) => {
                self.running = None;
                match done {
                    Ok((clients, view)) => {
                        self.idle = Some(clients);
                        if ip.is_some() {
                            view
                        } else {
                            (None, None)
                        }
                    }
                    // The read panicked: the clients went with it; the next
                    // read makes new ones.
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the cluster view failed");
                        (None, None)
                    }
                }
            }
        }
    }
}

/// What the control plane at `ip` reads of its etcd members.
async fn etcd_report(etcd: &mut Etcd, ip: IpAddr) -> EtcdReport {
    let endpoint = crate::etcd::local_endpoint(ip);
    tokio::time::timeout(crate::etcd::ETCD_TIMEOUT * 2, etcd.report(&endpoint))
        .await
        .unwrap_or_else(|_| EtcdReport {
            members: vec![],
            error: format!("etcd at {endpoint} did not answer in time"),
        })
}

/// What the API server of the control plane at `ip` lists of the Nodes.
async fn nodes_report(kube: &mut Kube, ip: IpAddr, api_server_port: u16) -> NodesReport {
    let api = crate::kube::local_api(ip, api_server_port);
    tokio::time::timeout(crate::kube::KUBE_TIMEOUT * 2, kube.report(&api))
        .await
        .unwrap_or_else(|_| NodesReport {
            error: format!("the API server at {api} did not answer in time"),
            ..Default::default()
        })
}
