//! Directives: accepting them from heartbeat answers (each once),
//! carrying them out one at a time, and queueing their results.

use drover_common::api::UpgradeCommand;
use drover_common::kubeadm::{
    UPGRADE_KUBEADM_HOOK as KUBEADM_HOOK, UPGRADE_KUBELET_HOOK as KUBELET_HOOK,
};
use drover_common::wire::{Directive, DirectiveAction, DirectiveResult};

use super::{Agent, WorkKind};
use crate::command::{self, CommandOutcome, CommandSpec};
use crate::files;
use crate::protocol::directives::{describe, may_create_token};
use crate::protocol::report;
use crate::state::BootstrapStep;

/// What a directive asks done to a Node.
#[derive(Debug, Clone, Copy)]
enum NodeCall {
    Delete,
    Drain(crate::kube::DrainOptions),
    Uncordon,
}

impl Agent {
    pub(super) fn accept_directives(&mut self, directives: Vec<Directive>) {
        for directive in directives {
            let running = matches!(
                self.work.running.as_ref().map(|w| &w.kind),
                Some(WorkKind::TokenCreate { id, .. } | WorkKind::Reset { id } | WorkKind::ClusterCall { id }) if *id == directive.id
            );
            if running
                || self.saved.state.directive_completed(&directive.id)
                || self.work.queue.iter().any(|d| d.id == directive.id)
            {
                continue;
            }
            tracing::info!(id = %directive.id, action = %describe(&directive.action), "directive received");
            self.work.queue.push_back(directive);
        }
    }

