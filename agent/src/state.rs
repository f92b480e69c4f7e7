//! The agent's persisted state: its identity and how far bootstrap has come.
//!
//! The state lives in one JSON file, `<state-dir>/state.json`, written
//! atomically by [`files::write_atomic`] (temporary file, fsync, rename, fsync
//! of the directory) with mode 0600 in a 0700 directory, because it holds the machine's private key. A
//! restarted agent reads it and resumes; it never registers a second time,
//! because the ticket it registered with is single-use.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_common::api::MachineRole;
use drover_common::pin::CaPin;
use drover_common::wire::{AssignmentNotice, CommandFailure, DirectiveResult};
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;
use time::OffsetDateTime;

use crate::files;

/// The layout version of `state.json`.
pub const STATE_VERSION: u32 = 1;

/// How many completed directive ids the agent remembers.
const COMPLETED_DIRECTIVES_KEPT: usize = 256;

/// Everything the agent must remember across restarts.
#[skip_serializing_none]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct State {
    pub version: u32,
    /// The coordinator URLs: those of the bootstrap document, then the
    /// list the coordinator last named in a heartbeat answer (every
    /// registered replica), so a restart keeps what the agent learnt.
    pub coordinators: Vec<String>,
    /// The coordinator CA pin from the bootstrap document.
    pub ca_pin: CaPin,
    /// The coordinator CA certificate received at registration; its pin
    /// equals `ca_pin`.
    pub coordinator_ca_pem: String,
    pub machine_name: String,
    pub machine_uid: String,
    /// The private key of the client certificate (PEM).
    pub key_pem: String,
    /// The client certificate (PEM).
    pub certificate_pem: String,
    #[serde(with = "time::serde::rfc3339")]
    pub certificate_not_after: OffsetDateTime,
    /// The assignment being bootstrapped or bootstrapped, if any.
    pub bootstrap: Option<BootstrapProgress>,
    /// The highest assignment generation this machine was reset away from.
    /// Only a newer assignment is bootstrapped after a reset.
    #[serde(default)]
    pub retired_generation: u64,
    /// Ids of directives already carried out, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completed_directives: Vec<String>,
    /// Directive results not yet delivered in a heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_results: Vec<DirectiveResult>,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("coordinators", &self.coordinators)
            .field("ca_pin", &self.ca_pin)
            .field("machine_name", &self.machine_name)
            .field("machine_uid", &self.machine_uid)
            .field("key_pem", &"<redacted>")
            .field("certificate_not_after", &self.certificate_not_after)
            .field("bootstrap", &self.bootstrap)
            .field("retired_generation", &self.retired_generation)
            .field("completed_directives", &self.completed_directives.len())
            .field("pending_results", &self.pending_results)
            .finish()
    }
}

/// Bootstrap progress for one assignment.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapProgress {
    pub assignment: AssignmentNotice,
    pub step: BootstrapStep,
    /// Bundle paths (absolute within the root) of every file written, so a
    /// reset can remove them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub written_files: Vec<String>,
    /// The kubeadm config path of the bundle (absolute within the root).
    pub kubeadm_config_path: Option<String>,
    /// The bundle's `postKubeadmCommands`, kept so they run (again) after a
    /// restart once kubeadm has finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_kubeadm_commands: Vec<String>,
    /// The etcd snapshot restored before `kubeadm init` (the init machine
    /// of a cluster being restored), until it is restored.
    pub restore: Option<drover_common::wire::EtcdRestore>,
    /// etcd's data directory once a snapshot is restored into it, which
    /// `kubeadm init` then finds in use, as it must.
    pub restored: Option<String>,
}

