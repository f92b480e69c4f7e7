//! The coordinator URLs a machine should hold: every replica known to the
//! registry, the leader's first. A bootstrap document names them when a
//! machine is made; a heartbeat answer names them again when the machine's
//! list (the digest its heartbeat reports) differs, so a machine made while
//! a replica was down learns it, and follows the leader wherever it is.
//!
//! Which URLs a machine can dial depends on where it is: a docker machine
//! reaches every replica at `https://drover-coordinator:PORT` on its
//! network's gateway ([`gateway_urls`]); any other machine at the URLs the
//! replicas advertise (`--advertise-url`).

use std::sync::Arc;
use std::time::Duration;

use drover_common::wire::{check_coordinator_urls, coordinators_digest, MAX_COORDINATOR_URLS};

use crate::provider::docker::COORDINATOR_HOST;
use crate::types::ReplicaInfo;

/// How long a replica that stopped renewing its registration (it died, or
/// was stopped) stays in the machines' lists: it may lead again after a
/// restart, maybe after the others failed, and its machines must still
/// know it then. A replica taken away for good leaves the lists after it.
pub const REPLICA_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// `https://drover-coordinator:PORT` for `own_port` first, then for every
/// replica that announced a gateway port, each port once. A replica that
/// predates `gatewayPort` serves no gateway but the ones it provisioned on,
/// so it is left out.
pub fn gateway_urls<'a>(
    own_port: u16,
    replicas: impl IntoIterator<Item = &'a ReplicaInfo>,
) -> Vec<String> {
    let mut ports = vec![own_port];
    for r in replicas {
        if let Some(p) = r.gateway_port.filter(|p| !ports.contains(p)) {
            ports.push(p);
        }
    }
    ports
        .into_iter()
        .map(|p| format!("https://{COORDINATOR_HOST}:{p}"))
        .collect()
}

/// `own` (this replica's `--advertise-url`s) first, then the advertised URLs
/// of every other replica, each once. A replica that predates
/// `advertiseUrls` adds nothing (its `url` is its bind address, which
/// machines may not reach).
pub fn advertised_urls<'a>(
    own: &[String],
    replicas: impl IntoIterator<Item = &'a ReplicaInfo>,
) -> Vec<String> {
    let mut urls: Vec<String> = vec![];
    let all = own
        .iter()
        .chain(replicas.into_iter().flat_map(|r| r.advertise_urls.iter()));
    for u in all.map(|u| u.trim_end_matches('/')) {
        if !urls.iter().any(|x| x == u) {
            urls.push(u.to_owned());
        }
    }
    urls
}

/// A list as machines are sent it: only URLs an agent accepts, at most
/// [`MAX_COORDINATOR_URLS`] (the first, so the leader's stay).
fn acceptable(urls: Vec<String>) -> Vec<String> {
    let mut kept: Vec<String> = vec![];
    for u in urls {
        if kept.len() == MAX_COORDINATOR_URLS {
            break;
        }
        let mut candidate = kept.clone();
        candidate.push(u);
        if check_coordinator_urls(&candidate).is_ok() {
            kept = candidate;
        }
    }
    kept
}

/// One kind of list and its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlList {
    pub urls: Vec<String>,
    pub digest: String,
}

impl UrlList {
    fn new(urls: Vec<String>) -> Option<Self> {
        let urls = acceptable(urls);
        if urls.is_empty() {
            return None;
        }
        let digest = coordinators_digest(&urls);
        Some(Self { urls, digest })
    }
}

/// The lists the leader hands machines, computed from the registry each
/// time the leader reads it (not per heartbeat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineUrls {
    /// For machines of docker clusters; `None` when this replica serves no
    /// gateway port.
    pub docker: Option<UrlList>,
    /// For every other machine.
    pub advertised: Option<UrlList>,
}

/// Which list a machine is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineKind {
    /// A machine of a docker cluster.
    Docker,
    /// Any other: a pool machine, an aws machine, a machine in no cluster.
    Other,
}

