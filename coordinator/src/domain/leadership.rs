//! Who this replica is and whether it leads: the state every task reads.
//! `crate::leader` runs the election that changes it.

use time::OffsetDateTime;
use tokio::sync::watch;

use crate::store::Fence;
use crate::types::ReplicaInfo;

/// What this replica is now.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    Leader {
        term: Fence,
        since: OffsetDateTime,
    },
    Follower {
        /// The leader, when one is known.
        leader: Option<ReplicaInfo>,
    },
}

/// This replica's identity and role, readable by every task.
pub struct Leadership {
    pub me: ReplicaInfo,
    role: watch::Sender<Role>,
    /// The coordinator URLs machines are told, while this replica leads
    /// (on etcd: refreshed from the registry by `crate::leader`; on SQLite
    /// never set, as the one replica's machines hold its URLs already).
    pub machine_urls: super::replicas::CurrentUrls,
}

impl Leadership {
    /// A replica that leads for its whole life (its store is its own).
    pub fn sole(me: ReplicaInfo) -> Self {
        let since = me.started_at;
        Self {
            me,
            role: watch::Sender::new(Role::Leader {
                term: Fence(0),
                since,
            }),
            machine_urls: Default::default(),
        }
    }

    /// A replica that follows until it wins an election.
    pub fn follower(me: ReplicaInfo) -> Self {
        Self {
            me,
            role: watch::Sender::new(Role::Follower { leader: None }),
            machine_urls: Default::default(),
        }
    }

    pub fn role(&self) -> Role {
        self.role.borrow().clone()
    }

    /// A receiver that sees every change of this replica's role.
    pub fn changes(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// The current term, when this replica leads.
    pub fn term(&self) -> Option<Fence> {
        match &*self.role.borrow() {
            Role::Leader { term, .. } => Some(*term),
            Role::Follower { .. } => None,
        }
    }

    /// The leader's URL, when another replica leads and is known.
    pub fn leader_url(&self) -> Option<String> {
        match &*self.role.borrow() {
            Role::Leader { .. } => Some(self.me.url.clone()),
            Role::Follower { leader } => leader.as_ref().map(|l| l.url.clone()),
        }
    }

    pub(crate) fn set(&self, role: Role) {
        self.role.send_if_modified(|r| {
            if *r == role {
                false
            } else {
                *r = role;
                true
            }
        });
    }
}
