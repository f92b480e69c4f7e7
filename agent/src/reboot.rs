//! Reboots the coordinator's remediation asks for (the `Reboot` directive),
//! as kured does for its nodes: cordon the Node, reboot, and uncordon it
//! once the machine is back.
//!
//! - **Boot ID**: what says the machine rebooted: the kernel's
//!   (`/proc/sys/kernel/random/boot_id`, a Node's `nodeInfo.bootID`) with
//!   the start time of PID 1 (`/proc/1/stat`), so a container machine that
//!   was restarted counts as rebooted too; or the content of
//!   `--boot-id-file`. The agent reports it with every heartbeat.
//! - **Before**: the agent cordons its own Node with the kubelet's
//!   credentials (a node may change its own `spec.unschedulable`; a machine
//!   not joined yet has no Node, and is rebooted anyway), records what it
//!   did in `<state-dir>/reboot.json` (the directive, the boot ID, the Node
//!   it cordoned), then runs the reboot command (`systemctl reboot`).
//! - **After**: a heartbeat that finds the record and another boot ID
//!   uncordons the Node the agent cordoned (again at each heartbeat until
//!   the API server takes it) and removes the record. The same directive
//!   asked again once the boot ID changed (its result was lost in the
//!   reboot) is answered done without a second reboot.
//!
//! Invariant: the agent never uncordons a Node it did not cordon itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::podnet::KubeletClient;

/// The record of a reboot asked for, in the agent's state directory.
pub const RECORD: &str = "reboot.json";

/// How long the reboot command may take to return (`systemctl reboot`
/// returns once the shutdown is queued).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What the agent did before a reboot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The directive's id.
    pub id: String,
    /// The boot ID before the reboot.
    pub boot_id: Option<String>,
    /// The Node the agent cordoned, if it did.
    pub cordoned: Option<String>,
}

/// `--reboot-command`'s default: systemd reboots the machine.
pub const DEFAULT_COMMAND: &[&str] = &["systemctl", "reboot"];

/// A `--reboot-command` that names no program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("is empty; give a program and its arguments, such as \"systemctl reboot\"")]
pub struct EmptyCommand;

/// `--reboot-command` split into the program and its arguments.
pub fn parse_command(text: &str) -> Result<Vec<String>, EmptyCommand> {
    let argv: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    if argv.is_empty() {
        return Err(EmptyCommand);
    }
    Ok(argv)
}

/// The machine's boot ID: `file`'s content, or the kernel's with the start
/// time of PID 1; `None` when it cannot be read.
pub fn boot_id(file: Option<&Path>) -> Option<String> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    if let Some(f) = file {
        return read(f);
    }
    let kernel = read(Path::new("/proc/sys/kernel/random/boot_id"))?;
    let init_started = std::fs::read_to_string("/proc/1/stat")
        .ok()
        .and_then(|s| pid_start_time(&s));
    Some(match init_started {
        Some(t) => format!("{kernel}/{t}"),
        None => kernel,
    })
}

/// Field 22 of a `/proc/PID/stat` line (the start time after boot, in
/// clock ticks); the command name in field 2 may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn pid_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(RECORD)
}

/// The record of a reboot asked for, if any.
pub fn load(state_dir: &Path) -> Option<Record> {
    let text = std::fs::read(record_path(state_dir)).ok()?;
    match serde_json::from_slice(&text) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "the reboot record is unreadable; ignoring it");
            None
        }
    }
}

fn save(state_dir: &Path, record: &Record) -> std::io::Result<()> {
    let text = serde_json::to_vec(record).expect("a record serialises");
    drover_common::fsutil::write_atomic(&record_path(state_dir), &text, 0o600)
}

fn clear(state_dir: &Path) {
    if let Err(e) = std::fs::remove_file(record_path(state_dir)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(error = %e, "cannot remove the reboot record");
        }
    }
}

/// Why a reboot was not asked of the init system.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("cannot record the reboot in {path}: {source}; nothing was done")]
    Record {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Command(String),
}

/// Everything a reboot needs to know of the machine.
pub struct Machine<'a> {
    pub root: &'a Path,
    pub state_dir: &'a Path,
    pub command: &'a [String],
    pub boot_id_file: Option<&'a Path>,
}

