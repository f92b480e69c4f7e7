//! The agent's settings, resolved from the command line by `main.rs`.

use std::net::IpAddr;
use std::path::PathBuf;

/// Settings resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The machine's root directory; kubeadm gets `--rootfs` unless it is `/`.
    pub root: PathBuf,
    /// The kubeadm program.
    pub kubeadm: String,
    pub state_dir: PathBuf,
    /// The address to advertise; found by routing towards the coordinator
    /// when unset.
    pub advertise_address: Option<IpAddr>,
    pub api_server_port: u16,
    pub kubelet_healthz_url: reqwest::Url,
    pub hostname: String,
    /// How long a static Pod manifest stays out of the manifests directory
    /// to restart its Pod (the kubelet's file check period).
    pub static_pod_restart_wait: std::time::Duration,
    /// Where the image's upgrade hooks (`upgrade-kubeadm`,
    /// `upgrade-kubelet`) are.
    pub hooks_dir: PathBuf,
    /// Whether the cluster's files and commands may be applied here.
    pub customisation: Customisation,
    /// The bounds of the node problem checks (`--eviction-hard`).
    pub eviction_hard: crate::problems::Bounds,
    /// The program and arguments that reboot the machine
    /// (`--reboot-command`).
    pub reboot_command: Vec<String>,
    /// Where the boot ID is read instead of the kernel's
    /// (`--boot-id-file`).
    pub boot_id_file: Option<PathBuf>,
    /// Where the kernel's messages are read instead of `<root>/dev/kmsg`
    /// (`--kmsg`).
    pub kmsg: Option<PathBuf>,
    /// The container runtime's CRI socket the health reports check
    /// (`--cri-socket`), if any.
    pub cri_socket: Option<PathBuf>,
    /// Whether node problems are mirrored as Node conditions
    /// (`--node-conditions`).
    pub node_conditions: bool,
}

/// Whether an agent applies the files and commands a cluster's spec puts on
/// its machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Customisation {
    /// Write the files and run the commands (the default).
    Allow,
    /// Fail the bootstrap of a bundle that carries any
    /// (`--refuse-machine-customisation`).
    Refuse,
}

impl Settings {
    /// The port of the kubelet health URL.
    pub fn kubelet_healthz_port(&self) -> u16 {
        self.kubelet_healthz_url
            .port_or_known_default()
            .unwrap_or(10248)
    }
}
