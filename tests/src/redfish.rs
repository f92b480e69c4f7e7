//! A real Redfish service for the power-control tests: sushy-tools'
//! emulator (installed by `scripts/redfish`) with its fake systems driver,
//! on a loopback port, over HTTPS (a throwaway CA) with HTTP basic
//! authentication (a bcrypt auth file), as a BMC serves.
//!
//! The fake driver changes only its own record of a system's power. What
//! wires it to a test's "hardware" is the driver's external notifier: on
//! every change it PUTs the system (`power_state`, `pending_power`) to a
//! URL, here a listener of this module, which hands each to the test as a
//! [`PowerChange`]. A reset turns a system `Off` at once and `On` 1 to 11 s
//! later, applied when the system is next read: a poller reads every
//! system twice a second so that happens.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use drover_common::pki::{CertificateAuthority, LeafSpec, LeafUsage};

use crate::{free_port, wait_for};

/// One change of a fake system's power, as the emulator notified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerChange {
    /// The system's name.
    pub system: String,
    /// Its power state now (`On`, `Off`).
    pub power_state: String,
    /// The state it is on its way to, if any (`On`, `ForceRestart`).
    pub pending: Option<String>,
}

/// The emulator, killed on drop.
pub struct Redfish {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA of its certificate.
    pub ca_pem: String,
    pub username: String,
    pub password: String,
    /// Every system: its name and UUID (its id under `/redfish/v1/Systems/`).
    pub systems: Vec<(String, String)>,
    /// The power changes, in the order the emulator made them.
    pub changes: mpsc::Receiver<PowerChange>,
    child: Child,
    log: PathBuf,
    stop: Arc<AtomicBool>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Redfish {
    /// Starts the emulator in `dir` with one fake system per name, each
    /// powered on.
    pub fn start(dir: &Path, systems: &[&str]) -> Self {
        let script = root().join("scripts/redfish");
        let status = Command::new(&script)
            .arg("install")
            .status()
            .expect("run scripts/redfish install");
        assert!(status.success(), "scripts/redfish install failed");
        std::fs::create_dir_all(dir).unwrap();
        let ca = CertificateAuthority::generate("redfish-test-ca").unwrap();
        let leaf = ca
            .issue(&LeafSpec::loopback("bmc", LeafUsage::Server))
            .unwrap();
        let (cert, key) = (dir.join("bmc.crt"), dir.join("bmc.key"));
        std::fs::write(&cert, &leaf.cert_pem).unwrap();
        std::fs::write(&key, leaf.key_pem.as_deref().unwrap()).unwrap();
        let (username, password) = ("drover".to_owned(), "bmc-secret-1".to_owned());
        let line = Command::new(&script)
            .args(["htpasswd", &username, &password])
            .output()
            .expect("run scripts/redfish htpasswd");
        assert!(line.status.success(), "scripts/redfish htpasswd failed");
        let auth = dir.join("htpasswd");
        std::fs::write(&auth, &line.stdout).unwrap();

        let (tx, changes) = mpsc::channel();
        let notify = notification_listener(tx);
        let systems: Vec<(String, String)> = systems
            .iter()
            .enumerate()
            .map(|(i, name)| {
                (
                    (*name).to_owned(),
                    format!("{:08x}-0000-4000-8000-{:012x}", i + 1, i + 1),
                )
            })
            .collect();
        let fake: Vec<String> = systems
            .iter()
            .map(|(name, uuid)| {
                format!(
                    "{{'uuid': '{uuid}', 'name': '{name}', 'power_state': 'On', 'external_notifier': True, 'nics': []}}"
                )
            })
            .collect();
        let port = free_port();
        let config = dir.join("emulator.conf");
        std::fs::write(
            &config,
            format!(
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                 SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                 SUSHY_EMULATOR_SSL_CERT = '{}'\n\
                 SUSHY_EMULATOR_SSL_KEY = '{}'\n\
                 SUSHY_EMULATOR_AUTH_FILE = '{}'\n\
                 SUSHY_EMULATOR_STATE_DIR = '{}'\n\
                 SUSHY_EMULATOR_FAKE_DRIVER = True\n\
                 EXTERNAL_NOTIFICATION_URL = '{notify}'\n\
                 SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n",
                cert.display(),
                key.display(),
                auth.display(),
                dir.join("state").display(),
                fake.join(", "),
            ),
        )
        .unwrap();
        let log = dir.join("redfish.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&script)
            .args(["serve", &config.display().to_string()])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start the Redfish emulator");
        let probe = format!("127.0.0.1:{port}");
        wait_for(
            "the Redfish emulator to listen",
            Duration::from_secs(60),
            || {
                std::net::TcpStream::connect(&probe)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        );
        let url = format!("https://127.0.0.1:{port}");
        let stop = Arc::new(AtomicBool::new(false));
        poll_systems(
            &url,
            &ca.cert_pem,
            (&username, &password),
            &systems,
            stop.clone(),
        );
        Self {
            url,
            ca_pem: ca.cert_pem,
            username,
            password,
            systems,
            changes,
            child,
            log,
            stop,
        }
    }

    /// The emulator's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The next power change of `system` within `timeout`, skipping
    /// others'.
    pub fn next_change(&self, system: &str, timeout: Duration) -> PowerChange {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.changes.recv_timeout(left) {
                Ok(c) if c.system == system => return c,
                Ok(_) => continue,
                Err(e) => panic!(
                    "no power change of {system} within {timeout:?} ({e}); emulator log:\n{}",
                    self.log()
                ),
            }
        }
    }
}

impl Drop for Redfish {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener for the fake driver's notifications (one PUT of the system
/// as JSON each): each becomes a [`PowerChange`] on `tx`. Its URL.
fn notification_listener(tx: mpsc::Sender<PowerChange>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let Ok(system) = serde_json::from_slice::<serde_json::Value>(&body) else {
                continue;
            };
            let change = PowerChange {
                system: system["name"].as_str().unwrap_or_default().to_owned(),
                power_state: system["power_state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                pending: system["pending_power"]["power_state"]
                    .as_str()
                    .map(str::to_owned),
            };
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    url
}

/// Reads every system twice a second until `stop`, so the fake driver
/// applies a pending power change when its time comes (it applies them
/// only on a read).
fn poll_systems(
    url: &str,
    ca_pem: &str,
    (username, password): (&str, &str),
    systems: &[(String, String)],
    stop: Arc<AtomicBool>,
) {
    let client = drover::tls::client_trusting(ca_pem.as_bytes(), Duration::from_secs(5)).unwrap();
    let urls: Vec<String> = systems
        .iter()
        .map(|(_, uuid)| format!("{url}/redfish/v1/Systems/{uuid}"))
        .collect();
    let (username, password) = (username.to_owned(), password.to_owned());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let tick = Duration::from_millis(500);
        while !stop.load(Ordering::Relaxed) {
            for u in &urls {
                let _ = rt.block_on(async {
                    client
                        .get(u)
                        .basic_auth(&username, Some(&password))
                        .send()
                        .await
                });
            }
            // The pacing of a poller, not a wait for a condition.
            std::thread::sleep(tick);
        }
    });
}
