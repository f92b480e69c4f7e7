//! Bootstrap: resuming after a restart, fetching and checking the config
//! bundle, writing its files, running kubeadm, and resetting before a
//! retry.

use drover_common::bundle::ConfigBundle;
use drover_common::wire::{AssignmentNotice, CommandFailure};
use tokio::time::Instant;

use super::{Agent, Origin, Stopped, WorkKind};
use crate::command::{self, CommandOutcome, CommandSpec};
use crate::files;
use crate::protocol::config::{self, BundleRefusal, ConfigStep};
use crate::protocol::report::{self, kubeadm_step_name};
use crate::settings::Customisation;
use crate::shutdown::Shutdown;
use crate::state::{decide_resume, BootstrapProgress, BootstrapStep, ResumeAction, ResumeFiles};

impl Agent {
    pub(super) fn resume(&mut self) {
        let files = ResumeFiles::probe(&self.settings.root);
        let action = decide_resume(&self.saved.state, files);
        let message = match self.saved.origin {
            Origin::Registered { .. } => "agent started; waiting for an assignment",
            Origin::Saved => "resuming from the saved state",
        };
        tracing::info!(
            machine = %self.saved.state.machine_name,
            uid = %self.saved.state.machine_uid,
            state = %self.saved.store.path().display(),
            assignment = ?self.saved.state.bootstrap.as_ref().map(|p| &p.assignment),
            ?action,
            "{message}"
        );
        match action {
            ResumeAction::Idle | ResumeAction::Running | ResumeAction::StayFailed => {}
            ResumeAction::FetchConfig => {
                self.set_step(BootstrapStep::Assigned);
                self.want_config_now();
            }
            ResumeAction::MarkDone => {
                tracing::info!("kubeadm had finished before the restart");
                self.after_kubeadm();
            }
            ResumeAction::RunPostCommands => {
                tracing::info!("the post-kubeadm commands were interrupted; running them again");
                self.after_kubeadm();
            }
            ResumeAction::InitInterrupted => {
                let command = self.bootstrap_command().display();
                let admin = self.settings.root.join("etc/kubernetes/admin.conf");
                self.fail_bootstrap(
                    drover_common::wire::KUBEADM_INIT_STEP,
                    CommandFailure {
                        command,
                        exit_code: None,
                        output_tail: vec![format!(
                            "kubeadm init was interrupted (the agent stopped while it ran) and {} does not exist; \
                             the machine needs `kubeadm reset` before it can bootstrap again, \
                             and the agent never runs kubeadm init twice",
                            admin.display()
                        )],
                        at: drover_common::now(),
                    },
                );
            }
            ResumeAction::ResetAndRetry => {
                tracing::info!(
                    "kubeadm join or reset was interrupted; resetting and bootstrapping again"
                );
                self.reset_before_retry();
            }
        }
    }

    /// Records the `Resetting` step, then runs `kubeadm reset -f`; the
    /// bundle is fetched again once it succeeds.
    pub(super) fn reset_before_retry(&mut self) {
        self.set_step(BootstrapStep::Resetting);
        let spec = command::kubeadm_reset(&self.settings.kubeadm, &self.settings.root);
        tracing::info!(command = %spec.display(), "resetting before bootstrapping again");
        self.start_work(WorkKind::ResetBeforeRetry, spec);
    }

    /// The bootstrap under way (its assignment, bundle and step), if any.
    fn progress(&self) -> Option<&BootstrapProgress> {
        self.saved.state.bootstrap.as_ref()
    }

    pub(super) fn set_step(&mut self, step: BootstrapStep) {
        if let Some(p) = self.saved.state.bootstrap.as_mut() {
            p.step = step;
            self.persist();
        }
    }

