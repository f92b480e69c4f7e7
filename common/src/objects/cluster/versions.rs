//! Kubernetes versions: the `vMAJOR.MINOR.PATCH` grammar (SemVer, as
//! Kubernetes' own `version.ParseSemantic` reads it), the oldest release
//! Drover deploys, and the skew rule between a cluster's version and the
//! one it moves to.
//!
//! Invariant: nothing outside the grammar passes `KubernetesVersion::parse`
//! (the text goes into kubeadm's config and the image's upgrade hooks), and
//! a version change is never a downgrade nor skips a minor release.

use crate::objects::format::FormatError;

/// The oldest Kubernetes minor release (of 1.x) Drover deploys: kubeadm
/// 1.31, whose config API v1beta4 Drover renders, deploys control planes of
/// its own release and the one before.
pub const OLDEST_KUBERNETES_MINOR: u32 = 30;

/// A Kubernetes release, `vMAJOR.MINOR.PATCH` with an optional pre-release
/// or build suffix (kept in the text, not ordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KubernetesVersion {
    /// Parses the form, all of it: `v`, then a SemVer 2.0 version
    /// (`MAJOR.MINOR.PATCH`, an optional `-` pre-release and `+` build of
    /// dot-separated identifiers), as Kubernetes' own
    /// `version.ParseSemantic` does; [`check_kubernetes_version`] also
    /// checks the range. The text goes into kubeadm's config and the
    /// image's upgrade hooks, so nothing outside the grammar passes.
    pub fn parse(v: &str) -> Result<Self, FormatError> {
        let malformed = |why: String| FormatError::KubernetesVersion {
            got: v.to_string(),
            why,
        };
        let rest = v
            .strip_prefix('v')
            .ok_or_else(|| malformed("it does not start with 'v'".into()))?;
        let (rest, build) = match rest.split_once('+') {
            Some((r, b)) => (r, Some(b)),
            None => (rest, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (rest, None),
        };
        let parts: Vec<u32> = core
            .split('.')
            .map(|p| {
                if !is_numeric_identifier(p) {
                    return Err(malformed(format!(
                        "{p:?} in MAJOR.MINOR.PATCH is not a number without leading zeros"
                    )));
                }
                p.parse::<u32>()
                    .map_err(|_| malformed(format!("{p:?} is too large")))
            })
            .collect::<Result<_, _>>()?;
        let [major, minor, patch] = parts[..] else {
            return Err(malformed(format!(
                "{core:?} has {} numbers, not three (MAJOR.MINOR.PATCH)",
                parts.len()
            )));
        };
        for (what, part) in [("pre-release", pre), ("build", build)] {
            let Some(part) = part else { continue };
            for id in part.split('.') {
                if id.is_empty() {
                    return Err(malformed(format!("the {what} has an empty identifier")));
                }
                if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                    return Err(malformed(format!(
                        "the {what} identifier {id:?} holds a character other than letters, digits and '-'"
                    )));
                }
                if what == "pre-release"
                    && id.bytes().all(|b| b.is_ascii_digit())
                    && !is_numeric_identifier(id)
                {
                    return Err(malformed(format!(
                        "the pre-release identifier {id:?} is a number with a leading zero"
                    )));
                }
            }
        }
        Ok(Self {
            major,
            minor,
            patch,
        })
    }
}

/// SemVer's numeric identifier: `0`, or digits not starting with `0`.
fn is_numeric_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

impl std::fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Checks `vMAJOR.MINOR.PATCH` with an optional pre-release suffix, of a
/// release Drover deploys.
pub fn check_kubernetes_version(v: &str) -> Result<(), FormatError> {
    let k = KubernetesVersion::parse(v)?;
    if k.major != 1 || k.minor < OLDEST_KUBERNETES_MINOR {
        return Err(FormatError::KubernetesTooOld {
            oldest_minor: OLDEST_KUBERNETES_MINOR,
            got: v.to_string(),
        });
    }
    Ok(())
}

/// Why a cluster may not move from version `from` to `to`, naming the
/// versions it may move to: Kubernetes supports no downgrade, and an
/// upgrade goes one minor release at a time (any patch of the current or
/// the next minor). Versions of the wrong form pass here:
/// [`Cluster::validate`](super::Cluster::validate) refuses them.
pub fn check_version_change(from: &str, to: &str) -> Result<(), VersionChangeError> {
    let (Ok(f), Ok(t)) = (KubernetesVersion::parse(from), KubernetesVersion::parse(to)) else {
        return Ok(());
    };
    let allowed = format!(
        "{from} itself, a later v{}.{} patch, or a v{}.{} release",
        f.major,
        f.minor,
        f.major,
        f.minor + 1
    );
    let (from, to) = (from.to_owned(), to.to_owned());
    if t < f {
        return Err(VersionChangeError::Downgrade { from, to, allowed });
    }
    if t.major != f.major || t.minor > f.minor + 1 {
        return Err(VersionChangeError::SkippedMinor { from, to, allowed });
    }
    Ok(())
}