/// How far bootstrap of an assignment has come.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "camelCase", deny_unknown_fields)]
pub enum BootstrapStep {
    /// Assigned; the config bundle has not been applied yet.
    Assigned,
    /// `kubeadm reset -f` runs before bootstrapping again, after an
    /// interrupted join or before retrying a failed bootstrap.
    Resetting,
    /// The bundle's files are on disk; kubeadm has not been started.
    FilesWritten,
    /// kubeadm was started. Written before the process is spawned, so a crash
    /// at any point afterwards is seen as "maybe ran".
    KubeadmStarted,
    /// kubeadm succeeded; the bundle's `postKubeadmCommands` run. A
    /// restart runs them again from the first.
    PostKubeadmCommands,
    /// kubeadm succeeded; the machine is part of its cluster.
    Done,
    /// A step failed; the coordinator decides what happens next.
    Failed {
        /// The reported step name, such as `kubeadm-init`.
        step: String,
        failure: CommandFailure,
    },
}

impl State {
    /// Whether a directive with this id was already carried out.
    pub fn directive_completed(&self, id: &str) -> bool {
        self.completed_directives.iter().any(|d| d == id)
    }

    /// Records a directive as carried out and queues its result for the
    /// next heartbeat.
    pub fn complete_directive(&mut self, result: DirectiveResult) {
        if !self.directive_completed(&result.id) {
            self.completed_directives.push(result.id.clone());
        }
        let excess = self
            .completed_directives
            .len()
            .saturating_sub(COMPLETED_DIRECTIVES_KEPT);
        self.completed_directives.drain(..excess);
        self.pending_results.push(result);
    }

    /// The generation reported as applied: that of the assignment being
    /// bootstrapped or bootstrapped, 0 when there is none.
    pub fn applied_generation(&self) -> u64 {
        self.bootstrap
            .as_ref()
            .map_or(0, |p| p.assignment.generation)
    }

    /// The role of the current assignment, if any.
    pub fn role(&self) -> Option<MachineRole> {
        self.bootstrap.as_ref().map(|p| p.assignment.role)
    }

    /// Whether bootstrap finished successfully.
    pub fn bootstrapped(&self) -> bool {
        matches!(
            self.bootstrap.as_ref().map(|p| &p.step),
            Some(BootstrapStep::Done)
        )
    }
}

/// Which files kubeadm leaves behind that tell whether it finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumeFiles {
    /// `<root>/etc/kubernetes/admin.conf`, written by `kubeadm init`.
    pub admin_conf: bool,
    /// `<root>/etc/kubernetes/kubelet.conf`, written by `kubeadm join`.
    pub kubelet_conf: bool,
}

impl ResumeFiles {
    /// Looks for the files under `root`.
    pub fn probe(root: &Path) -> Self {
        Self {
            admin_conf: root.join("etc/kubernetes/admin.conf").exists(),
            kubelet_conf: root.join("etc/kubernetes/kubelet.conf").exists(),
        }
    }
}

/// What a restarted agent does about the bootstrap it finds in its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeAction {
    /// No assignment: wait for one.
    Idle,
    /// kubeadm never started: fetch the bundle again and carry on.
    FetchConfig,
    /// kubeadm finished before the restart: run the post-kubeadm commands
    /// (if any), then record bootstrap as done.
    MarkDone,
    /// The post-kubeadm commands were interrupted: run them again.
    RunPostCommands,
    /// `kubeadm init` was interrupted: report failure and never rerun it.
    InitInterrupted,
    /// `kubeadm join` (or a reset before a retry) was interrupted:
    /// `kubeadm reset -f`, then fetch the bundle and bootstrap again.
    ResetAndRetry,
    /// Bootstrap had finished: keep running.
    Running,
    /// Bootstrap had failed: keep reporting the failure.
    StayFailed,
}

