//! Object name and label checks, the same rules Kubernetes applies, so names
//! are safe in URLs, file paths, container names and cloud tags.

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

/// Checks a DNS-1123 label: 1 to 63 characters of `[a-z0-9-]`, starting and
/// ending with a letter or digit. Object names use this, so they never
/// contain path separators or dots.
pub fn check_dns_label(what: &'static str, value: &str) -> Result<(), NameError> {
    let bad = |why| {
        Err(NameError::Invalid {
            what,
            value: value.chars().take(80).collect(),
            why,
        })
    };
    if value.is_empty() {
        return bad("it must not be empty");
    }
    if value.len() > 63 {
        return bad("it must be at most 63 characters");
    }
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

/// Checks a label key or value: at most 63 characters of `[A-Za-z0-9._-]`
/// (keys may carry one `prefix/`), starting and ending alphanumerically.
pub fn check_label(what: &'static str, value: &str, allow_empty: bool) -> Result<(), NameError> {
    let bad = |why| {
        Err(NameError::Invalid {
            what,
            value: value.chars().take(80).collect(),
            why,
        })
    };
    let name = match value.split_once('/') {
        Some((prefix, name)) if what == "label key" => {
            if prefix.is_empty() || prefix.len() > 253 || prefix.contains("..") {
                return bad("its prefix must be a DNS subdomain");
            }
            name
        }
        _ => value,
    };
    if name.is_empty() {
        return if allow_empty {
            Ok(())
        } else {
            bad("it must not be empty")
        };
    }
    if name.len() > 63 {
        return bad("it must be at most 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("it may contain only letters, digits, '-', '_' and '.'");
    }
    let first = name.as_bytes()[0];
    let last = name.as_bytes()[name.len() - 1];
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(check_dns_label("name", "demo-1").is_ok());
        for bad in [
            "",
            "Demo",
            "a/b",
            "../etc",
            "-a",
            "a-",
            "a.b",
            &"a".repeat(64),
        ] {
            assert!(check_dns_label("name", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn labels() {
        assert!(check_label("label key", "drover.dev/role", false).is_ok());
        assert!(check_label("label value", "", true).is_ok());
        assert!(check_label("label value", "a b", true).is_err());
        assert!(check_label("label key", "", false).is_err());
    }
}