impl MachineUrls {
    /// The lists for `me` (leading) advertising `advertise_urls`, with
    /// `replicas` the registered replicas (`me` among them or not).
    pub fn compute(me: &ReplicaInfo, advertise_urls: &[String], replicas: &[ReplicaInfo]) -> Self {
        let others = || replicas.iter().filter(|r| r.id != me.id);
        Self {
            docker: me
                .gateway_port
                .and_then(|p| UrlList::new(gateway_urls(p, others()))),
            advertised: UrlList::new(advertised_urls(advertise_urls, others())),
        }
    }

    /// Whether a machine reporting `digest` holds one of the current lists
    /// already (the usual case: nothing to look up or send).
    pub fn holds(&self, digest: &str) -> bool {
        [&self.docker, &self.advertised]
            .into_iter()
            .flatten()
            .any(|l| l.digest == digest)
    }

    /// The list a machine of `kind` should hold.
    pub fn for_kind(&self, kind: MachineKind) -> Option<&UrlList> {
        match kind {
            MachineKind::Docker => self.docker.as_ref(),
            MachineKind::Other => self.advertised.as_ref(),
        }
    }
}

/// The lists of the current leader, shared by the election (which writes
/// them) and the machine API (which reads them).
#[derive(Debug, Default)]
pub struct CurrentUrls(std::sync::RwLock<Option<Arc<MachineUrls>>>);

impl CurrentUrls {
    /// The lists, when this replica leads and has read the registry.
    pub fn get(&self) -> Option<Arc<MachineUrls>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the lists (`None`: not leading); returns whether they changed.
    pub fn set(&self, urls: Option<MachineUrls>) -> bool {
        let mut slot = self.0.write().unwrap_or_else(|e| e.into_inner());
        if slot.as_deref() == urls.as_ref() {
            return false;
        }
        *slot = urls.map(Arc::new);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: &str, port: Option<u16>, advertise: &[&str]) -> ReplicaInfo {
        ReplicaInfo {
            id: id.into(),
            url: format!("https://{id}"),
            version: "0.1.0".into(),
            started_at: drover_common::now(),
            gateway_port: port,
            advertise_urls: advertise.iter().map(|u| (*u).to_owned()).collect(),
        }
    }

    #[test]
    fn the_leader_first_then_every_registered_replica() {
        let me = replica("h:7443", Some(7443), &["https://a:7443"]);
        let registry = [
            replica("h:7441", Some(7441), &["https://b:7441/", "https://a:7443"]),
            me.clone(),
            replica("h:7442", None, &[]),
        ];
        let urls = MachineUrls::compute(&me, &me.advertise_urls, &registry);
        let docker = urls.for_kind(MachineKind::Docker).unwrap();
        assert_eq!(
            docker.urls,
            [
                "https://drover-coordinator:7443",
                "https://drover-coordinator:7441"
            ]
        );
        let other = urls.for_kind(MachineKind::Other).unwrap();
        assert_eq!(other.urls, ["https://a:7443", "https://b:7441"]);
        assert!(urls.holds(&coordinators_digest(&other.urls)));
        // The same replicas in another order: nothing to send.
        assert!(urls.holds(&coordinators_digest(&[
            "https://b:7441".to_owned(),
            "https://a:7443".to_owned()
        ])));
        assert!(!urls.holds(&coordinators_digest(&["https://a:7443".to_owned()])));
    }

    #[test]
    fn only_urls_an_agent_accepts_are_sent() {
        let me = replica("h:1", None, &["https://a:1", "http://plain:1"]);
        let many: Vec<ReplicaInfo> = (0..20)
            .map(|i| {
                let url = format!("https://r{i}:1");
                replica(&format!("r{i}:1"), None, &[url.as_str()])
            })
            .collect();
        let urls = MachineUrls::compute(&me, &me.advertise_urls, &many);
        assert_eq!(urls.docker, None);
        let other = urls.advertised.unwrap();
        assert_eq!(other.urls.len(), MAX_COORDINATOR_URLS);
        assert_eq!(other.urls[0], "https://a:1");
        assert!(check_coordinator_urls(&other.urls).is_ok());
    }
}
