//! Object name, host name and label checks, the same rules Kubernetes
//! applies, so names are safe in URLs, file paths, container names, cloud
//! tags and terminals. The coordinator and the CLI share them.
//!
//! - Object names (clusters, machines, pools, tokens): DNS-1123 labels.
//! - Host names (reported by machines, Kubernetes node names): DNS-1123
//!   subdomains.
//! - Label keys: an optional DNS-1123 subdomain prefix and `/`, then a name
//!   of at most 63 characters `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
//! - Label values: empty, or a name of the same shape.
//!
//! A leaf: it imports nothing of this crate.

/// The name of the control-plane pool in machine assignments and status;
/// no worker pool may take it.
pub const CONTROL_PLANE_POOL: &str = "control-plane";

/// The annotation on a worker machine the cluster-autoscaler chose to
/// take out (`NodeGroupDeleteNodes`; its value says who): the machine
/// leaves as one an operator deleted does, but a pool machine goes back to
/// its pool instead of being deregistered, and the pool's `replicas`,
/// lowered in the same write, asks for no replacement.
pub const SCALE_DOWN_ANNOTATION: &str = "drover.dev/scale-down";

/// Why a name or label is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("{what} {value:?} is invalid: {why}")]
    Invalid {
        what: &'static str,
        value: String,
        why: &'static str,
    },
}

fn invalid(what: &'static str, value: &str, why: &'static str) -> NameError {
    NameError::Invalid {
        what,
        // Bounded and printable: the value may come from anyone.
        value: value.chars().take(80).collect(),
        why,
    }
}

/// Refuses an empty `value`, and one longer than `max` (saying
/// `too_long`).
fn check_size(
    what: &'static str,
    value: &str,
    max: usize,
    too_long: &'static str,
) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(invalid(what, value, "it must not be empty"));
    }
    if value.len() > max {
        return Err(invalid(what, value, too_long));
    }
    Ok(())
}

