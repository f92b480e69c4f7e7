//! kubeadm join tokens, minted only when a joiner asks for its config.
//!
//! The init machine's token goes into its `InitConfiguration`, so kubeadm
//! registers it itself. Later tokens are registered by a running
//! control-plane machine's agent (`kubeadm token create`), asked through a
//! heartbeat directive: the coordinator never needs to reach a cluster.

use drover_common::token::BootstrapToken;
use serde::{Deserialize, Serialize};
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinToken {
    pub token: BootstrapToken,
    pub state: TokenState,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
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
    /// Drops expired and abandoned tokens. Returns whether anything changed.
    pub fn prune(&mut self, now: OffsetDateTime) -> bool {
        let before = self.tokens.len();
        self.tokens.retain(|t| {
            t.expires_at > now
                && !(t.state == TokenState::Pending && now - t.created_at > PENDING_GIVE_UP)
        });
        before != self.tokens.len()
    }

    /// Decides what a joiner gets now. Pure: the caller stores a minted token.
    pub fn decide(&self, now: OffsetDateTime, ttl: Duration) -> JoinTokenDecision {
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
        JoinTokenDecision::Mint(JoinToken {
            token: BootstrapToken::generate(),
            state: TokenState::Pending,
            created_at: now,
            expires_at: now + ttl,
        })
    }

    /// Tokens a control-plane agent should register now.
    pub fn pending(&self, now: OffsetDateTime) -> impl Iterator<Item = &JoinToken> {
        self.tokens
            .iter()
            .filter(move |t| t.state == TokenState::Pending && t.expires_at > now)
    }

    /// Marks a token registered. Returns whether anything changed.
    pub fn activate(&mut self, token_id: &str) -> bool {
        match self
            .tokens
            .iter_mut()
            .find(|t| t.token.id() == token_id && t.state == TokenState::Pending)
        {
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

    #[test]
    fn mint_wait_activate_use() {
        let mut s = ClusterJoinTokens::default();
        let ttl = Duration::minutes(30);
        let JoinTokenDecision::Mint(t) = s.decide(t0(), ttl) else {
            panic!("expected a mint")
        };
        s.tokens.push(t.clone());
        assert_eq!(
            s.decide(t0() + Duration::seconds(5), ttl),
            JoinTokenDecision::Wait
        );
        assert_eq!(s.pending(t0()).count(), 1);
        assert!(s.activate(t.token.id()));
        assert!(!s.activate(t.token.id()));
        assert_eq!(
            s.decide(t0() + Duration::minutes(10), ttl),
            JoinTokenDecision::Use(t.token.clone())
        );
        // Too close to expiry: a new one is minted rather than handing out a dying token.
        assert!(matches!(
            s.decide(t0() + Duration::minutes(26), ttl),
            JoinTokenDecision::Mint(_)
        ));
    }

    #[test]
    fn abandoned_pending_tokens_are_dropped() {
        let mut s = ClusterJoinTokens::default();
        let JoinTokenDecision::Mint(t) = s.decide(t0(), Duration::minutes(30)) else {
            panic!()
        };
        s.tokens.push(t);
        assert!(!s.prune(t0() + Duration::minutes(1)));
        assert!(s.prune(t0() + Duration::minutes(3)));
        assert!(s.tokens.is_empty());
    }
}
