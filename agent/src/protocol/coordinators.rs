//! The coordinator URLs a machine keeps: what it reports of them in a
//! heartbeat, and what it does about a list a heartbeat answer names.
//!
//! The coordinator names the machine's current list (every registered
//! replica) in a heartbeat answer only when it differs from the digest the
//! heartbeat reported, so a machine made while a replica was down learns
//! it, and follows the leader wherever it is.

use drover_common::wire::{check_coordinator_urls, coordinators_digest, CoordinatorUrlsError};

/// What to do about the `coordinators` of a heartbeat answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The answer names no list, or the same replicas: nothing changes.
    Keep,
    /// Use these URLs from now on (and persist them).
    Replace(Vec<String>),
    /// The list is not valid: keep the old one.
    Refuse(CoordinatorUrlsError),
}

/// The digest a heartbeat reports of `urls`.
pub fn digest(urls: &[String]) -> String {
    coordinators_digest(urls)
}

/// Decides about `offered`, the list of an answer, given the machine's
/// `current` URLs. URLs are kept without a trailing `/`, as the client
/// uses them.
pub fn decide(current: &[String], offered: Option<Vec<String>>) -> Update {
    let Some(offered) = offered else {
        return Update::Keep;
    };
    if let Err(e) = check_coordinator_urls(&offered) {
        return Update::Refuse(e);
    }
    let offered: Vec<String> = offered
        .iter()
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect();
    if coordinators_digest(&offered) == coordinators_digest(current) {
        return Update::Keep;
    }
    Update::Replace(offered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &[&str]) -> Vec<String> {
        list.iter().map(|u| (*u).to_owned()).collect()
    }

    #[test]
    fn a_new_list_replaces_the_old_one() {
        let current = urls(&["https://a:7443"]);
        let offered = urls(&["https://b:7443/", "https://a:7443"]);
        assert_eq!(
            decide(&current, Some(offered)),
            Update::Replace(urls(&["https://b:7443", "https://a:7443"]))
        );
    }

    #[test]
    fn no_list_or_the_same_replicas_change_nothing() {
        let current = urls(&["https://a:7443", "https://b:7443"]);
        assert_eq!(decide(&current, None), Update::Keep);
        let reordered = urls(&["https://b:7443", "https://a:7443/"]);
        assert_eq!(decide(&current, Some(reordered)), Update::Keep);
        assert_eq!(
            digest(&current),
            digest(&urls(&["https://b:7443", "https://a:7443"]))
        );
        assert_ne!(digest(&current), digest(&urls(&["https://a:7443"])));
    }

    #[test]
    fn an_invalid_list_is_refused() {
        let current = urls(&["https://a:7443"]);
        for bad in [
            vec![],
            urls(&["http://b:7443"]),
            urls(&["https://"]),
            urls(&["https://b:7443/path"]),
            urls(&["https://b:7443", "https://b:7443"]),
            vec![format!("https://{}", "b".repeat(300))],
            (0..17).map(|i| format!("https://b{i}:7443")).collect(),
        ] {
            assert!(
                matches!(decide(&current, Some(bad.clone())), Update::Refuse(_)),
                "{bad:?}"
            );
        }
    }
}
