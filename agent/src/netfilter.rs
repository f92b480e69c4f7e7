//! What kube-proxy leaves in the kernel after `kubeadm reset`, which says
//! so itself: reset cleans neither iptables rules nor IPVS tables. A
//! machine going back to its pool must not carry another cluster's Service
//! rules into the next one. Only kube-proxy's own state goes: the chains
//! named `KUBE-*` and the rules that jump to them (iptables mode, IPv4 and
//! IPv6), its `kube-proxy` nftables tables (nftables mode), and in IPVS
//! mode its virtual servers and its `kube-ipvs0` interface. The host's
//! other rules stay as they are.
//!
//! A tool that is not installed is skipped: a machine without it cannot
//! have such rules written by it either.

use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// Removes what kube-proxy wrote; returns what could not be removed, with
/// why.
pub fn remove_kube_proxy_rules() -> Vec<String> {
    let mut problems = Vec::new();
    for (save, restore) in [
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ] {
        let dump = match run(save, &[], None) {
            Ok(Some(dump)) => dump,
            Ok(None) => continue,
            Err(why) => {
                problems.push(why.to_string());
                continue;
            }
        };
        if let Some(kept) = without_kube_rules(&dump) {
            if let Err(why) = run(restore, &[], Some(&kept)) {
                problems.push(why.to_string());
            } else {
                tracing::info!(tool = restore, "removed kube-proxy's iptables rules");
            }
        }
    }
    match run("nft", &["list", "tables"], None) {
        Ok(Some(tables)) => {
            for (family, table) in kube_proxy_nft_tables(&tables) {
                if let Err(why) = run("nft", &["delete", "table", family, table], None) {
                    problems.push(why.to_string());
                }
            }
        }
        Ok(None) => {}
        Err(why) => problems.push(why.to_string()),
    }
    // IPVS mode shows in its dummy interface, which holds every Service
    // address; without it there is nothing of kube-proxy's in IPVS.
    if Path::new("/sys/class/net/kube-ipvs0").exists() {
        for (tool, args) in [
            ("ipvsadm", &["--clear"][..]),
            ("ip", &["link", "delete", "kube-ipvs0"][..]),
        ] {
            if let Err(why) = run(tool, args, None) {
                problems.push(why.to_string());
            }
        }
    }
    problems
}

/// `dump` (what `iptables-save` prints) without kube-proxy's chains and the
/// rules that jump or go to them, for `iptables-restore`; `None` when it
/// holds nothing of kube-proxy's, so nothing needs restoring.
pub fn without_kube_rules(dump: &str) -> Option<String> {
    if !dump.lines().any(is_kube_proxy_line) {
        return None;
    }
    Some(
        dump.lines()
            .filter(|l| !is_kube_proxy_line(l))
            .map(|l| format!("{l}\n"))
            .collect(),
    )
}

/// The `(family, name)` of kube-proxy's tables in what `nft list tables`
/// prints (`table ip kube-proxy`).
pub fn kube_proxy_nft_tables(listing: &str) -> Vec<(&str, &str)> {
    listing
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("table"), Some(family), Some("kube-proxy")) => Some((family, "kube-proxy")),
                _ => None,
            }
        })
        .collect()
}

/// A chain of kube-proxy's (`:KUBE-...`), a rule in one (`-A KUBE-...`),
/// or a rule that jumps or goes to one.
fn is_kube_proxy_line(line: &str) -> bool {
    if line.starts_with(":KUBE-") || line.starts_with("-A KUBE-") {
        return true;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .any(|w| matches!(w[0], "-j" | "--jump" | "-g" | "--goto") && w[1].starts_with("KUBE-"))
}

/// Why a tool that is installed did not do its part.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// It could not be started, fed its input or waited for.
    #[error("{command}: cannot {doing}: {source}")]
    Io {
        command: String,
        doing: &'static str,
        source: io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// Runs `tool` with `args` (and `input` on its standard input): its
/// output, `None` when the tool is not installed, or why it failed.
fn run(tool: &str, args: &[&str], input: Option<&str>) -> Result<Option<String>, ToolError> {
    let command = std::iter::once(tool)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let spawned = Command::new(tool)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let io = |doing: &'static str| {
        let command = command.clone();
        move |source| ToolError::Io {
            command,
            doing,
            source,
        }
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("run it")(e)),
    };
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        if let Err(e) = stdin.write_all(text.as_bytes()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io("write its input")(e));
        }
    }
    let out = child.wait_with_output().map_err(io("wait for it"))?;
    if !out.status.success() {
        return Err(ToolError::Failed {
            command,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `iptables-save` prints on a node whose kube-proxy ran in
    /// iptables mode, next to the host's own rules (trimmed).
    const DUMP: &str = "\
# Generated by iptables-save v1.8.9 (nf_tables) on Tue Nov 24 10:00:00 2026
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A FORWARD -i docker0 -j ACCEPT
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -g KUBE-SERVICES
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" --jump KUBE-POSTROUTING
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
COMMIT
";

    #[test]
    fn kube_proxy_rules_go_and_the_hosts_stay() {
        let kept = without_kube_rules(DUMP).expect("kube-proxy's rules are found");
        assert!(!kept.contains("KUBE-"), "{kept}");
        for host_rule in [
            "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
            "-A FORWARD -i docker0 -j ACCEPT",
            "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
            ":FORWARD DROP [0:0]",
        ] {
            assert!(kept.contains(host_rule), "{host_rule} is kept: {kept}");
        }
        // Still a whole dump iptables-restore takes: both tables committed.
        assert_eq!(kept.matches("COMMIT\n").count(), 2);
        assert!(kept.contains("*filter\n") && kept.contains("*nat\n"));
    }

    #[test]
    fn a_dump_without_kube_proxy_rules_is_left_alone() {
        let host_only = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n";
        assert_eq!(without_kube_rules(host_only), None);
        // A chain that merely contains the letters is not kube-proxy's.
        assert_eq!(
            without_kube_rules(
                "*filter\n:MY-KUBE-RULES - [0:0]\n-A INPUT -j MY-KUBE-RULES\nCOMMIT\n"
            ),
            None
        );
    }

    #[test]
    fn tools_get_their_input_and_a_missing_one_is_skipped() {
        assert_eq!(
            run("sh", &["-c", "cat"], Some("*filter\nCOMMIT\n")).unwrap(),
            Some("*filter\nCOMMIT\n".to_owned())
        );
        assert_eq!(run("drover-no-such-tool", &[], None).unwrap(), None);
        let failed = run("sh", &["-c", "echo refused >&2; exit 3"], None).unwrap_err();
        let message = failed.to_string();
        assert!(
            message.starts_with("sh -c echo refused >&2; exit 3 failed")
                && message.ends_with(": refused"),
            "{message}"
        );
    }

    #[test]
    fn only_kube_proxy_nft_tables_are_named() {
        let listing =
            "table inet filter\ntable ip kube-proxy\ntable ip6 kube-proxy\ntable ip nat\n";
        assert_eq!(
            kube_proxy_nft_tables(listing),
            [("ip", "kube-proxy"), ("ip6", "kube-proxy")]
        );
        assert!(kube_proxy_nft_tables("table inet filter\n").is_empty());
    }
}