/// Carries out reboot directive `id`: cordons the Node, records it, and
/// runs the reboot command. The message says what was done.
pub async fn reboot(m: Machine<'_>, id: &str, reason: &str) -> Result<String, RebootError> {
    let boot = boot_id(m.boot_id_file);
    if let Some(r) = load(m.state_dir).filter(|r| r.id == id) {
        if boot.is_some() && r.boot_id != boot {
            return Ok(format!(
                "rebooted already for {id} (boot ID {} now)",
                boot.unwrap_or_default()
            ));
        }
    }
    if m.root != Path::new("/") && m.command == DEFAULT_COMMAND {
        return Err(RebootError::Command(format!(
            "this agent manages the machine under --root {}, not this host: it will not reboot the host with `{}`; set --reboot-command to what reboots that machine",
            m.root.display(),
            DEFAULT_COMMAND.join(" ")
        )));
    }
    tracing::info!(%reason, directive = %id, "rebooting this machine at the coordinator's request");
    let mut kubelet = KubeletClient::default();
    let (cordoned, note) = match kubelet.set_unschedulable(m.root, true).await {
        Ok(node) => (Some(node.clone()), format!("node {node} cordoned")),
        Err(e) => {
            tracing::warn!(error = %e, "rebooting without cordoning the Node");
            (None, format!("the Node was not cordoned ({e})"))
        }
    };
    let record = Record {
        id: id.to_owned(),
        boot_id: boot,
        cordoned: cordoned.clone(),
    };
    save(m.state_dir, &record).map_err(|source| RebootError::Record {
        path: record_path(m.state_dir),
        source,
    })?;
    let spec = crate::command::reboot(m.command, COMMAND_TIMEOUT);
    let outcome = crate::command::run(&spec, crate::command::OUTPUT_TAIL_LINES).await;
    if outcome.success {
        return Ok(format!(
            "{note}; {} asked the init system to reboot",
            spec.display()
        ));
    }
    // Not rebooting after all: the Node serves again.
    clear(m.state_dir);
    if cordoned.is_some() {
        if let Err(e) = kubelet.set_unschedulable(m.root, false).await {
            tracing::warn!(error = %e, "cannot uncordon the Node after a failed reboot command");
        }
    }
    Err(RebootError::Command(format!(
        "{}; the Node was left as it was",
        outcome.summary()
    )))
}

/// After a reboot (a record and another boot ID than its own): uncordons
/// the Node the agent cordoned and removes the record. Until the API
/// server takes the uncordon, the record stays for the next heartbeat.
pub async fn after_reboot(root: &Path, state_dir: &Path, boot: Option<&str>) {
    let Some(record) = load(state_dir) else {
        return;
    };
    if boot.is_none() || record.boot_id.as_deref() == boot {
        return;
    }
    if let Some(node) = &record.cordoned {
        match KubeletClient::default()
            .set_unschedulable(root, false)
            .await
        {
            Ok(_) => {
                tracing::info!(%node, directive = %record.id, "back from the reboot; node uncordoned")
            }
            Err(e) => {
                tracing::info!(%node, error = %e, "back from the reboot; the node cannot be uncordoned yet");
                return;
            }
        }
    } else {
        tracing::info!(directive = %record.id, "back from the reboot");
    }
    clear(state_dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_of_a_process_is_field_22_whatever_its_name() {
        let stat = "1 (my (odd) init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 4242 1000 10";
        assert_eq!(pid_start_time(stat), Some(4242));
        assert_eq!(pid_start_time("garbage"), None);
    }

    #[test]
    fn the_boot_id_comes_from_the_kernel_or_the_given_file() {
        let kernel = boot_id(None).expect("this kernel has a boot ID");
        assert!(kernel.contains('/'), "{kernel}");
        assert_eq!(boot_id(None), Some(kernel));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("boot");
        assert_eq!(boot_id(Some(&f)), None);
        std::fs::write(&f, "abc\n").unwrap();
        assert_eq!(boot_id(Some(&f)).as_deref(), Some("abc"));
    }

    #[test]
    fn a_reboot_command_is_a_program_and_its_arguments() {
        assert_eq!(
            parse_command(" systemctl  reboot ").unwrap(),
            vec!["systemctl", "reboot"]
        );
        assert_eq!(parse_command("systemctl reboot").unwrap(), DEFAULT_COMMAND);
        assert!(parse_command("  ")
            .unwrap_err()
            .to_string()
            .contains("is empty"));
    }

    fn machine<'a>(dir: &'a Path, command: &'a [String], boot: &'a Path) -> Machine<'a> {
        Machine {
            root: dir,
            state_dir: dir,
            command,
            boot_id_file: Some(boot),
        }
    }

    #[tokio::test]
    async fn an_agent_of_a_machine_under_another_root_never_reboots_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot");
        let default: Vec<String> = DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect();
        let e = reboot(machine(dir.path(), &default, &boot), "reboot-1", "x")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("will not reboot the host"), "{e}");
        assert!(load(dir.path()).is_none());
    }

    #[tokio::test]
    async fn a_refused_reboot_leaves_no_record_and_one_done_is_not_done_twice() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot");
        std::fs::write(&boot, "one").unwrap();
        // No kubelet.conf: not cordoned, and the command fails.
        let refused = vec!["false".to_owned()];
        let e = reboot(machine(dir.path(), &refused, &boot), "reboot-1", "x")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("false exited with code 1"), "{e}");
        assert!(load(dir.path()).is_none());
        // The command "reboots": the record holds the boot ID before.
        let ok = vec!["true".to_owned()];
        let said = reboot(machine(dir.path(), &ok, &boot), "reboot-2", "x")
            .await
            .unwrap();
        assert!(
            said.contains("the Node was not cordoned")
                && said.contains("true asked the init system"),
            "{said}"
        );
        assert_eq!(load(dir.path()).unwrap().boot_id.as_deref(), Some("one"));
        // Back with another boot ID: the same directive is done, not
        // carried out again (the command would fail if it ran).
        std::fs::write(&boot, "two").unwrap();
        let said = reboot(machine(dir.path(), &refused, &boot), "reboot-2", "x")
            .await
            .unwrap();
        assert!(said.contains("rebooted already"), "{said}");
        // After the reboot the record goes (nothing was cordoned).
        after_reboot(dir.path(), dir.path(), Some("two")).await;
        assert!(load(dir.path()).is_none());
    }
}
