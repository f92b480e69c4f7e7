//! The coordinator's own control-plane endpoints: for each pool cluster
//! whose spec says `controlPlaneEndpoint: {managed: coordinator}`, a TCP
//! proxy on the cluster's allocated port that forwards each connection to a
//! control-plane machine whose API server answers `/readyz` over TLS with
//! the cluster's CA. The task `endpoint-proxies` keeps the listeners and
//! their backends in step with the machines once a period; it runs on every
//! replica, so a DNS name or VIP over the replicas keeps the endpoint up
//! when one replica goes.
//!
//! TLS passes through untouched: the proxy never holds a key of the
//! cluster's, and kubectl and kubelets see the API servers' certificates,
//! whose SANs carry the endpoint's host.
//!
//! Every endpoint of the process shares one [`Admission`]: connections
//! capped per source and in total (at most a quarter of the open files, so
//! the API and the machines keep theirs), idle and half-closed ones timed
//! out (`--endpoint-max-connections`, `--endpoint-idle-timeout`). Its
//! figures go to the metrics once a period.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use drover_common::api::Cluster;
use drover_common::tcp_proxy::{accept_loop, ready_backends, Admission, Backends};
use tokio::net::TcpListener;

use crate::app::App;

/// What a pool cluster's `status.loadBalancer.id` says when the
/// coordinator's proxies are its load balancer.
pub const LOAD_BALANCER_ID: &str = "coordinator";
/// How often backends are probed and listeners reconciled.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How long one `/readyz` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);

/// The `endpoint-proxies` task: each run brings the listeners and their
/// backends in line with the clusters and probes the backends; a change
/// of a cluster in the store marks the clusters to be read again at the
/// next run.
pub struct EndpointProxies {
    app: Arc<App>,
    admission: Arc<Admission>,
    proxies: HashMap<String, Proxy>,
    changes: tokio::sync::broadcast::Receiver<crate::store::Change>,
    clusters: Clusters,
}

impl EndpointProxies {
    pub fn new(app: Arc<App>, admission: Arc<Admission>) -> Self {
        Self {
            changes: app.store.watch(),
            app,
            admission,
            proxies: HashMap::new(),
            clusters: Clusters::default(),
        }
    }
}

impl crate::tasks::BackgroundTask for EndpointProxies {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        let errors = refresh(
            &self.app,
            &self.admission,
            &mut self.proxies,
            &mut self.clusters,
        )
        .await;
        crate::metrics::global().endpoint_proxy(&self.admission.stats());
        if errors.is_empty() {
            crate::tasks::Outcome::Done
        } else {
            crate::tasks::Outcome::Failed(crate::tasks::TaskError::new(errors.join("; ")))
        }
    }

    /// Notes cluster changes for the next run; never wakes the task (the
    /// backends are probed every period anyway).
    async fn watch(&mut self) {
        loop {
            match self.changes.recv().await {
                Ok(c) if c.kind == crate::store::Kind::Cluster => self.clusters.stale = true,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    self.clusters.stale = true
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    std::future::pending::<()>().await
                }
            }
        }
    }

    async fn stop(&mut self) {
        for (_, p) in self.proxies.drain() {
            p.accept.abort();
        }
    }
}

/// The clusters the proxies were last brought in line with. Read again
/// only after a cluster changed, and every [`REREAD`] regardless: the
/// backends are probed every period, but decoding every cluster every
/// second cost the whole steady state of a coordinator of thousands of
/// clusters.
#[derive(Default)]
struct Clusters {
    list: Vec<Cluster>,
    read_at: Option<std::time::Instant>,
    stale: bool,
}

/// How often the proxies read every cluster even when none changed.
const REREAD: Duration = Duration::from_secs(60);

impl Clusters {
    fn due(&self) -> bool {
        self.stale || self.read_at.is_none_or(|at| at.elapsed() >= REREAD)
    }
}

/// One cluster's listener and its current backends.
struct Proxy {
    port: u16,
    backends: Backends,
    accept: tokio::task::JoinHandle<()>,
    /// A client that trusts the cluster's CA, for `/readyz`.
    probe: reqwest::Client,
}

