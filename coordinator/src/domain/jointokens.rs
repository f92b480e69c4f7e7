//! kubeadm join tokens, minted only when a joiner asks for its config.
//!
//! The init machine's token goes into its `InitConfiguration`, so kubeadm
//! registers it itself. Later tokens are registered by a running
//! control-plane machine's agent (`kubeadm token create`), asked through a
//! heartbeat directive: the coordinator never needs to reach a cluster.

use drover_common::token::BootstrapToken;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::{Duration, OffsetDateTime};

/// Whether the cluster knows a token yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenState {
    /// Minted; waiting for a control-plane agent to register it.
    Pending,
    /// Registered in the cluster; joiners may use it.
    Active,
}

/// One join token.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinToken {
    pub token: BootstrapToken,
    pub state: TokenState,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// The UID of the control-plane machine asked to register this token:
    /// only it is sent the directive, and only its result activates it.
    pub registrar: Option<String>,
    /// For the token in an init machine's `InitConfiguration`: that
    /// machine's UID. Its config fetches reuse this one token.
    pub init_for: Option<String>,
}

/// The join tokens of one cluster, stored as one object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterJoinTokens {
    pub cluster_uid: String,
    pub tokens: Vec<JoinToken>,
}

/// A token must have at least this long left to be handed to a joiner.
pub const MIN_REMAINING: Duration = Duration::minutes(5);
/// A pending token not registered within this long is dropped and re-minted.
pub const PENDING_GIVE_UP: Duration = Duration::minutes(2);

/// What a joiner asking for its config gets.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinTokenDecision {
    /// Use this registered token.
    Use(BootstrapToken),
    /// A token is being registered; ask again shortly.
    Wait,
    /// Mint this new token (store it Pending) and ask again shortly.
    Mint(JoinToken),
}

impl ClusterJoinTokens {
    /// The stored tokens when they belong to the cluster `uid`, else (none
    /// stored, or a deleted namesake's) an empty set for it.
    pub fn of_cluster(stored: Option<Self>, uid: &str) -> Self {
        match stored {
            Some(t) if t.cluster_uid == uid => t,
            _ => Self {
                cluster_uid: uid.to_owned(),
                tokens: vec![],
            },
        }
    }

    /// Drops expired and abandoned tokens. Returns whether anything changed.
    pub fn prune(&mut self, now: OffsetDateTime) -> bool {
        let before = self.tokens.len();
        self.tokens.retain(|t| {
            t.expires_at > now
                && !(t.state == TokenState::Pending && now - t.created_at > PENDING_GIVE_UP)
        });
        before != self.tokens.len()
    }

    /// Decides what a joiner gets now. Pure: the caller stores a minted
    /// token, which `registrar` (a running control-plane machine's UID) is
    /// to register; without one, nothing is minted and the joiner waits.
    pub fn decide(
        &self,
        now: OffsetDateTime,
        ttl: Duration,
        registrar: Option<&str>,
    ) -> JoinTokenDecision {
        if let Some(t) = self
            .tokens
            .iter()
            .filter(|t| t.state == TokenState::Active && t.expires_at - now >= MIN_REMAINING)
            .max_by_key(|t| t.expires_at)
        {
            return JoinTokenDecision::Use(t.token.clone());
        }
        if self.tokens.iter().any(|t| {
            t.state == TokenState::Pending
                && now - t.created_at <= PENDING_GIVE_UP
                && t.expires_at > now
        }) {
            return JoinTokenDecision::Wait;
        }
        let Some(registrar) = registrar else {
            return JoinTokenDecision::Wait;
        };
        JoinTokenDecision::Mint(JoinToken {
            token: BootstrapToken::generate(),
            state: TokenState::Pending,
            created_at: now,
            expires_at: now + ttl,
            registrar: Some(registrar.to_owned()),
            init_for: None,
        })
    }

    /// The token for the `InitConfiguration` of init machine `machine_uid`.
    /// Every config fetch of that machine gets the same token while it
    /// lives, and the cluster keeps at most one init token, so repeated
    /// fetches neither grow the records nor hand joiners a token nobody
    /// registered. `may_init` says whether the machine can still run
    /// `kubeadm init` (it has not started bootstrapping): only then is a new
    /// token recorded as Active, since kubeadm init registers it; a machine
    /// past init gets a token that is not recorded at all (kubeadm will never
    /// register it, so no joiner may be handed it). Returns the token and
    /// whether the records changed.
    pub fn init_token(
        &mut self,
        machine_uid: &str,
        may_init: bool,
        now: OffsetDateTime,
        ttl: Duration,
    ) -> (BootstrapToken, bool) {
        let pruned = self.prune(now);
        if let Some(t) = self
            .tokens
            .iter()
            .find(|t| t.init_for.as_deref() == Some(machine_uid))
        {
            return (t.token.clone(), pruned);
        }
        if !may_init {
            return (BootstrapToken::generate(), pruned);
        }
        self.tokens.retain(|t| t.init_for.is_none());
        let token = BootstrapToken::generate();
        self.tokens.push(JoinToken {
            token: token.clone(),
            state: TokenState::Active,
            created_at: now,
            expires_at: now + ttl,
            registrar: None,
            init_for: Some(machine_uid.to_owned()),
        });
        (token, true)
    }