    pub(super) fn bootstrap_command(&self) -> CommandSpec {
        let (role, path) = self
            .progress()
            .map_or((drover_common::api::MachineRole::Worker, None), |p| {
                (p.assignment.role, p.kubeadm_config_path.clone())
            });
        let mut spec = command::kubeadm_bootstrap(
            &self.settings.kubeadm,
            role,
            path.as_deref().unwrap_or("/etc/drover/kubeadm.yaml"),
            &self.settings.root,
        );
        // A restored etcd's data directory is in use, as kubeadm's
        // preflight check `DirAvailable--<dir>` would say: restoring a
        // cluster is the one case its documentation ignores it for.
        if let Some(dir) = self.progress().and_then(|p| p.restored.as_deref()) {
            spec.args.push(format!(
                "--ignore-preflight-errors=DirAvailable-{}",
                dir.replace('/', "-")
            ));
        }
        spec
    }

    pub(super) fn want_config_now(&mut self) {
        self.config.want_now(Instant::now());
    }

    pub(super) async fn fetch_config(&mut self, shutdown: &mut Shutdown) -> Result<(), Stopped> {
        let want = match &self.saved.state.bootstrap {
            Some(p) if p.step == BootstrapStep::Assigned => p.assignment.generation,
            _ => {
                self.config.stop();
                return Ok(());
            }
        };
        let answer = tokio::select! {
            r = self.coordinator.api.config() => r,
            () = shutdown.requested() => return Err(Stopped),
        };
        let now = Instant::now();
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) if e.is_unauthorized() => {
                tracing::warn!(error = %e, "the coordinator no longer accepts this machine's certificate");
                self.config.retry_at(now + self.coordinator.interval);
                return Ok(());
            }
            Err(e) => {
                let delay = self.config.retry_after_backoff(now);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot fetch the config");
                return Ok(());
            }
        };
        let ca_pem = &self.saved.state.coordinator_ca_pem;
        let uid = &self.saved.state.machine_uid;
        let step = self.config.on_answer(now, answer, want, |signed| {
            let ca = drover_common::pki::first_cert_der(ca_pem).map_err(|e| {
                BundleRefusal::Invalid(format!("the saved coordinator CA is unreadable: {e}"))
            })?;
            config::verify(signed, &ca, uid)
        });
        match step {
            ConfigStep::Apply(bundle) => match allowed_kubeadm_config(*bundle) {
                Ok(bundle) => {
                    self.logged.config_reason = None;
                    self.apply_bundle(bundle);
                }
                Err(why) => self.fail_fetch(why.to_string()),
            },
            ConfigStep::Stale {
                got,
                want,
                retry_in,
            } => {
                tracing::warn!(
                    bundle_generation = got,
                    assignment_generation = want,
                    retry_in_ms = retry_in.as_millis() as u64,
                    "refusing a config bundle older than the assignment"
                );
            }
            ConfigStep::Invalid(why) => self.fail_fetch(why),
            ConfigStep::NotReady(not_ready) => {
                if self.logged.config_reason.as_deref() != Some(not_ready.reason.as_str()) {
                    tracing::info!(
                        reason = %not_ready.reason,
                        retry_after_s = not_ready.retry_after_seconds,
                        "the config is not ready yet; waiting"
                    );
                    self.logged.config_reason = Some(not_ready.reason);
                }
            }
            ConfigStep::NotAssigned => {
                tracing::info!(
                    "the coordinator says this machine is not assigned; waiting for a heartbeat that says it is"
                );
            }
        }
        Ok(())
    }

    /// The fetched bundle is unusable: the bootstrap fails at fetch-config.
    fn fail_fetch(&mut self, why: String) {
        self.config.stop();
        self.fail_bootstrap(
            report::FETCH_CONFIG_STEP,
            config::fetch_failure(why, drover_common::now()),
        );
    }

    fn apply_bundle(&mut self, bundle: ConfigBundle) {
        let root = self.settings.root.clone();
        {
            let progress = self.saved.state.bootstrap.as_mut().expect("assigned");
            if progress.assignment.role != bundle.role
                || progress.assignment.cluster != bundle.cluster
            {
                tracing::warn!(
                    assigned = ?progress.assignment,
                    bundle_cluster = %bundle.cluster,
                    bundle_role = %bundle.role,
                    "the signed bundle differs from the assignment notice; following the bundle"
                );
            }
            progress.assignment = AssignmentNotice {
                cluster: bundle.cluster.clone(),
                role: bundle.role,
                generation: bundle.generation.max(progress.assignment.generation),
            };
        }
        tracing::info!(
            cluster = %bundle.cluster,
            role = %bundle.role,
            generation = bundle.generation,
            kubernetes_version = %bundle.kubernetes_version,
            files = bundle.files.len(),
            machine_files = bundle.machine_files.len(),
            pre_kubeadm_commands = bundle.pre_kubeadm_commands.len(),
            post_kubeadm_commands = bundle.post_kubeadm_commands.len(),
            "writing the config bundle"
        );
        let carries = !bundle.machine_files.is_empty()
            || !bundle.pre_kubeadm_commands.is_empty()
            || !bundle.post_kubeadm_commands.is_empty()
            || !bundle.addons.is_empty();
        if carries && self.settings.customisation == Customisation::Refuse {
            self.fail_bootstrap(
                report::WRITE_FILES_STEP,
                CommandFailure {
                    command: "apply the cluster's files and commands".into(),
                    exit_code: None,
                    output_tail: vec![format!(
                        "refused: the bundle carries {} files, {} pre-kubeadm and {} post-kubeadm commands, \
                         its cluster has {} addons{}, and this agent runs with --refuse-machine-customisation; \
                         nothing was written or run. Remove them from the cluster's spec, or start the agent without the flag",
                        bundle.machine_files.len(),
                        bundle.pre_kubeadm_commands.len(),
                        bundle.post_kubeadm_commands.len(),
                        bundle.addons.len(),
                        if bundle.addons.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", bundle.addons.join(", "))
                        }
                    )],
                    at: drover_common::now(),
                },
            );
            return;
        }
        // The cluster's files are checked before anything is written.
        let written = files::check_machine_files(&root, &bundle.machine_files)
            .and_then(|_| files::write_bundle_files(&root, &bundle.files))
            .and_then(|mut written| {
                if bundle.image_cni {
                    written.extend(files::install_image_cni(&root)?);
                }
                written.extend(files::write_machine_files(&root, &bundle.machine_files)?);
                Ok(written)
            });
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                self.fail_bootstrap(
                    report::WRITE_FILES_STEP,
                    CommandFailure {
                        command: format!(
                            "write {} bundle files under {}",
                            bundle.files.len() + bundle.machine_files.len(),
                            root.display()
                        ),
                        exit_code: None,
                        output_tail: vec![e.to_string()],
                        at: drover_common::now(),
                    },
                );
                return;
            }
        };
        let progress = self.saved.state.bootstrap.as_mut().expect("assigned");
        for path in written {
            if !progress.written_files.contains(&path) {
                progress.written_files.push(path);
            }
        }
        progress.kubeadm_config_path = Some(bundle.kubeadm_config_path.clone());
        progress.post_kubeadm_commands = bundle.post_kubeadm_commands.clone();
        progress.restore = bundle.restore.clone();
        progress.restored = None;
        progress.step = BootstrapStep::FilesWritten;
        self.persist();

        if bundle.pre_kubeadm_commands.is_empty() {
            self.start_kubeadm();
        } else {
            // A restart before kubeadm starts fetches the bundle again and
            // runs every command again: they must be safe to repeat.
            self.work.activity = Some(report::PRE_COMMANDS_STEP);
            self.start_commands(WorkKind::PreCommands, &bundle.pre_kubeadm_commands);
            self.heartbeat_soon();
        }
    }

    /// Runs `commands` one after another as the work of `kind`; the first
    /// that fails (or outlives its timeout) ends the run with its outcome.
    fn start_commands(&mut self, kind: WorkKind, commands: &[String]) {
        let specs: Vec<CommandSpec> = commands
            .iter()
            .map(|c| command::machine_command(c, &self.settings.root))
            .collect();
        tracing::info!(
            ?kind,
            commands = specs.len(),
            "running the cluster's machine commands"
        );
        let outcome = Box::pin(async move {
            for spec in &specs {
                let outcome = command::run(spec, command::OUTPUT_TAIL_LINES).await;
                if !outcome.success {
                    return outcome;
                }
                tracing::info!(command = %outcome.command, output_tail = %outcome.output_tail.join("\n"), "machine command succeeded");
            }
            CommandOutcome {
                command: format!("{} commands", specs.len()),
                success: true,
                exit_code: Some(0),
                output_tail: Vec::new(),
            }
        });
        self.work.running = Some(super::Work { kind, outcome });
    }

    /// The pre-kubeadm commands ended.
    pub(super) fn finish_pre_commands(&mut self, outcome: CommandOutcome) {
        if outcome.success {
            self.start_kubeadm();
        } else {
            self.fail_bootstrap(report::PRE_COMMANDS_STEP, outcome.to_failure());
        }
    }

    /// The post-kubeadm commands ended.
    pub(super) fn finish_post_commands(&mut self, outcome: CommandOutcome) {
        if outcome.success {
            tracing::info!("post-kubeadm commands done; the machine is running");
            self.set_step(BootstrapStep::Done);
            self.heartbeat_soon();
        } else {
            self.fail_bootstrap(report::POST_COMMANDS_STEP, outcome.to_failure());
        }
    }

    /// kubeadm has succeeded: the post-kubeadm commands run, if any, then
    /// the machine is running.
    fn after_kubeadm(&mut self) {
        let commands = self
            .progress()
            .map(|p| p.post_kubeadm_commands.clone())
            .unwrap_or_default();
        if commands.is_empty() {
            self.set_step(BootstrapStep::Done);
        } else {
            self.set_step(BootstrapStep::PostKubeadmCommands);
            self.start_commands(WorkKind::PostCommands, &commands);
        }
        self.heartbeat_soon();
    }

    /// Restores the cluster's etcd from the bundle's snapshot first, if it
    /// names one; then records that kubeadm may run, and starts `kubeadm
    /// init|join`.
    fn start_kubeadm(&mut self) {
        let Some(role) = self.saved.state.role() else {
            return;
        };
        if let Some(r) = self.progress().and_then(|p| p.restore.clone()) {
            self.start_restore(r);
            return;
        }
        let spec = self.bootstrap_command();
        let step = kubeadm_step_name(role);
        // The record that kubeadm may have run must exist before it runs.
        self.saved.state.bootstrap.as_mut().expect("assigned").step = BootstrapStep::KubeadmStarted;
        if let Err(e) = self.saved.store.save(&self.saved.state) {
            self.fail_bootstrap(
                step,
                CommandFailure {
                    command: spec.display(),
                    exit_code: None,
                    output_tail: vec![format!(
                        "not started, because the agent cannot record that it started: {e}"
                    )],
                    at: drover_common::now(),
                },
            );
            return;
        }
        tracing::info!(command = %spec.display(), "running kubeadm");
        self.start_work(WorkKind::Bootstrap, spec);
        self.heartbeat_soon();
    }

    /// Restores etcd from snapshot `r` ([`crate::restore`]) as the
    /// bootstrap's work.
    fn start_restore(&mut self, r: drover_common::wire::EtcdRestore) {
        let api = self.coordinator.api.clone();
        let root = self.settings.root.clone();
        let dir = self.settings.state_dir.join("snapshots");
        let command = format!(
            "restore etcd from snapshot {} into {}",
            r.snapshot, r.data_dir
        );
        tracing::info!(snapshot = %r.snapshot, revision = r.revision, member = %r.member_name, "restoring the cluster's etcd before kubeadm init");
        let outcome = Box::pin(async move {
            let restored =
                crate::restore::restore(&api, &r, &root, &dir, crate::restore::ETCDCTL).await;
            CommandOutcome::of_call(command, restored)
        });
        self.work.activity = Some(report::RESTORE_STEP);
        self.work.running = Some(super::Work {
            kind: WorkKind::RestoreEtcd,
            outcome,
        });
        self.heartbeat_soon();
    }

    /// The restore of etcd ended: kubeadm follows, or the bootstrap fails.
    pub(super) fn finish_restore(&mut self, outcome: CommandOutcome) {
        if !outcome.success {
            self.fail_bootstrap(report::RESTORE_STEP, outcome.to_failure());
            return;
        }
        tracing::info!(message = %outcome.output_tail.join(" "), "etcd restored");
        if let Some(p) = self.saved.state.bootstrap.as_mut() {
            p.restored = p.restore.take().map(|r| r.data_dir);
        }
        self.persist();
        self.start_kubeadm();
    }

    pub(super) fn fail_bootstrap(&mut self, step: &str, failure: CommandFailure) {
        tracing::error!(
            step,
            command = %failure.command,
            exit_code = ?failure.exit_code,
            output_tail = %failure.output_tail.join("\n"),
            "bootstrap failed; waiting for the coordinator to decide"
        );
        if let Some(p) = self.saved.state.bootstrap.as_mut() {
            p.step = BootstrapStep::Failed {
                step: step.to_owned(),
                failure,
            };
        }
        self.persist();
        self.heartbeat_soon();
    }

    /// kubeadm init or join ended.
    pub(super) fn finish_bootstrap(&mut self, outcome: CommandOutcome) {
        let Some(role) = self.saved.state.role() else {
            return;
        };
        if outcome.success {
            tracing::info!(command = %outcome.command, "kubeadm succeeded; the machine is running");
            // The config holds a join token, valid for its TTL: it does not
            // stay on disk once kubeadm no longer needs it.
            let config = [files::KUBEADM_CONFIG_PATH.to_owned()];
            for problem in files::remove_bundle_files(&self.settings.root, &config) {
                tracing::warn!(%problem, "cannot remove the kubeadm config, which holds a join token");
            }
            self.after_kubeadm();
        } else {
            self.fail_bootstrap(kubeadm_step_name(role), outcome.to_failure());
        }
    }

    /// The reset before bootstrapping again ended.
    pub(super) fn finish_reset_before_retry(&mut self, outcome: CommandOutcome) {
        if outcome.success {
            for problem in files::clean_after_reset(&self.settings.root) {
                tracing::warn!(%problem, "cannot remove what kubeadm reset leaves");
            }
            tracing::info!("kubeadm reset done; bootstrapping again");
            self.set_step(BootstrapStep::Assigned);
            self.want_config_now();
            self.heartbeat_soon();
        } else {
            self.fail_bootstrap(report::RESET_STEP, outcome.to_failure());
        }
    }
}

/// kubeadm runs with the config the agent allows, nothing else.
fn allowed_kubeadm_config(bundle: ConfigBundle) -> Result<ConfigBundle, KubeadmPathRefused> {
    if bundle.kubeadm_config_path != files::KUBEADM_CONFIG_PATH {
        return Err(KubeadmPathRefused {
            got: bundle.kubeadm_config_path,
        });
    }
    Ok(bundle)
}

/// A bundle that names another kubeadm config path than the agent's.
#[derive(Debug, thiserror::Error)]
#[error(
    "config bundle refused: kubeadm config path {got:?} is not {}",
    files::KUBEADM_CONFIG_PATH
)]
struct KubeadmPathRefused {
    got: String,
}