/// Checks a DNS-1123 label: 1 to 63 characters of `[a-z0-9-]`, starting and
/// ending with a letter or digit. Object names use this, so they never
/// contain path separators or dots.
pub fn check_dns_label(what: &'static str, value: &str) -> Result<(), NameError> {
    check_size(what, value, 63, "it must be at most 63 characters")?;
    let bad = |why| Err(invalid(what, value, why));
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return bad("it may contain only lowercase letters, digits and '-'");
    }
    if value.starts_with('-') || value.ends_with('-') {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

/// Checks an object name as it appears in an API path or a CLI argument:
/// Kubernetes' rule for object names, a DNS-1123 subdomain (so no `/`, and
/// never `.` or `..`). Clusters and pools are stricter (DNS-1123 labels,
/// checked where they are declared), and machine names, made of a cluster
/// and a pool name, are kept to a label by [`MAX_NAME_PREFIX`].
pub fn check_object_name(what: &'static str, value: &str) -> Result<(), NameError> {
    check_dns_subdomain(what, value).map_err(|_| {
        invalid(
            what,
            value,
            "an object name must be a DNS-1123 subdomain: at most 253 characters, dot-separated parts of 1 to 63 lowercase letters, digits and '-', each starting and ending with a letter or digit",
        )
    })
}

/// The longest a machine name's prefix may be: a created machine is named
/// `<cluster>-<pool>-xxxxx`, a registered one `<pool>-xxxxxx`, and both
/// must stay DNS-1123 labels (63 characters).
pub const MAX_NAME_PREFIX: usize = 56;

/// Checks a DNS-1123 subdomain: at most 253 characters, dot-separated
/// DNS-1123 labels (so no empty part: `.`, `..` and `a..b` are refused).
pub fn check_dns_subdomain(what: &'static str, value: &str) -> Result<(), NameError> {
    check_size(what, value, 253, "it must be at most 253 characters")?;
    let bad = |why| Err(invalid(what, value, why));
    for part in value.split('.') {
        if check_dns_label(what, part).is_err() {
            return bad("it must be a DNS-1123 subdomain: dot-separated parts of 1 to 63 lowercase letters, digits and '-', each starting and ending with a letter or digit");
        }
    }
    Ok(())
}

/// Checks a host name a machine reports, which becomes its Kubernetes node
/// name: a DNS-1123 subdomain.
pub fn check_hostname(value: &str) -> Result<(), NameError> {
    check_dns_subdomain("hostname", value)
}

/// Checks the name part of a label key, or a label value.
fn check_label_name(what: &'static str, value: &str) -> Result<(), NameError> {
    let bad = |why| Err(invalid(what, value, why));
    if value.len() > 63 {
        return bad("it must be at most 63 characters");
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("it may contain only letters, digits, '-', '_' and '.'");
    }
    let (first, last) = (value.as_bytes()[0], value.as_bytes()[value.len() - 1]);
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

/// Checks a label key (also a selector key): an optional DNS-1123
/// subdomain prefix and `/`, then a name of at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending with a letter or digit.
pub fn check_label_key(value: &str) -> Result<(), NameError> {
    const WHAT: &str = "label key";
    let name = match value.split_once('/') {
        Some((prefix, name)) => {
            if check_dns_subdomain(WHAT, prefix).is_err() {
                return Err(invalid(
                    WHAT,
                    value,
                    "its prefix (before '/') must be a DNS-1123 subdomain",
                ));
            }
            name
        }
        None => value,
    };
    if name.is_empty() {
        return Err(invalid(WHAT, value, "its name must not be empty"));
    }
    check_label_name(WHAT, name).map_err(|e| match e {
        NameError::Invalid { why, .. } => invalid(WHAT, value, why),
    })
}

/// Checks a label value (also a selector value): empty, or at most 63
/// characters of `[A-Za-z0-9._-]` starting and ending with a letter or digit.
pub fn check_label_value(value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return Ok(());
    }
    check_label_name("label value", value)
}

/// Checks every key and value of a label map, returning every error.
pub fn check_labels<'a>(
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<NameError> {
    labels
        .into_iter()
        .flat_map(|(k, v)| [check_label_key(k), check_label_value(v)])
        .filter_map(Result::err)
        .collect()
}

/// The most bytes an object's annotations (keys and values) may hold, as
/// in Kubernetes (apimachinery/pkg/api/validation/objectmeta.go:
/// `TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// What is wrong with annotations: keys are label keys
/// ([`check_label_key`]); values are free text, together at most
/// [`MAX_ANNOTATION_BYTES`].
pub fn check_annotations(annotations: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> = annotations
        .keys()
        .filter_map(|k| check_label_key(k).err())
        .map(|e| e.to_string())
        .collect();
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_ANNOTATION_BYTES {
        out.push(format!(
            "annotations hold {size} bytes, over the limit of {MAX_ANNOTATION_BYTES}; keep large data elsewhere"
        ));
    }
    out
}

/// `len` random lowercase letters and digits: the suffix that makes a
/// generated object name unique (`<pool>-x7k2q`).
pub fn random_suffix(len: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..len)
        .map(|_| {
            let i = rng.random_range(0..36u8);
            (if i < 10 { b'0' + i } else { b'a' + i - 10 }) as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `check` accepts every one of `good` and refuses every
    /// one of `bad`.
    fn sorts(check: impl Fn(&str) -> Result<(), NameError>, good: &[&str], bad: &[&str]) {
        for good in good {
            assert!(check(good).is_ok(), "{good:?} refused");
        }
        for bad in bad {
            assert!(check(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dns_labels() {
        assert!(check_dns_label("name", "demo-1").is_ok());
        for bad in [
            "",
            "Demo",
            "a/b",
            "../etc",
            "..",
            ".",
            "-rf",
            "-a",
            "a-",
            "a.b",
            "a\nb",
            &"a".repeat(64),
        ] {
            assert!(check_dns_label("name", bad).is_err(), "{bad:?} accepted");
        }
        for bad in ["../admintokens/x", "..", ".", "a/b", "a..b", "A", "-rf", ""] {
            let e = check_object_name("name", bad).unwrap_err();
            assert!(e.to_string().contains("DNS-1123 subdomain"), "{e}");
        }
        assert!(check_object_name("name", "demo-default-x1y2z").is_ok());
        assert!(check_object_name("name", "a.b").is_ok());
    }

    #[test]
    fn hostnames() {
        sorts(
            check_hostname,
            &["node-1", "a", "ip-10-0-0-1.ec2.internal", &"a".repeat(63)],
            &[
                "",
                ".",
                "..",
                "-rf",
                "a..b",
                ".a",
                "a.",
                "Node1",
                "a_b",
                "a b",
                "a\nb",
                "a\u{1b}[2J",
                &"a".repeat(64),
                &format!("{}.b", "a".repeat(252)),
            ],
        );
    }

    #[test]
    fn labels() {
        sorts(
            check_label_key,
            &[
                "env",
                "drover.dev/role",
                "app.kubernetes.io/name",
                "A_b.c-D",
                &"k".repeat(63),
            ],
            &[
                "",
                "/x",
                "x/",
                "a/b/c",
                "Drover.dev/x",
                "..//x",
                "-x",
                "x-",
                "a\nb",
                "env\n",
                "a b",
                &"k".repeat(64),
            ],
        );
        sorts(
            check_label_value,
            &["", "v1.2_x-Y"],
            &["a b", "-x", "x/y", "a\u{1b}", &"v".repeat(64)],
        );
    }
}