    pub(super) fn start_queued_directives(&mut self) {
        while self.work.running.is_none() {
            let Some(directive) = self.work.queue.pop_front() else {
                return;
            };
            match directive.action {
                DirectiveAction::CreateBootstrapToken { token, ttl_seconds } => {
                    if !may_create_token(self.saved.state.bootstrapped(), self.saved.state.role()) {
                        self.finish_directive(
                            directive.id,
                            false,
                            format!(
                                "this machine cannot create bootstrap tokens: it is not a running control-plane machine (phase {:?}, role {})",
                                self.phase(),
                                self.saved.state.role().map_or("none".to_owned(), |r| r.to_string())
                            ),
                        );
                        continue;
                    }
                    let spec = command::kubeadm_token_create(
                        &self.settings.kubeadm,
                        &token,
                        ttl_seconds,
                        &self.settings.root,
                    );
                    tracing::info!(command = %spec.display(), "creating a bootstrap token");
                    self.start_work(
                        WorkKind::TokenCreate {
                            id: directive.id,
                            token_id: token.id().to_owned(),
                        },
                        spec,
                    );
                }
                DirectiveAction::RemoveEtcdMember { id, name } => {
                    tracing::info!(member = %id, name = %name, "removing an etcd member at the coordinator's request");
                    let own = self.settings.hostname.clone();
                    let mut etcd = crate::etcd::Etcd::new(&self.settings.root);
                    self.start_cluster_call(directive.id, "remove etcd members", |ip, _| {
                        let endpoint = crate::etcd::local_endpoint(ip);
                        let command = format!("etcd member remove {id} ({name}) via {endpoint}");
                        let call =
                            async move { Ok(etcd.remove(&endpoint, &id, &name, &own).await?) };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::DeleteNode { node } => {
                    self.start_node_call(directive.id, node, NodeCall::Delete);
                }
                DirectiveAction::DrainNode {
                    node,
                    delete_pods_without_controller,
                    delete_empty_dir_data,
                } => {
                    let options = crate::kube::DrainOptions {
                        delete_pods_without_controller,
                        delete_empty_dir_data,
                    };
                    self.start_node_call(directive.id, node, NodeCall::Drain(options));
                }
                DirectiveAction::UncordonNode { node } => {
                    self.start_node_call(directive.id, node, NodeCall::Uncordon);
                }
                DirectiveAction::UpgradeKubernetes { version, command } => {
                    self.start_upgrade(directive.id, version, command);
                }
                DirectiveAction::RenewCertificates { reason } => {
                    tracing::info!(%reason, "renewing the kubeadm certificates at the coordinator's request");
                    let spec =
                        command::kubeadm_certs_renew(&self.settings.kubeadm, &self.settings.root);
                    let manifests = self.settings.root.join("etc/kubernetes/manifests");
                    let wait = self.settings.static_pod_restart_wait;
                    self.start_cluster_call(directive.id, "renew certificates", |_, _| {
                        let command = spec.display();
                        let call = async move {
                            run_bounded(&spec, CERTS_RENEW_TIMEOUT).await?;
                            let restarted =
                                crate::certificates::restart_static_pods(&manifests, wait).await?;
                            Ok(format!(
                                "certificates renewed; static Pods restarted: {}",
                                restarted.join(", ")
                            ))
                        };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::ApplyManifests { addon, .. }
                    if self.settings.customisation == crate::settings::Customisation::Refuse =>
                {
                    tracing::warn!(%addon, "refusing to apply an addon: this agent runs with --refuse-machine-customisation");
                    self.finish_directive(
                        directive.id,
                        false,
                        format!(
                            "refused: addon {addon} is manifests the coordinator sent, and this agent runs with \
                             --refuse-machine-customisation; nothing was applied. Remove the addon from the cluster's \
                             spec, or start the agent without the flag"
                        ),
                    );
                }
                DirectiveAction::ApplyManifests { addon, manifests } => {
                    tracing::info!(%addon, bytes = manifests.len(), "applying an addon at the coordinator's request");
                    let mut kube = crate::kube::Kube::new(&self.settings.root);
                    self.start_cluster_call(directive.id, "apply addons", |ip, port| {
                        let api = crate::kube::local_api(ip, port);
                        let command = format!(
                            "server-side apply of addon {addon} (field manager drover) via {api}"
                        );
                        let call = async move {
                            Ok(kube.apply_manifests(&api, &addon, &manifests).await?)
                        };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::ApplyImageManifests { addon } => {
                    let path = self
                        .settings
                        .root
                        .join(drover_common::api::IMAGE_CNI_DIR.trim_start_matches('/'));
                    let path = path.join("manifests.yaml");
                    let manifests = match std::fs::read_to_string(&path) {
                        Ok(m) => m,
                        Err(e) => {
                            self.finish_directive(
                                directive.id,
                                false,
                                format!(
                                    "addon {addon}: the node image has no default CNI manifest: cannot read {}: {e}; use an image that ships one, or spec.network.cni: none with a network addon",
                                    path.display()
                                ),
                            );
                            continue;
                        }
                    };
                    tracing::info!(%addon, path = %path.display(), "applying the image's pod network at the coordinator's request");
                    let mut kube = crate::kube::Kube::new(&self.settings.root);
                    self.start_cluster_call(directive.id, "apply addons", |ip, port| {
                        let api = crate::kube::local_api(ip, port);
                        let command = format!(
                            "server-side apply of addon {addon} from {} (field manager drover) via {api}",
                            path.display()
                        );
                        let call =
                            async move { Ok(kube.apply_manifests(&api, &addon, &manifests).await?) };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::SaveEtcdSnapshot { snapshot } => {
                    tracing::info!(%snapshot, "saving an etcd snapshot at the coordinator's request");
                    let api = self.coordinator.api.clone();
                    let mut etcd = crate::etcd::Etcd::new(&self.settings.root);
                    let dir = self.settings.state_dir.join("snapshots");
                    self.start_cluster_call(directive.id, "save etcd snapshots", |ip, _| {
                        let endpoint = crate::etcd::local_endpoint(ip);
                        let command = format!("etcd snapshot {snapshot} via {endpoint}");
                        let call = async move {
                            Ok(crate::snapshot::save_and_upload(
                                &api, &mut etcd, &endpoint, &snapshot, &dir,
                            )
                            .await?)
                        };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::TakeInventory { snapshot } => {
                    tracing::info!(%snapshot, "taking this drill cluster's inventory at the coordinator's request");
                    let api = self.coordinator.api.clone();
                    let mut kube = crate::kube::Kube::new(&self.settings.root);
                    let mut etcd = crate::etcd::Etcd::new(&self.settings.root);
                    let id = directive.id.clone();
                    self.start_cluster_call(directive.id, "take an inventory", |ip, port| {
                        let server = crate::kube::local_api(ip, port);
                        let endpoint = crate::etcd::local_endpoint(ip);
                        let command = format!(
                            "inventory of the restore of {snapshot} via {server} and {endpoint}"
                        );
                        let call = async move {
                            Ok(crate::inventory::take_and_report(
                                &api, &mut kube, &mut etcd, &server, &endpoint, id,
                            )
                            .await?)
                        };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::SetKubernetesVersion { version } => {
                    if let Err(e) = drover_common::api::KubernetesVersion::parse(&version) {
                        self.finish_directive(
                            directive.id,
                            false,
                            format!("cannot set the kubeadm-config version to {version:?}: the version {e}"),
                        );
                        continue;
                    }
                    tracing::info!(%version, "setting the kubeadm-config version at the coordinator's request");
                    let mut kube = crate::kube::Kube::new(&self.settings.root);
                    self.start_cluster_call(directive.id, "update kubeadm-config", |ip, port| {
                        let api = crate::kube::local_api(ip, port);
                        let command =
                            format!("set kubeadm-config kubernetesVersion {version} via {api}");
                        let call =
                            async move { Ok(kube.set_kubernetes_version(&api, &version).await?) };
                        (command, Box::pin(call))
                    });
                }
                DirectiveAction::UpgradeEssentialAddons { version } => {
                    tracing::info!(%version, "upgrading kube-proxy and CoreDNS at the coordinator's request");
                    let mut kube = crate::kube::Kube::new(&self.settings.root);
                    self.start_cluster_call(
                        directive.id,
                        "upgrade kube-proxy and CoreDNS",
                        |ip, port| {
                            let api = crate::kube::local_api(ip, port);
                            let command = format!(
                                "set the kube-proxy and CoreDNS images of {version} via {api}"
                            );
                            let call = async move {
                                Ok(kube.upgrade_essential_addons(&api, &version).await?)
                            };
                            (command, Box::pin(call))
                        },
                    );
                }
                DirectiveAction::Reboot { reason } => {
                    let root = self.settings.root.clone();
                    let state_dir = self.settings.state_dir.clone();
                    let command = self.settings.reboot_command.clone();
                    let boot_id_file = self.settings.boot_id_file.clone();
                    let id = directive.id.clone();
                    let shown = command.join(" ");
                    let call = async move {
                        let m = crate::reboot::Machine {
                            root: &root,
                            state_dir: &state_dir,
                            command: &command,
                            boot_id_file: boot_id_file.as_deref(),
                        };
                        crate::reboot::reboot(m, &id, &reason)
                            .await
                            .map_err(|e| ClusterCallError::Command(e.to_string()))
                    };
                    self.start_call(
                        directive.id,
                        format!("cordon, then {shown}"),
                        Box::pin(call),
                    );
                }
                DirectiveAction::Reset { reason } => {
                    tracing::info!(reason = %reason, "resetting this machine at the coordinator's request");
                    self.work.resetting = true;
                    self.work.activity = Some(report::RESET_STEP);
                    self.config.stop();
                    let spec = command::kubeadm_reset(&self.settings.kubeadm, &self.settings.root);
                    // kubeadm reset removes a control plane's own member
                    // (its remove-etcd-member phase) and never asks whether
                    // it leads: leadership leaves it first.
                    let handover = self
                        .local
                        .advertise
                        .filter(|_| {
                            may_create_token(
                                self.saved.state.bootstrapped(),
                                self.saved.state.role(),
                            )
                        })
                        .map(|ip| {
                            (
                                crate::etcd::Etcd::new(&self.settings.root),
                                crate::etcd::local_endpoint(ip),
                                self.settings.hostname.clone(),
                            )
                        });
                    let outcome = Box::pin(async move {
                        let moved = match handover {
                            Some((mut etcd, endpoint, own)) => Some(
                                tokio::time::timeout(
                                    LEADERSHIP_HANDOVER_TIMEOUT,
                                    etcd.hand_over_own_leadership(&endpoint, &own),
                                )
                                .await,
                            ),
                            None => None,
                        };
                        let note = match moved {
                            Some(Ok(Ok(Some(moved)))) => Some(moved),
                            Some(Ok(Ok(None))) | None => None,
                            Some(Ok(Err(e))) => Some(format!(
                                "etcd leadership could not be moved away before the reset: {e}"
                            )),
                            Some(Err(_)) => Some(format!(
                                "etcd leadership could not be moved away before the reset: etcd did not answer within {}s",
                                LEADERSHIP_HANDOVER_TIMEOUT.as_secs()
                            )),
                        };
                        if let Some(note) = &note {
                            tracing::info!(%note, "before kubeadm reset");
                        }
                        let mut outcome = command::run(&spec, command::OUTPUT_TAIL_LINES).await;
                        outcome.output_tail.splice(0..0, note);
                        outcome
                    });
                    self.work.running = Some(super::Work {
                        kind: WorkKind::Reset { id: directive.id },
                        outcome,
                    });
                    self.heartbeat_soon();
                }
            }
        }
    }

    /// Runs one call on the cluster (etcd, the API server) as the work of
    /// directive `id`, its result becoming the directive's; `make` gets this
    /// machine's address and API server port and gives the command shown
    /// and the call. Only a running control plane that knows its address
    /// may act on its cluster; others fail the directive saying why.
    /// Deletes or drains Node `node` through this control plane's API server.
    fn start_node_call(&mut self, id: String, node: String, what: NodeCall) {
        let verb = match what {
            NodeCall::Delete => "delete",
            NodeCall::Drain(_) => "drain",
            NodeCall::Uncordon => "uncordon",
        };
        tracing::info!(node = %node, action = verb, "acting on a Node at the coordinator's request");
        let mut kube = crate::kube::Kube::new(&self.settings.root);
        self.start_cluster_call(id, &format!("{verb} Nodes"), |ip, port| {
            let api = crate::kube::local_api(ip, port);
            let command = format!("{verb} node {node} via {api}");
            let call = async move {
                Ok(match what {
                    NodeCall::Delete => kube.delete_node(&api, &node).await?,
                    NodeCall::Drain(options) => kube.drain(&api, &node, options).await?,
                    NodeCall::Uncordon => kube.uncordon(&api, &node).await?,
                })
            };
            (command, Box::pin(call))
        });
    }

    fn start_cluster_call(
        &mut self,
        id: String,
        what: &str,
        make: impl FnOnce(std::net::IpAddr, u16) -> (String, ClusterCall),
    ) {
        let ip = if !may_create_token(self.saved.state.bootstrapped(), self.saved.state.role()) {
            Err(format!(
                "this machine cannot {what}: it is not a running control-plane machine"
            ))
        } else {
            self.local
                .advertise
                .ok_or_else(|| "this machine does not know its advertise address yet".to_owned())
        };
        let ip = match ip {
            Ok(ip) => ip,
            Err(why) => return self.finish_directive(id, false, why),
        };
        let (command, call) = make(ip, self.settings.api_server_port);
        self.start_call(id, command, call);
    }

    /// Upgrades this machine in place to `version` for directive `id`: the
    /// image's `upgrade-kubeadm` hook, `kubeadm upgrade apply|node`, then
    /// its `upgrade-kubelet` hook (which installs and restarts the
    /// kubelet), each with a timeout; the first that fails fails the
    /// directive with its command, exit status and output. Only a machine
    /// that runs in its cluster upgrades.
    fn start_upgrade(&mut self, id: String, version: String, command: UpgradeCommand) {
        // The version is an argument of the image's hooks: nothing outside
        // the grammar the coordinator validates reaches them.
        if let Err(e) = drover_common::api::KubernetesVersion::parse(&version) {
            return self.finish_directive(
                id,
                false,
                format!("cannot upgrade to {version:?}: the version {e}; nothing was changed"),
            );
        }
        if !self.saved.state.bootstrapped() {
            return self.finish_directive(
                id,
                false,
                format!(
                    "this machine cannot upgrade to {version}: it is not running in a cluster (phase {:?})",
                    self.phase()
                ),
            );
        }
        let s = &self.settings;
        // Nothing is changed unless every step can run.
        let missing: Vec<String> = [KUBEADM_HOOK, KUBELET_HOOK]
            .iter()
            .map(|h| s.hooks_dir.join(h))
            .filter(|p| !p.is_file())
            .map(|p| p.display().to_string())
            .collect();
        if !missing.is_empty() {
            return self.finish_directive(
                id,
                false,
                format!(
                    "cannot upgrade to {version}: the machine image has no upgrade hook {}; an in-place upgrade needs the image to provide {KUBEADM_HOOK} and {KUBELET_HOOK} (see the README, \"Upgrading a cluster\"); nothing was changed",
                    missing.join(" and ")
                ),
            );
        }
        tracing::info!(%version, %command, "upgrading this machine in place at the coordinator's request");
        let runner = command::HookRunner::detect(&s.root);
        let hook =
            |name| command::upgrade_hook(&s.hooks_dir, name, &version, &s.kubeadm, &s.root, runner);
        let steps = [
            hook(KUBEADM_HOOK),
            command::kubeadm_upgrade(&s.kubeadm, command, &version, &s.root),
            hook(KUBELET_HOOK),
        ];
        let shown = steps
            .iter()
            .map(CommandSpec::display)
            .collect::<Vec<_>>()
            .join(" && ");
        let call = async move {
            for spec in &steps {
                tracing::info!(command = %spec.display(), "upgrade step");
                run_bounded(spec, UPGRADE_STEP_TIMEOUT).await?;
            }
            Ok(format!(
                "upgraded to {version} with {command}; kubelet {version} installed"
            ))
        };
        self.start_call(id, shown, Box::pin(call));
    }

    /// Runs `call` as the work of directive `id`, shown as `command`.
    fn start_call(&mut self, id: String, command: String, call: ClusterCall) {
        let outcome = Box::pin(async move { CommandOutcome::of_call(command, call.await) });
        self.work.running = Some(super::Work {
            kind: WorkKind::ClusterCall { id },
            outcome,
        });
    }

    pub(super) fn finish_directive(&mut self, id: String, ok: bool, message: String) {
        if ok {
            tracing::info!(id = %id, message = %message, "directive done");
        } else {
            tracing::warn!(id = %id, message = %message, "directive failed");
        }
        self.saved
            .state
            .complete_directive(DirectiveResult { id, ok, message });
        self.persist();
        self.heartbeat_soon();
    }

    /// `kubeadm token create` for directive `id` ended.
    pub(super) fn finish_token_create(
        &mut self,
        id: String,
        token_id: &str,
        outcome: CommandOutcome,
    ) {
        let message = if outcome.success {
            format!("bootstrap token {token_id} created")
        } else {
            outcome.summary()
        };
        self.finish_directive(id, outcome.success, message);
    }

    /// `kubeadm reset` for directive `id` ended: on success the machine is
    /// back in its pool, its bundle files removed and its assignment
    /// retired.
    pub(super) fn finish_reset(&mut self, id: String, outcome: CommandOutcome) {
        self.work.resetting = false;
        if outcome.success {
            let written = self
                .saved
                .state
                .bootstrap
                .as_ref()
                .map(|p| {
                    let mut w = p.written_files.clone();
                    w.extend(p.kubeadm_config_path.clone());
                    w
                })
                .unwrap_or_default();
            let mut problems = files::remove_bundle_files(&self.settings.root, &written);
            problems.extend(files::clean_after_reset(&self.settings.root));
            if let Some(p) = self.saved.state.bootstrap.take() {
                self.saved.state.retired_generation = self
                    .saved
                    .state
                    .retired_generation
                    .max(p.assignment.generation);
            }
            self.config.stop();
            self.logged.warned_generation = None;
            let mut message = "kubeadm reset done; the machine is back in its pool".to_owned();
            if !problems.is_empty() {
                message.push_str(&format!("; could not remove: {}", problems.join("; ")));
            }
            self.finish_directive(id, true, message);
        } else {
            let failure = outcome.to_failure();
            if let Some(p) = self.saved.state.bootstrap.as_mut() {
                p.step = BootstrapStep::Failed {
                    step: report::RESET_STEP.into(),
                    failure,
                };
            }
            self.finish_directive(id, false, outcome.summary());
        }
    }
}

/// How long moving etcd leadership away before a reset may take; the reset
/// goes on after it either way.
const LEADERSHIP_HANDOVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long each step of an in-place upgrade may take.
const UPGRADE_STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs `spec` for a directive, failing when it fails or takes longer than
/// `timeout`: a command that hangs must not hold the work slot (a reset
/// waits behind it). Past the timeout the runner kills the command's whole
/// process group: a kubeadm given up on must not go on changing the
/// machine behind the next step's back.
async fn run_bounded(
    spec: &CommandSpec,
    timeout: std::time::Duration,
) -> Result<(), ClusterCallError> {
    let mut spec = spec.clone();
    spec.timeout = Some(spec.timeout.map_or(timeout, |t| t.min(timeout)));
    let outcome = command::run(&spec, 20).await;
    if outcome.success {
        Ok(())
    } else {
        Err(ClusterCallError::Command(outcome.summary()))
    }
}

/// How long `kubeadm certs renew all` may take.
const CERTS_RENEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// A call on the cluster for a directive: the success message, or why it
/// failed.
type ClusterCall =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, ClusterCallError>> + Send>>;

/// Why a call on the cluster, made for a directive, failed; the message
/// becomes the directive's result.
#[derive(Debug, thiserror::Error)]
pub(super) enum ClusterCallError {
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeError),
    #[error("{0}")]
    Command(String),
    #[error("restarting the static Pods: {0}")]
    StaticPods(#[from] crate::certificates::StaticPodError),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SaveError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step past its timeout fails, and what it started is killed with
    /// it (its whole process group), not left running behind the agent.
    #[tokio::test]
    async fn a_step_past_its_timeout_fails_and_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("kubeadm.pid");
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
        let spec = command::machine_command(&script, dir.path());
        // It fails at its timeout, not after the 600 s sleep (the test
        // would hang, never pass, if it waited).
        let err = run_bounded(&spec, std::time::Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
        let (pid, gone) = command::wait_gone(&pid_file).await;
        assert!(gone, "the step's child {pid} outlived its timeout");
    }
}