    /// Tokens the control-plane machine `registrar` should register now.
    pub fn pending_for<'a>(
        &'a self,
        now: OffsetDateTime,
        registrar: &'a str,
    ) -> impl Iterator<Item = &'a JoinToken> + 'a {
        self.tokens.iter().filter(move |t| {
            t.state == TokenState::Pending
                && t.expires_at > now
                && t.registrar.as_deref() == Some(registrar)
        })
    }

    /// Marks a token registered, on the word of machine `by` (a UID): only
    /// the registrar the token was sent to may. Returns whether anything
    /// changed.
    pub fn activate(&mut self, token_id: &str, by: &str) -> bool {
        match self.tokens.iter_mut().find(|t| {
            t.token.id() == token_id
                && t.state == TokenState::Pending
                && t.registrar.as_deref() == Some(by)
        }) {
            Some(t) => {
                t.state = TokenState::Active;
                true
            }
            None => false,
        }
    }
}

/// The directive id for registering a token.
pub fn directive_id(token: &BootstrapToken) -> String {
    format!("token-{}", token.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> OffsetDateTime {
        time::macros::datetime!(2026-01-01 00:00 UTC)
    }

    const CP: Option<&str> = Some("cp-uid");

    #[test]
    fn mint_wait_activate_use() {
        let mut s = ClusterJoinTokens::default();
        let ttl = Duration::minutes(30);
        let JoinTokenDecision::Mint(t) = s.decide(t0(), ttl, CP) else {
            panic!("expected a mint")
        };
        s.tokens.push(t.clone());
        assert_eq!(
            s.decide(t0() + Duration::seconds(5), ttl, CP),
            JoinTokenDecision::Wait
        );
        assert_eq!(s.pending_for(t0(), "cp-uid").count(), 1);
        assert!(s.activate(t.token.id(), "cp-uid"));
        assert!(!s.activate(t.token.id(), "cp-uid"));
        assert_eq!(
            s.decide(t0() + Duration::minutes(10), ttl, CP),
            JoinTokenDecision::Use(t.token.clone())
        );
        // Too close to expiry: a new one is minted rather than handing out a dying token.
        assert!(matches!(
            s.decide(t0() + Duration::minutes(26), ttl, CP),
            JoinTokenDecision::Mint(_)
        ));
        // Without a running control-plane machine to register it, nothing is minted.
        assert_eq!(
            s.decide(t0() + Duration::minutes(26), ttl, None),
            JoinTokenDecision::Wait
        );
    }

    #[test]
    fn only_the_registrar_a_token_was_sent_to_activates_it() {
        let mut s = ClusterJoinTokens::default();
        let JoinTokenDecision::Mint(t) = s.decide(t0(), Duration::minutes(30), CP) else {
            panic!("expected a mint")
        };
        s.tokens.push(t.clone());
        // Another machine of the cluster (a worker) claims to have registered it.
        assert_eq!(s.pending_for(t0(), "worker-uid").count(), 0);
        assert!(!s.activate(t.token.id(), "worker-uid"));
        assert_eq!(s.tokens[0].state, TokenState::Pending);
        assert_eq!(
            s.decide(t0(), Duration::minutes(30), CP),
            JoinTokenDecision::Wait,
            "joiners are not handed a token nobody registered"
        );
        assert!(s.activate(t.token.id(), "cp-uid"));
        assert_eq!(s.tokens[0].state, TokenState::Active);
    }

    #[test]
    fn repeated_init_fetches_reuse_one_token() {
        let mut s = ClusterJoinTokens::default();
        let ttl = Duration::minutes(30);
        let (first, changed) = s.init_token("init-uid", true, t0(), ttl);
        assert!(changed);
        for i in 1..100 {
            let now = t0() + Duration::seconds(i);
            let (again, changed) = s.init_token("init-uid", true, now, ttl);
            assert_eq!(again, first);
            assert!(!changed);
            // Joiners get the token kubeadm init registered.
            assert_eq!(
                s.decide(now, ttl, CP),
                JoinTokenDecision::Use(first.clone())
            );
        }
        assert_eq!(s.tokens.len(), 1);
        // Past init and expired: a token nobody records, so joiners never get it.
        let late = t0() + Duration::minutes(31);
        let (other, changed) = s.init_token("init-uid", false, late, ttl);
        assert_ne!(other, first);
        assert!(changed, "the expired token was pruned");
        assert!(s.tokens.is_empty());
        // A new init machine replaces the previous init token.
        s.init_token("old-init", true, t0(), ttl);
        s.init_token("new-init", true, t0(), ttl);
        assert_eq!(s.tokens.len(), 1);
        assert_eq!(s.tokens[0].init_for.as_deref(), Some("new-init"));
    }

    #[test]
    fn abandoned_pending_tokens_are_dropped() {
        let mut s = ClusterJoinTokens::default();
        let JoinTokenDecision::Mint(t) = s.decide(t0(), Duration::minutes(30), CP) else {
            panic!()
        };
        s.tokens.push(t);
        assert!(!s.prune(t0() + Duration::minutes(1)));
        assert!(s.prune(t0() + Duration::minutes(3)));
        assert!(s.tokens.is_empty());
    }
}