/// Why a cluster may not move between two Kubernetes versions; each names
/// the versions it may move to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionChangeError {
    #[error(
        "cannot go from {from} down to {to}: Kubernetes supports no downgrade; allowed: {allowed}"
    )]
    Downgrade {
        from: String,
        to: String,
        allowed: String,
    },
    #[error("cannot go from {from} to {to}: Kubernetes upgrades one minor release at a time; allowed: {allowed}")]
    SkippedMinor {
        from: String,
        to: String,
        allowed: String,
    },
}

#[cfg(test)]
mod tests {
    use super::super::{sample, Cluster};
    use super::*;

    #[test]
    fn versions_move_up_one_minor_at_a_time_and_never_down() {
        for ok in ["v1.31.2", "v1.31.9", "v1.32.0", "v1.32.7"] {
            check_version_change("v1.31.2", ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let skip = check_version_change("v1.31.2", "v1.33.0")
            .unwrap_err()
            .to_string();
        assert!(
            skip.contains("one minor release at a time")
                && skip.contains("v1.31.2 itself, a later v1.31 patch, or a v1.32 release"),
            "{skip}"
        );
        let down = check_version_change("v1.31.2", "v1.31.1")
            .unwrap_err()
            .to_string();
        assert!(down.contains("no downgrade"), "{down}");
        assert!(check_version_change("v1.32.0", "v1.31.9").is_err());
        assert!(check_version_change("v1.31.2", "v2.0.0").is_err());
        // Forms are validate()'s to refuse.
        assert!(check_version_change("v1.31.2", "1.33").is_ok());

        let old = check_kubernetes_version("v1.29.9").unwrap_err().to_string();
        assert!(old.contains("v1.30.0 or later"), "{old}");
        check_kubernetes_version("v1.30.0").unwrap();
        check_kubernetes_version("v1.31.2-rc.1").unwrap();
        assert!(check_kubernetes_version("v1.31").is_err());
        assert!(check_kubernetes_version("v1.31.2.1").is_err());
        assert_eq!(
            KubernetesVersion::parse("v1.32.0+build")
                .unwrap()
                .to_string(),
            "v1.32.0"
        );
    }

    #[test]
    fn kubernetes_version_format_is_semver_throughout() {
        for ok in [
            "v1.31.2",
            "v1.31.2-rc.1",
            "v1.31.2-alpha.0.1-x",
            "v1.31.2-0",
            "v1.31.2+build.5",
            "v1.31.2-rc.1+build.05",
            "v1.31.2+k3s1",
            "v1.31.2-eks-abc123",
        ] {
            check_kubernetes_version(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            (
                "v1.31.2-x;$(touch /tmp/pwn)",
                "other than letters, digits and '-'",
            ),
            ("v1.31.2+b;id", "other than letters, digits and '-'"),
            ("v1.31.2-rc..1", "empty identifier"),
            ("v1.31.2-", "empty identifier"),
            ("v1.31.2+", "empty identifier"),
            ("v1.31.2-rc.01", "leading zero"),
            ("v1.031.2", "without leading zeros"),
            ("v1.31.+2", "not a number"),
            ("v1.31.2 ", "without leading zeros"),
            ("1.31.2", "does not start with 'v'"),
            ("v1.31", "not three"),
            ("v1.31.2.1", "not three"),
            ("v1.31.2-rc.1\n", "other than letters"),
        ] {
            let e = check_kubernetes_version(bad).expect_err(bad).to_string();
            assert!(
                e.contains(why) && e.contains("SemVer") && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
        }
        // Validation names the field.
        let doc = sample().replace("v1.31.2", "v1.31.2-x;$(touch /tmp/pwn)");
        let c: Cluster = serde_saphyr::from_str(&doc).unwrap();
        let errs = c.validate().unwrap_err();
        assert!(
            errs.iter().any(|e| e.field == "spec.kubernetesVersion"
                && e.message
                    .contains("pre-release identifier \"x;$(touch /tmp/pwn)\"")),
            "{errs:?}"
        );
    }
}