/// Decides how to resume after a restart. Pure, so the rules are tested
/// without any IO: `kubeadm init` must never run twice.
pub fn decide_resume(state: &State, files: ResumeFiles) -> ResumeAction {
    let Some(progress) = &state.bootstrap else {
        return ResumeAction::Idle;
    };
    match (&progress.step, progress.assignment.role) {
        (BootstrapStep::Assigned | BootstrapStep::FilesWritten, _) => ResumeAction::FetchConfig,
        (BootstrapStep::Resetting, _) => ResumeAction::ResetAndRetry,
        (BootstrapStep::KubeadmStarted, MachineRole::Init) => {
            if files.admin_conf {
                ResumeAction::MarkDone
            } else {
                ResumeAction::InitInterrupted
            }
        }
        (BootstrapStep::KubeadmStarted, MachineRole::ControlPlane | MachineRole::Worker) => {
            if files.kubelet_conf {
                ResumeAction::MarkDone
            } else {
                ResumeAction::ResetAndRetry
            }
        }
        (BootstrapStep::PostKubeadmCommands, _) => ResumeAction::RunPostCommands,
        (BootstrapStep::Done, _) => ResumeAction::Running,
        (BootstrapStep::Failed { .. }, _) => ResumeAction::StayFailed,
    }
}

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot create the state directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot read the state file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("the state file {path} is corrupt ({detail}); move it away to start over (the machine must then register again with a new ticket)")]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "the state file {path} has layout version {found}, this agent understands {STATE_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("cannot write the state file {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// Reads and writes `state.json` in a state directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
    path: PathBuf,
}