/// Brings the proxies in line with the clusters; returns what went wrong.
async fn refresh(
    app: &Arc<App>,
    admission: &Arc<Admission>,
    proxies: &mut HashMap<String, Proxy>,
    cache: &mut Clusters,
) -> Vec<String> {
    let mut errors = vec![];
    // Only clusters are read, and only when one changed: the reconciler
    // records each one's backends in its status, so this once-a-second
    // loop on every replica never decodes the fleet's machines.
    if cache.due() {
        cache.stale = false;
        let read = crate::store::blocking({
            let app = app.clone();
            move || app.clusters()
        })
        .await;
        match read {
            Ok(r) => {
                cache.list = r;
                cache.read_at = Some(std::time::Instant::now());
            }
            Err(e) => {
                cache.stale = true;
                return vec![format!("cannot read clusters: {e}")];
            }
        }
    }
    let clusters = &cache.list;
    let managed: BTreeMap<String, (&Cluster, u16)> = clusters
        .iter()
        .filter(|c| c.spec.endpoint_managed_by_coordinator())
        .filter_map(|c| {
            let uid = c.metadata.uid.clone()?;
            Some((uid, (c, c.status.endpoint_port?)))
        })
        .collect();
    proxies.retain(|uid, p| {
        let keep = managed.get(uid).is_some_and(|(_, port)| *port == p.port);
        if !keep {
            p.accept.abort();
            tracing::info!(cluster_uid = %uid, port = p.port, "managed endpoint closed");
        }
        keep
    });
    for (uid, (cluster, port)) in managed {
        let name = &cluster.metadata.name;
        if !proxies.contains_key(&uid) {
            match open(app, cluster, port, admission.clone()).await {
                Ok(p) => {
                    proxies.insert(uid.clone(), p);
                }
                Err(e) => {
                    errors.push(format!("cluster {name}: {e}"));
                    continue;
                }
            }
        }
        let proxy = &proxies[&uid];
        let candidates = recorded_backends(cluster);
        let healthy = ready_backends(&proxy.probe, &candidates, "control-plane backend").await;
        let mut current = proxy.backends.write().expect("backends lock");
        if *current != healthy {
            tracing::info!(cluster = %name, port, backends = ?healthy, "managed endpoint backends changed");
            *current = healthy;
        }
    }
    errors
}

/// Why a cluster's managed endpoint cannot be opened.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error("cannot read its CA: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("its CA is not made yet")]
    NoCa,
    #[error("its /readyz probe: {0}")]
    Client(#[from] crate::tls::ClientError),
    #[error("cannot listen on its endpoint {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Opens a cluster's listener and starts accepting.
async fn open(
    app: &App,
    cluster: &Cluster,
    port: u16,
    admission: Arc<Admission>,
) -> Result<Proxy, OpenError> {
    let pki = crate::domain::secrets::load_pki(&app.store, cluster)?.ok_or(OpenError::NoCa)?;
    let probe = crate::tls::client_trusting(pki.ca.cert_pem.as_bytes(), PROBE_TIMEOUT)?;
    let addr = SocketAddr::new(app.settings.endpoints.bind, port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| OpenError::Listen { addr, source })?;
    tracing::info!(cluster = %cluster.metadata.name, %addr, "managed endpoint listening");
    let backends = Arc::new(RwLock::new(vec![]));
    let accept = tokio::spawn(accept_loop(
        listener,
        cluster.metadata.name.clone(),
        backends.clone(),
        admission,
    ));
    Ok(Proxy {
        port,
        backends,
        accept,
        probe,
    })
}

/// The API servers the reconciler recorded for the cluster: its
/// control-plane machines with an address, from the moment they bootstrap,
/// without those leaving (a machine being released gets no new
/// connections). Only those answering `/readyz` get connections.
fn recorded_backends(cluster: &Cluster) -> Vec<SocketAddr> {
    cluster
        .status
        .load_balancer
        .iter()
        .flat_map(|lb| &lb.backends)
        .filter_map(|b| b.parse().ok())
        .collect()
}
