//! Process limits both binaries set at start: the one system call in this
//! crate.

/// Raises the soft open-file limit to the hard one; returns the limit now
/// in force. A coordinator holds a connection, an open file, per machine,
/// and shells and service managers often start programs with a soft limit
/// of 1,024 under a much higher hard one.
pub fn raise_open_files_limit() -> Result<u64, nix::Error> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard {
        return Ok(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Ok(hard),
        // An unlimited hard limit is more than the kernel allows (nr_open).
        Err(_) => {
            let capped = hard.min(1 << 20);
            setrlimit(Resource::RLIMIT_NOFILE, capped, hard)?;
            Ok(capped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        use nix::sys::resource::{getrlimit, Resource};
        let limit = raise_open_files_limit().unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, limit);
        assert!(soft == hard || soft == 1 << 20, "soft {soft}, hard {hard}");
    }
}