impl StateStore {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            path: dir.join("state.json"),
        }
    }

    /// The path of the state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the state, or `None` when there is no state file yet.
    pub fn load(&self) -> Result<Option<State>, StateError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Read {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let versioned: Versioned =
            serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
        if versioned.version != STATE_VERSION {
            return Err(StateError::Version {
                path: self.path.clone(),
                found: versioned.version,
            });
        }
        let state = serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
            path: self.path.clone(),
            detail: e.to_string(),
        })?;
        Ok(Some(state))
    }

    /// Writes the state atomically: a reader sees the old or the new file,
    /// never a mix, even after a power cut.
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        self.ensure_dir()?;
        let text = serde_json::to_vec_pretty(state).expect("state serializes");
        files::write_atomic(&self.path, &text, 0o600).map_err(|source| StateError::Write {
            path: self.path.clone(),
            source,
        })
    }

    fn ensure_dir(&self) -> Result<(), StateError> {
        if self.dir.is_dir() {
            return Ok(());
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .and_then(|()| fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700)))
            .map_err(|source| StateError::CreateDir {
                path: self.dir.clone(),
                source,
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_state() -> State {
        State {
            version: STATE_VERSION,
            coordinators: vec!["https://127.0.0.1:8443".into()],
            ca_pin: CaPin::from_spki_der(b"x"),
            coordinator_ca_pem: "-----BEGIN CERTIFICATE-----\n".into(),
            machine_name: "m-1".into(),
            machine_uid: "uid-1".into(),
            key_pem: "secret key".into(),
            certificate_pem: "cert".into(),
            certificate_not_after: OffsetDateTime::from_unix_timestamp(2_000_000_000).unwrap(),
            bootstrap: None,
            retired_generation: 0,
            completed_directives: vec![],
            pending_results: vec![],
        }
    }

    fn with_step(role: MachineRole, step: BootstrapStep) -> State {
        let mut s = sample_state();
        s.bootstrap = Some(BootstrapProgress {
            assignment: AssignmentNotice {
                cluster: "c".into(),
                role,
                generation: 3,
            },
            step,
            written_files: vec!["/etc/drover/kubeadm.yaml".into()],
            kubeadm_config_path: Some("/etc/drover/kubeadm.yaml".into()),
            post_kubeadm_commands: vec![],
            restore: None,
            restored: None,
        });
        s
    }

    #[test]
    fn round_trip_with_modes() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(&dir.path().join("var/lib/drover-agent"));
        assert!(store.load().unwrap().is_none());
        let mut state = with_step(
            MachineRole::Worker,
            BootstrapStep::Failed {
                step: "kubeadm-join".into(),
                failure: CommandFailure {
                    command: "kubeadm join --config /etc/drover/kubeadm.yaml".into(),
                    exit_code: Some(1),
                    output_tail: vec!["error".into()],
                    at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
                },
            },
        );
        state.complete_directive(DirectiveResult {
            id: "d1".into(),
            ok: true,
            message: String::new(),
        });
        store.save(&state).unwrap();
        assert_eq!(store.load().unwrap().unwrap(), state);
        state.bootstrap = None;
        store.save(&state).unwrap();
        assert_eq!(store.load().unwrap().unwrap(), state);

        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(store.path()), 0o600);
        assert_eq!(mode(store.path().parent().unwrap()), 0o700);
        let text = fs::read_to_string(store.path()).unwrap();
        assert!(text.contains("\"machineUid\": \"uid-1\""), "{text}");
        assert!(!format!("{state:?}").contains("secret key"));
    }

    #[test]
    fn corrupt_and_future_state_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        fs::write(store.path(), "{not json").unwrap();
        assert!(matches!(store.load(), Err(StateError::Corrupt { .. })));
        fs::write(store.path(), r#"{"version": 9}"#).unwrap();
        assert!(matches!(
            store.load(),
            Err(StateError::Version { found: 9, .. })
        ));
    }

    #[test]
    fn step_is_tagged_json() {
        let s = with_step(MachineRole::Init, BootstrapStep::KubeadmStarted);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["bootstrap"]["step"]["name"], "kubeadmStarted");
        assert_eq!(v["bootstrap"]["assignment"]["role"], "init");
    }

    #[test]
    fn resume_never_reruns_init() {
        use BootstrapStep::*;
        use MachineRole::*;
        let none = ResumeFiles::default();
        let admin = ResumeFiles {
            admin_conf: true,
            kubelet_conf: true,
        };
        let kubelet = ResumeFiles {
            admin_conf: false,
            kubelet_conf: true,
        };
        assert_eq!(decide_resume(&sample_state(), none), ResumeAction::Idle);
        let check = |role, step, files, want| {
            assert_eq!(decide_resume(&with_step(role, step), files), want);
        };
        check(Init, Assigned, none, ResumeAction::FetchConfig);
        check(Init, FilesWritten, none, ResumeAction::FetchConfig);
        check(Init, KubeadmStarted, none, ResumeAction::InitInterrupted);
        // kubelet.conf alone does not prove init finished.
        check(Init, KubeadmStarted, kubelet, ResumeAction::InitInterrupted);
        check(Init, KubeadmStarted, admin, ResumeAction::MarkDone);
        for role in [ControlPlane, Worker] {
            check(role, KubeadmStarted, none, ResumeAction::ResetAndRetry);
            check(role, KubeadmStarted, kubelet, ResumeAction::MarkDone);
        }
        // An interrupted reset before a retry is simply run again; init is
        // only ever run after it finished.
        check(Init, Resetting, admin, ResumeAction::ResetAndRetry);
        check(Worker, Done, none, ResumeAction::Running);
        check(
            Init,
            PostKubeadmCommands,
            admin,
            ResumeAction::RunPostCommands,
        );
        check(
            Worker,
            PostKubeadmCommands,
            none,
            ResumeAction::RunPostCommands,
        );
        let failed = Failed {
            step: "kubeadm-init".into(),
            failure: CommandFailure {
                command: "kubeadm init".into(),
                exit_code: None,
                output_tail: vec![],
                at: OffsetDateTime::UNIX_EPOCH,
            },
        };
        check(Init, failed, admin, ResumeAction::StayFailed);
    }

    #[test]
    fn completed_directives_are_bounded() {
        let mut s = sample_state();
        for i in 0..(COMPLETED_DIRECTIVES_KEPT + 10) {
            s.complete_directive(DirectiveResult {
                id: format!("d{i}"),
                ok: true,
                message: String::new(),
            });
        }
        assert_eq!(s.completed_directives.len(), COMPLETED_DIRECTIVES_KEPT);
        assert!(!s.directive_completed("d0"));
        assert!(s.directive_completed(&format!("d{}", COMPLETED_DIRECTIVES_KEPT + 9)));
    }
}
