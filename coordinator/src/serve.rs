//! `drover serve`: configuration, first start, and the running coordinator.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_common::pin::CaPin;

use crate::app::{App, Settings};
use crate::store::{EtcdOptions, EtcdTls, Location, Store, TlsFile};
use crate::types::ClientConfigFile;

/// Validated settings of `drover serve`, built before any socket is bound.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub advertise_urls: Vec<String>,
    pub extra_sans: Vec<String>,
    /// `--autoscaler-listen`: where the autoscaler's service listens.
    pub autoscaler_listen: Option<SocketAddr>,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    pub machine_cert_ttl: Duration,
    pub join_token_ttl: Duration,
    pub client_config: PathBuf,
    pub drain: Duration,
    /// Close client connections idle this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// The keyring file; default `DATA_DIR/encryption.key`.
    pub encryption_key_file: Option<PathBuf>,
    /// Registrations allowed per second from one source address (0: no limit).
    pub registration_rate: u32,
    /// The leadership lease among replicas sharing an etcd store.
    pub leader_lease: Duration,
    /// Where objects are kept (`--store`).
    pub store: Location,
    /// TLS to etcd: `--etcd-ca-file`, `--etcd-cert-file`, `--etcd-key-file`.
    pub etcd_ca_file: Option<PathBuf>,
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    /// How long a request body may take to arrive (`--request-body-timeout`).
    pub request_body_timeout: Duration,
    /// `--endpoint-ports`: the range of managed control-plane endpoints.
    pub endpoint_ports: (u16, u16),
    /// `--max-unauthenticated-connections` and `...-per-source`.
    pub unauthenticated: crate::http::server::UnauthenticatedCaps,
    /// `--endpoint-max-connections`, `...-per-source`, `--endpoint-idle-timeout`.
    pub endpoint_proxy: drover_common::tcp_proxy::Limits,
}

/// The flags of `drover serve` (also what a `--config` file's keys name).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A YAML file of settings: each key is one of these flags' names in
    /// camelCase (`dataDir`, `listen`, `heartbeatTimeout`). Flags and
    /// their environment variables win over the file. Unknown keys and bad
    /// values are refused naming the file, line and key (exit 64).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (file, flags, environment and
    /// defaults, each value's source noted, secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Directory for the embedded store, the encryption key, the audit log
    /// and the CA certificate.
    #[arg(long, env = "DROVER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Where objects are kept: `sqlite` (DATA_DIR/drover.db), `sqlite:DIR`
    /// (DIR/drover.db), or `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`, an
    /// etcd cluster several coordinator replicas share (keys under PREFIX,
    /// default /drover). The data directory keeps the encryption key and
    /// the audit log either way.
    #[arg(long, env = "DROVER_STORE", default_value = "sqlite")]
    pub store: Location,
    #[command(flatten)]
    pub etcd: EtcdTlsArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7443")]
    pub listen: std::net::SocketAddr,
    /// URL agents use to reach this coordinator (repeatable); defaults to the listen address.
    #[arg(long = "advertise-url")]
    pub advertise_urls: Vec<String>,
    /// Extra DNS name or IP for the serving certificate (repeatable).
    #[arg(long = "san")]
    pub sans: Vec<String>,
    /// Address of the cluster-autoscaler's `externalgrpc` cloud provider
    /// service (gRPC over mutual TLS; `drover autoscaler-config` writes a
    /// cluster's credentials). Not served unless given.
    #[arg(long)]
    pub autoscaler_listen: Option<std::net::SocketAddr>,
    /// How often agents heartbeat.
    #[arg(long, default_value = "10s", value_parser = drover_common::api::parse_duration)]
    pub heartbeat_interval: std::time::Duration,
    /// Silence after which a machine counts as dead.
    #[arg(long, default_value = "40s", value_parser = drover_common::api::parse_duration)]
    pub heartbeat_timeout: std::time::Duration,
    /// Lifetime of machine client certificates.
    #[arg(long, default_value = "24h", value_parser = drover_common::api::parse_duration)]
    pub machine_cert_ttl: std::time::Duration,
    /// Lifetime of the kubeadm join tokens the coordinator mints.
    #[arg(long, default_value = "30m", value_parser = drover_common::api::parse_duration)]
    pub join_token_ttl: std::time::Duration,
    /// Where to write the client config at first start (default: $DROVER_CONFIG or ~/.config/drover/config.yaml).
    #[arg(long)]
    pub client_config: Option<PathBuf>,
    /// File of base64 keys that encrypt secrets at rest, the first encrypting
    /// (default: DATA_DIR/encryption.key, created at first start). The
    /// environment variable DROVER_ENCRYPTION_KEY overrides it.
    #[arg(long)]
    pub encryption_key_file: Option<PathBuf>,
    /// Registrations accepted per second from one source address, with a
    /// burst of five times as many (0 disables the limit).
    #[arg(long, default_value_t = 20)]
    pub registration_rate: u32,
    /// How long open connections may take to finish after SIGTERM.
    #[arg(long, default_value = "10s", value_parser = drover_common::api::parse_duration)]
    pub drain_timeout: std::time::Duration,
    /// Close client connections idle this long (default: keep them open).
    /// A kept connection holds about 15 KiB between heartbeats. With a
    /// timeout well below --heartbeat-interval (100ms, say), agents
    /// reconnect for every heartbeat, resuming their TLS session: under
    /// 4 KiB per machine, for about three times the CPU per heartbeat
    /// (see BENCHMARKS.md).
    #[arg(long, value_parser = drover_common::api::parse_duration)]
    pub idle_timeout: Option<std::time::Duration>,
    /// How long a request's body may take to arrive once the server waits
    /// for it; a body still missing then is answered 408 and the
    /// connection closed.
    #[arg(long, default_value = "30s", value_parser = drover_common::api::parse_duration)]
    pub request_body_timeout: std::time::Duration,
    /// The ports of the coordinator's own control-plane endpoints (pool
    /// clusters with `controlPlaneEndpoint: {managed: coordinator}`),
    /// `FIRST-LAST`. One port per such cluster, on the --listen address.
    #[arg(long, default_value = crate::domain::endpoint::DEFAULT_PORTS, value_parser = crate::domain::endpoint::parse_port_range)]
    pub endpoint_ports: (u16, u16),
    /// Connections without a client certificate (admin commands,
    /// registrations, anyone else) held at once, TLS handshakes counted
    /// apart; more are refused. Lowered to a quarter of the open-file
    /// limit if above it.
    #[arg(long, default_value_t = 4096)]
    pub max_unauthenticated_connections: u32,
    /// Of those, from one source address.
    #[arg(long, default_value_t = 256)]
    pub max_unauthenticated_connections_per_source: u32,
    /// Connections the managed control-plane endpoints hold at once, all
    /// endpoints together; more are closed at once. Lowered to an eighth of
    /// the open-file limit if above it (each holds two open files), so the
    /// API keeps its own.
    #[arg(long, default_value_t = drover_common::tcp_proxy::DEFAULT_TOTAL)]
    pub endpoint_max_connections: u32,
    /// Of those, from one source address (an IPv6 /64). Raise it when many
    /// Nodes reach an endpoint through one NAT address.
    #[arg(long, default_value_t = drover_common::tcp_proxy::DEFAULT_PER_SOURCE)]
    pub endpoint_max_connections_per_source: u32,
    /// Close a managed endpoint's connection after this long without a byte
    /// either way (live Kubernetes clients ping or watch well within it).
    /// One whose side has closed is closed after a minute of silence.
    #[arg(long, default_value = "1h", value_parser = drover_common::api::parse_duration)]
    pub endpoint_idle_timeout: std::time::Duration,
    /// With an etcd store: the leader's lease. A new leader takes over
    /// within this long after the old one dies.
    #[arg(long, default_value = "15s", value_parser = drover_common::api::parse_duration)]
    pub leader_lease: std::time::Duration,
}

impl ServeArgs {
    /// The settings these flags give, not yet validated.
    pub fn into_config(self) -> ServeConfig {
        ServeConfig {
            data_dir: self.data_dir,
            listen: self.listen,
            advertise_urls: self.advertise_urls,
            extra_sans: self.sans,
            autoscaler_listen: self.autoscaler_listen,
            heartbeat_interval: self.heartbeat_interval,
            heartbeat_timeout: self.heartbeat_timeout,
            machine_cert_ttl: self.machine_cert_ttl,
            join_token_ttl: self.join_token_ttl,
            client_config: self
                .client_config
                .unwrap_or_else(crate::cli::client::default_config_path),
            drain: self.drain_timeout,
            idle_timeout: self.idle_timeout,
            encryption_key_file: self.encryption_key_file,
            registration_rate: self.registration_rate,
            leader_lease: self.leader_lease,
            store: self.store,
            etcd_ca_file: self.etcd.etcd_ca_file,
            etcd_cert_file: self.etcd.etcd_cert_file,
            etcd_key_file: self.etcd.etcd_key_file,
            request_body_timeout: self.request_body_timeout,
            endpoint_ports: self.endpoint_ports,
            unauthenticated: crate::http::server::UnauthenticatedCaps {
                per_source: self.max_unauthenticated_connections_per_source,
                total: self.max_unauthenticated_connections,
            },
            endpoint_proxy: drover_common::tcp_proxy::Limits {
                per_source: self.endpoint_max_connections_per_source,
                total: self.endpoint_max_connections,
                idle_timeout: self.endpoint_idle_timeout,
                ..Default::default()
            },
        }
    }
}

/// The validated settings of `drover serve` given these flags (as on its
/// command line, without `serve`): for starting a coordinator in-process.
pub fn config_from_flags<I, T>(flags: I) -> Result<ServeConfig, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }
    let argv =
        std::iter::once(std::ffi::OsString::from("serve")).chain(flags.into_iter().map(Into::into));
    let serve =
        <Serve as clap::Parser>::try_parse_from(argv).map_err(|e| ConfigError(e.to_string()))?;
    serve.args.into_config().validate()
}

/// The host of an `https://host[:port][/path]` URL, without IPv6 brackets.
fn url_host(url: &str) -> String {
    let rest = url.trim_start_matches("https://");
    let authority = rest.split('/').next().unwrap_or(rest);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6).to_owned();
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .to_owned()
}

/// A configuration error: exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServeConfig {
    /// Checks every setting together; the first problem found is reported.
    pub fn validate(self) -> Result<Self, ConfigError> {
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError("--heartbeat-interval must be positive".into()));
        }
        if self
            .idle_timeout
            .is_some_and(|t| t < Duration::from_millis(100))
        {
            return Err(ConfigError(
                "--idle-timeout must be at least 100ms (leave it out to keep idle connections open)"
                    .into(),
            ));
        }
        if self.heartbeat_timeout < self.heartbeat_interval * 2 {
            return Err(ConfigError(format!(
                "--heartbeat-timeout ({:?}) must be at least twice --heartbeat-interval ({:?}), or one lost heartbeat marks a machine dead",
                self.heartbeat_timeout, self.heartbeat_interval
            )));
        }
        if self.machine_cert_ttl < Duration::from_secs(600) {
            return Err(ConfigError(
                "--machine-cert-ttl must be at least 10m".into(),
            ));
        }
        if self.join_token_ttl < Duration::from_secs(600)
            || self.join_token_ttl > Duration::from_secs(24 * 3600)
        {
            return Err(ConfigError(
                "--join-token-ttl must be between 10m and 24h".into(),
            ));
        }
        for url in &self.advertise_urls {
            if !url.starts_with("https://") || url.len() <= "https://".len() {
                return Err(ConfigError(format!(
                    "--advertise-url {url:?} must be an https:// URL"
                )));
            }
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError("--data-dir must not be empty".into()));
        }
        if self.data_dir.exists() && !self.data_dir.is_dir() {
            return Err(ConfigError(format!(
                "--data-dir {} exists and is not a directory",
                self.data_dir.display()
            )));
        }
        self.etcd_tls()?;
        if self.request_body_timeout < Duration::from_secs(1) {
            return Err(ConfigError(format!(
                "--request-body-timeout {:?} is too short; use at least 1s",
                self.request_body_timeout
            )));
        }
        let caps = self.unauthenticated;
        if caps.total == 0 || caps.per_source == 0 {
            return Err(ConfigError(
                "--max-unauthenticated-connections and --max-unauthenticated-connections-per-source must be at least 1 (registrations and admin commands connect without a client certificate)"
                    .into(),
            ));
        }
        if caps.per_source > caps.total {
            return Err(ConfigError(format!(
                "--max-unauthenticated-connections-per-source ({}) must not exceed --max-unauthenticated-connections ({})",
                caps.per_source, caps.total
            )));
        }
        let proxy = self.endpoint_proxy;
        if proxy.total == 0 || proxy.per_source == 0 || proxy.per_source > proxy.total {
            return Err(ConfigError(format!(
                "--endpoint-max-connections ({}) and --endpoint-max-connections-per-source ({}) must be at least 1, the second no more than the first",
                proxy.total, proxy.per_source
            )));
        }
        if proxy.idle_timeout < Duration::from_secs(1) {
            return Err(ConfigError(
                "--endpoint-idle-timeout must be at least 1s".into(),
            ));
        }
        if std::env::var_os(crate::store::keyring::KEY_ENV).is_none() {
            check_key_file_mode(&self.key_file())?;
        }
        if self.leader_lease < Duration::from_secs(2) {
            return Err(ConfigError(format!(
                "--leader-lease {:?} is too short; use at least 2s (the leader renews it every third of it)",
                self.leader_lease
            )));
        }
        Ok(self)
    }

    /// The keyring file: `--encryption-key-file`, else `DATA_DIR/encryption.key`.
    pub fn key_file(&self) -> PathBuf {
        self.encryption_key_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("encryption.key"))
    }

    /// Checks `--store` with the etcd TLS flags; reads and checks the TLS
    /// files, if any were given.
    fn etcd_tls(&self) -> Result<Option<EtcdTls>, ConfigError> {
        store_settings(
            &self.store,
            self.etcd_ca_file.as_deref(),
            self.etcd_cert_file.as_deref(),
            self.etcd_key_file.as_deref(),
        )
    }
}

/// Refuses an encryption key file that users other than its owner may
/// change (group- or other-writable), and warns when they may read it, as
/// ssh does with private keys. A file that does not exist yet is created
/// with mode 0600.
fn check_key_file_mode(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions().mode() & 0o777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(ConfigError(format!(
                "cannot read the encryption key file {}: {e}",
                path.display()
            )))
        }
    };
    if mode & 0o022 != 0 {
        return Err(ConfigError(format!(
            "the encryption key file {} has mode {mode:04o}: users other than its owner can replace the key that protects every secret; run `chmod 600 {}` and check nobody changed it",
            path.display(),
            path.display()
        )));
    }
    if mode & 0o044 != 0 {
        tracing::warn!(
            key_file = %path.display(),
            mode = format!("{mode:04o}"),
            "the encryption key file is readable by other users; anyone who can read it and a store backup can open every secret; run `chmod 600 {}`",
            path.display()
        );
    }
    Ok(())
}

/// A file or directory the coordinator cannot set up at start.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}; {advice}", advice = advice(source))]
pub struct StartupFileError {
    pub action: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// What to do about a file error at start.
fn advice(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ReadOnlyFilesystem => {
            "it is on a read-only file system: mount it read-write, or pass --data-dir a writable directory".into()
        }
        ErrorKind::PermissionDenied => format!(
            "this user (uid {}) may not change it: give the user ownership of it, or pass --data-dir a directory the user owns",
            // SAFETY: getuid has no preconditions and cannot fail.
            unsafe { libc::getuid() }
        ),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
            "the file system is full: free space, or pass --data-dir another file system".into()
        }
        ErrorKind::NotADirectory | ErrorKind::IsADirectory | ErrorKind::AlreadyExists => {
            "something else is in the way: move it, or pass --data-dir another directory".into()
        }
        _ => "check the path, or pass --data-dir another directory".into(),
    }
}

/// Creates the data directory (mode 0700) and checks the coordinator can
/// write in it, so a read-only or foreign directory is refused up front
/// with its path and what to do.
fn prepare_data_dir(dir: &Path) -> Result<(), StartupFileError> {
    let fail = |action, path: &Path| {
        let path = path.to_owned();
        move |source| StartupFileError {
            action,
            path,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(fail("create the data directory", dir))?;
    set_mode(dir, 0o700).map_err(fail("set mode 0700 on the data directory", dir))?;
    let probe = dir.join(".drover-write-check");
    std::fs::write(&probe, b"").map_err(fail("write in the data directory", &probe))?;
    std::fs::remove_file(&probe).map_err(fail("remove", &probe))?;
    Ok(())
}

/// See `ServeConfig::etcd_tls`.
fn store_settings(
    store: &Location,
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<EtcdTls>, ConfigError> {
    match store {
        Location::Etcd { .. } => {}
        Location::Sqlite(dir) => {
            let flags = [
                ("--etcd-ca-file", ca),
                ("--etcd-cert-file", cert),
                ("--etcd-key-file", key),
            ];
            if let Some((flag, _)) = flags.iter().find(|(_, v)| v.is_some()) {
                return Err(ConfigError(format!(
                    "{flag} is for an etcd store, but --store is {store}"
                )));
            }
            if let Some(dir) = dir.as_ref().filter(|d| d.exists() && !d.is_dir()) {
                return Err(ConfigError(format!(
                    "--store sqlite:{} exists and is not a directory",
                    dir.display()
                )));
            }
            return Ok(None);
        }
    }
    etcd_tls(ca, cert, key).map_err(|e| ConfigError(e.to_string()))
}

/// The etcd TLS flags, shared by `drover serve` and `drover store migrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdTlsArgs {
    /// CA certificates (PEM) that signed the etcd servers' certificates;
    /// connects to etcd over TLS.
    #[arg(long)]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) to present to etcd, with --etcd-key-file.
    #[arg(long)]
    pub etcd_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert-file.
    #[arg(long)]
    pub etcd_key_file: Option<PathBuf>,
}

/// The etcd TLS settings from `--etcd-ca-file`, `--etcd-cert-file` and
/// `--etcd-key-file`, read and checked; the error names the flag.
pub(crate) fn etcd_tls(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<EtcdTls>, EtcdTlsFlagError> {
    let pair = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => return Err(EtcdTlsFlagError::CertWithoutKey),
        (None, Some(_)) => return Err(EtcdTlsFlagError::KeyWithoutCert),
    };
    let Some(ca) = ca else {
        return match pair {
            Some(_) => Err(EtcdTlsFlagError::CertWithoutCa),
            None => Ok(None),
        };
    };
    EtcdTls::from_files(ca, pair).map(Some).map_err(|source| {
        let flag = match source.file {
            TlsFile::Ca => "--etcd-ca-file",
            TlsFile::Cert => "--etcd-cert-file",
            TlsFile::Key => "--etcd-key-file",
        };
        EtcdTlsFlagError::File { flag, source }
    })
}

/// A wrong combination of the etcd TLS flags, or a file one names that
/// cannot be used; each names the flag.
#[derive(Debug, thiserror::Error)]
pub enum EtcdTlsFlagError {
    #[error("--etcd-cert-file needs --etcd-key-file, its private key")]
    CertWithoutKey,
    #[error("--etcd-key-file needs --etcd-cert-file, its certificate")]
    KeyWithoutCert,
    #[error("--etcd-cert-file needs --etcd-ca-file, the CA of the etcd servers")]
    CertWithoutCa,
    #[error("{flag} {source}")]
    File {
        flag: &'static str,
        source: crate::store::EtcdTlsError,
    },
}

/// Below this open-file limit `serve` warns: a fleet of a few thousand
/// machines keeping connections would run out.
const MIN_OPEN_FILES: u64 = 65_536;

/// Runs the coordinator on `cfg.listen` until SIGTERM or SIGINT.
pub async fn run(cfg: ServeConfig) -> anyhow::Result<()> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    start(cfg, listener, shutdown_signal()).await?.wait().await;
    Ok(())
}

/// A coordinator started by [`start`].
pub struct Running {
    /// The address its API listens on.
    pub addr: SocketAddr,
    /// Its state: store, keys, settings and background tasks.
    pub app: std::sync::Arc<App>,
    served: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Waits until the coordinator has shut down: its listeners drained,
    /// every background task stopped.
    pub async fn wait(self) {
        if let Err(e) = self.served.await {
            tracing::error!(error = %e, "the coordinator stopped abnormally");
        }
    }
}

/// Starts a coordinator serving on `listener` (mini-redis'
/// `server::run(listener, shutdown)`): opens the store in `cfg.data_dir`
/// (or where `cfg.store` says), initialises it on first start, starts
/// every background task, and serves until `shutdown` resolves; then it
/// drains connections and stops the tasks. Tests start one in-process on
/// `127.0.0.1:0`; `drover serve` passes SIGTERM/SIGINT as `shutdown`.
pub async fn start(
    cfg: ServeConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Running> {
    use anyhow::Context;
    prepare_data_dir(&cfg.data_dir)?;
    let store = open_store(&cfg)?;
    let store = open_sealed(store, &cfg)?;
    let secrets = crate::domain::secrets::load_or_init(&store)
        .context("cannot load the coordinator's keys")?;
    let ca_pin =
        CaPin::from_cert_pem(&secrets.ca.cert_pem).context("coordinator CA is unreadable")?;
    let ca_path = cfg.data_dir.join("ca.crt");
    std::fs::write(&ca_path, &secrets.ca.cert_pem).map_err(|source| StartupFileError {
        action: "write the CA certificate",
        path: ca_path.clone(),
        source,
    })?;

    // Every kept agent connection is an open file.
    let open_files = match drover_common::process::raise_open_files_limit() {
        Ok(limit) if limit < MIN_OPEN_FILES => {
            tracing::warn!(
                limit,
                "the open-file limit allows fewer than {MIN_OPEN_FILES} connections; raise it (ulimit -n, systemd LimitNOFILE=) or pass --idle-timeout 100ms so agents do not keep connections"
            );
            Some(limit)
        }
        Ok(limit) => {
            tracing::info!(limit, "open-file limit");
            Some(limit)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit");
            None
        }
    };
    // One for the process: every listener shares the caps.
    let admission: &'static crate::http::server::Admission = Box::leak(Box::new(
        crate::http::server::Admission::new(cfg.unauthenticated, open_files),
    ));
    if admission.caps() != cfg.unauthenticated {
        tracing::warn!(
            total = admission.caps().total,
            per_source = admission.caps().per_source,
            "unauthenticated connections capped at a quarter of the open-file limit, below --max-unauthenticated-connections"
        );
    }
    // The managed endpoints' proxy may hold a quarter of the open files
    // (an eighth in connections): with the HTTPS server's half for
    // connections without a certificate, a quarter is left to machines.
    let endpoint_admission = std::sync::Arc::new(drover_common::tcp_proxy::Admission::new(
        cfg.endpoint_proxy,
        open_files.map(|limit| limit / 4),
    ));
    if endpoint_admission.limits() != cfg.endpoint_proxy {
        tracing::warn!(
            total = endpoint_admission.limits().total,
            per_source = endpoint_admission.limits().per_source,
            "managed endpoint connections capped at an eighth of the open-file limit, below --endpoint-max-connections"
        );
    }
    let bound = listener.local_addr()?;
    let advertise_urls = if cfg.advertise_urls.is_empty() {
        vec![default_url(bound)]
    } else {
        cfg.advertise_urls.clone()
    };
    let (dns, ips) = sans(bound, &advertise_urls, &cfg.extra_sans);
    let tls = crate::http::server::server_config(&secrets.ca, dns.clone(), ips.clone())?;
    // The autoscaler's port, bound before anything is served so a taken
    // port stops the start with its reason.
    let autoscaler = match cfg.autoscaler_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on --autoscaler-listen {addr}: {e}"))?;
            let tls = crate::grpc::tls_config(&secrets.ca, dns, ips)?;
            let bound_at = listener.local_addr()?;
            Some((listener, tls, bound_at))
        }
        None => None,
    };

    if let Some(token) = &secrets.first_admin_token {
        let file = ClientConfigFile {
            server: advertise_urls[0].clone(),
            ca_file: Some(ca_path.display().to_string()),
            token: Some(token.clone()),
        };
        file.write(&cfg.client_config)
            .with_context(|| format!("cannot write {}", cfg.client_config.display()))?;
        println!(
            "Drover coordinator initialised in {}.",
            cfg.data_dir.display()
        );
        // Standard output that is not a terminal is kept (the journal, read
        // by the adm and systemd-journal groups, or a file): the token is
        // shown only to a person at a terminal, and is in the 0600 file.
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            println!("Admin token (shown once, stored only as a hash): {token}");
            println!(
                "Client config written to {} (server, CA file and token).",
                cfg.client_config.display()
            );
        } else {
            println!(
                "Admin token written to the client config {} (mode 0600, with the server and CA file), not printed: standard output is not a terminal. Use it with `drover --config {}`, or read its token field.",
                cfg.client_config.display(),
                cfg.client_config.display()
            );
        }
    }
    println!("CA pin: {ca_pin}");
    println!(
        "Listening on https://{bound} (advertised as {})",
        advertise_urls.join(", ")
    );

    let (listen_tx, mut listen_rx) =
        tokio::sync::mpsc::unbounded_channel::<crate::app::ListenRequest>();
    let me = crate::types::ReplicaInfo {
        id: default_url(bound).trim_start_matches("https://").to_owned(),
        url: default_url(bound),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at: drover_common::now(),
        gateway_port: Some(bound.port()),
        advertise_urls: advertise_urls.clone(),
    };
    let leadership = match store.election() {
        Some(_) => crate::domain::leadership::Leadership::follower(me),
        None => crate::domain::leadership::Leadership::sole(me),
    };
    let app = App::new(crate::app::AppParts {
        leadership,
        store,
        secrets,
        ca_pin,
        settings: Settings {
            advertise_urls: advertise_urls.clone(),
            heartbeat_interval: cfg.heartbeat_interval,
            machine_cert_ttl: cfg.machine_cert_ttl,
            join_token_ttl: cfg.join_token_ttl,
            reconcile_period: Duration::from_secs(2).min(cfg.heartbeat_interval),
            health_defaults: drover_planner::health::Policy::defaults(cfg.heartbeat_timeout),
            endpoints: crate::domain::endpoint::EndpointSettings {
                ports: cfg.endpoint_ports,
                bind: bound.ip(),
                host: url_host(&advertise_urls[0]),
            },
            snapshot_dir: cfg.data_dir.join("snapshots"),
            autoscaler_address: autoscaler
                .as_ref()
                .map(|(_, _, at)| crate::grpc::advertised_address(&advertise_urls[0], *at)),
        },
        listen_requests: listen_tx,
        audit: crate::domain::audit::AuditLog::open(&cfg.data_dir.join("audit.log")).map_err(
            |source| StartupFileError {
                action: "open the audit log",
                path: cfg.data_dir.join("audit.log"),
                source,
            },
        )?,
        register_limiter: crate::domain::ratelimit::RateLimiter::new(
            cfg.registration_rate,
            cfg.registration_rate.saturating_mul(5),
        ),
    });
    app.grant_grace_to_all();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Datagram heartbeats on the listener's address and port, over UDP.
    let udp = crate::heartbeat_udp::start(app.clone(), bound, stop_rx.clone())
        .map_err(|e| {
            tracing::warn!(error = %e, "machines will heartbeat over HTTPS only");
        })
        .ok();
    start_tasks(&app, &cfg, endpoint_admission);
    let router = crate::http::router(app.clone());
    let connections = crate::http::server::ConnectionPolicy {
        body_timeout: cfg.request_body_timeout,
        admission,
        drain: cfg.drain,
        idle_timeout: cfg.idle_timeout,
    };

    // Extra listeners on Docker network gateways, at the main port (the
    // port every replica announces as its `gatewayPort`, stable across
    // restarts, so the URLs in machines' bootstrap documents stay valid).
    let extra = {
        let tls = tls.clone();
        let router = router.clone();
        let stop = stop_rx.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let mut listening = std::collections::HashSet::new();
            let mut servers = vec![];
            while let Some(req) = listen_rx.recv().await {
                if bound.ip().is_unspecified()
                    || req.ip == bound.ip()
                    || listening.contains(&req.ip)
                {
                    let _ = req.reply.send(Ok(bound.port()));
                    continue;
                }
                let addr = SocketAddr::new(req.ip, bound.port());
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => {
                        tracing::info!(%addr, "also listening on a machine network");
                        listening.insert(req.ip);
                        if let Err(e) = crate::heartbeat_udp::start(app.clone(), addr, stop.clone())
                        {
                            tracing::warn!(error = %e, "machines on this network will heartbeat over HTTPS only");
                        }
                        let mut stop = stop.clone();
                        servers.push(tokio::spawn(crate::http::server::run(
                            l,
                            tls.clone(),
                            router.clone(),
                            async move {
                                let _ = stop.changed().await;
                            },
                            connections,
                        )));
                        let _ = req.reply.send(Ok(bound.port()));
                    }
                    Err(e) => {
                        let _ = req
                            .reply
                            .send(Err(crate::app::ListenError::Bind { addr, source: e }));
                    }
                }
            }
            for s in servers {
                let _ = s.await;
            }
        })
    };
    let autoscaler_served = autoscaler.map(|(listener, tls, at)| {
        tracing::info!(%at, "serving the cluster-autoscaler's externalgrpc service");
        let mut stop = stop_rx.clone();
        tokio::spawn(crate::grpc::serve(app.clone(), listener, tls, async move {
            let _ = stop.changed().await;
        }))
    });
    tracing::info!(%bound, "coordinator serving");
    let served = {
        let app = app.clone();
        tokio::spawn(async move {
            crate::http::server::run(listener, tls, router, shutdown, connections).await;
            let _ = stop_tx.send(true);
            app.tasks.shutdown().await;
            extra.abort();
            if let Some(t) = autoscaler_served {
                let _ = t.await;
            }
            if let Some(t) = udp {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
            }
            tracing::info!("coordinator stopped");
        })
    };
    Ok(Running {
        addr: bound,
        app,
        served,
    })
}

/// Registers and starts every background task of a coordinator with the
/// driver (`app.tasks`); the registrar's started with `app`.
fn start_tasks(
    app: &std::sync::Arc<App>,
    cfg: &ServeConfig,
    endpoint_admission: std::sync::Arc<drover_common::tcp_proxy::Admission>,
) {
    use crate::tasks::Start;
    let tasks = &app.tasks;
    let reconciler = tasks.register(
        crate::tasks::RECONCILER_TASK,
        Some(app.settings.reconcile_period),
    );
    tasks.start(
        reconciler.clone(),
        Start::Now,
        crate::reconcile::controller::Reconciler::new(app.clone(), reconciler),
    );
    // Silence measured across the coordinator's own stalls is excused.
    tasks.spawn(
        "stall-clock",
        Some(crate::domain::liveness::TICK),
        Start::Now,
        crate::domain::liveness::Ticker(app.fleet.stalls.clone()),
    );
    // Every replica answers /metrics and the web overview from it.
    tasks.spawn(
        "fleet-summary",
        Some(crate::summary::PERIOD),
        Start::Now,
        crate::summary::Summarizer::new(app.clone()),
    );
    // Every replica serves watches from it.
    tasks.spawn(
        "change-log",
        Some(crate::summary::PERIOD),
        Start::Now,
        crate::change_log::Recorder::new(app.store.clone(), app.fleet.changes.clone()),
    );
    tasks.spawn(
        "free-machines",
        Some(app.settings.heartbeat_interval),
        Start::Now,
        crate::reconcile::controller::FreeMachines::new(app.clone()),
    );
    if let Some(election) = app.store.election().cloned() {
        tasks.spawn(
            "leader-election",
            Some(cfg.leader_lease / 3),
            Start::Now,
            crate::leader::LeaderElection::new(app.clone(), election, cfg.leader_lease),
        );
    }
    tasks.spawn(
        "orphan-sweeper",
        Some(Duration::from_secs(15)),
        Start::Now,
        crate::reconcile::provisioner::Sweeper(app.clone()),
    );
    // Machines of docker clusters made before this start, or by another
    // replica, reach this one only once it listens on their gateway.
    tasks.spawn(
        "gateway-listeners",
        Some(crate::reconcile::provisioner::GATEWAY_CHECK_PERIOD),
        Start::Now,
        crate::reconcile::provisioner::GatewayListeners::new(app.clone()),
    );
    tasks.spawn(
        "memory-trimmer",
        Some(crate::memory::TRIM_PERIOD),
        Start::AfterPeriod,
        crate::memory::Trimmer,
    );
    // Every replica serves the managed control-plane endpoints.
    tasks.spawn(
        "endpoint-proxies",
        Some(crate::proxy::PERIOD),
        Start::Now,
        crate::proxy::EndpointProxies::new(app.clone(), endpoint_admission),
    );
}

/// Opens the store `--store` names: SQLite in the data directory (or the
/// directory given), or etcd.
fn open_store(cfg: &ServeConfig) -> anyhow::Result<Store> {
    use anyhow::Context;
    match &cfg.store {
        Location::Sqlite(dir) => {
            let dir = dir.as_deref().unwrap_or(&cfg.data_dir);
            std::fs::create_dir_all(dir).map_err(|source| StartupFileError {
                action: "create the store directory",
                path: dir.to_owned(),
                source,
            })?;
            let db = dir.join("drover.db");
            Store::open_sqlite_exclusive(&db)
                .with_context(|| format!("cannot open the store {}", db.display()))
        }
        Location::Etcd { endpoints, prefix } => {
            let mut options = EtcdOptions::new(endpoints.clone(), prefix.clone());
            options.tls = cfg.etcd_tls()?;
            Store::open_etcd(&options)
                .with_context(|| format!("cannot open the store {}", cfg.store))
        }
    }
}

/// Loads the encryption keyring and checks every secret opens with it
/// before anything else runs; a store whose secrets cannot be decrypted is
/// refused with the reason.
fn open_sealed(store: Store, cfg: &ServeConfig) -> anyhow::Result<Store> {
    use anyhow::Context;
    let first_start = !store.has_secrets()?;
    let key_file = cfg.key_file();
    if !first_start && std::env::var(crate::store::keyring::KEY_ENV).is_err() && !key_file.exists()
    {
        anyhow::bail!(
            "refusing to start: the store ({}) holds encrypted secrets but the encryption key file {} does not exist; start with the key this store was written with (--encryption-key-file or {})",
            store.describe(),
            key_file.display(),
            crate::store::keyring::KEY_ENV
        );
    }
    let (keyring, created) = crate::store::keyring::Keyring::load(&key_file, first_start)
        .context("refusing to start: cannot load the encryption key")?;
    if created {
        tracing::warn!(
            key_file = %key_file.display(),
            key_id = keyring.primary_id(),
            "generated the encryption key for secrets at rest; keep it out of store backups, or move it and pass --encryption-key-file"
        );
    }
    let store = store.with_keyring(std::sync::Arc::new(std::sync::RwLock::new(keyring)));
    let resealed = store
        .reseal_all()
        .context("refusing to start: the store's secrets cannot be decrypted with this key")?;
    if resealed > 0 {
        tracing::info!(resealed, "re-encrypted secrets with the primary key");
    }
    Ok(store)
}

fn default_url(bound: SocketAddr) -> String {
    match bound.ip() {
        ip if ip.is_unspecified() => {
            let host = nix_hostname().unwrap_or_else(|| "localhost".into());
            format!("https://{host}:{}", bound.port())
        }
        IpAddr::V6(ip) => format!("https://[{ip}]:{}", bound.port()),
        IpAddr::V4(ip) => format!("https://{ip}:{}", bound.port()),
    }
}

/// The host's name, from gethostname(2): /proc/sys may be hidden (the
/// systemd unit's ProcSubset=pid).
fn nix_hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|s| s.into_string().ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn sans(bound: SocketAddr, urls: &[String], extra: &[String]) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = vec![
        "localhost".to_string(),
        crate::provider::docker::COORDINATOR_HOST.to_string(),
    ];
    let mut ips: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    if let Some(h) = nix_hostname() {
        dns.push(h);
    }
    if !bound.ip().is_unspecified() {
        ips.push(bound.ip());
    }
    let hosts = urls.iter().filter_map(|u| {
        let rest = u.strip_prefix("https://")?;
        let hostport = rest.split('/').next()?;
        let host = if let Some(v6) = hostport.strip_prefix('[') {
            v6.split(']').next()?
        } else {
            hostport
                .rsplit_once(':')
                .map(|(h, _)| h)
                .unwrap_or(hostport)
        };
        Some(host.to_owned())
    });
    for h in hosts.chain(extra.iter().cloned()) {
        match h.parse::<IpAddr>() {
            Ok(ip) => ips.push(ip),
            Err(_) => dns.push(h),
        }
    }
    dns.sort();
    dns.dedup();
    ips.sort();
    ips.dedup();
    (dns, ips)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; draining"),
        _ = int.recv() => tracing::info!("SIGINT received; draining"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> ServeConfig {
        ServeConfig {
            data_dir: dir.join("data"),
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise_urls: vec![],
            extra_sans: vec![],
            autoscaler_listen: None,
            heartbeat_interval: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(40),
            machine_cert_ttl: Duration::from_secs(24 * 3600),
            join_token_ttl: Duration::from_secs(1800),
            client_config: dir.join("client.yaml"),
            drain: Duration::from_secs(10),
            idle_timeout: None,
            encryption_key_file: Some(dir.join("key")),
            registration_rate: 20,
            leader_lease: Duration::from_secs(15),
            store: Location::Sqlite(None),
            etcd_ca_file: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            request_body_timeout: Duration::from_secs(30),
            endpoint_ports: (36443, 36542),
            unauthenticated: crate::http::server::UnauthenticatedCaps {
                per_source: 256,
                total: 4096,
            },
            endpoint_proxy: Default::default(),
        }
    }

    #[test]
    fn connection_caps_and_the_key_file_mode_are_checked_before_anything_starts() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let refused = |cfg: ServeConfig| cfg.validate().unwrap_err().to_string();
        config(dir.path()).validate().unwrap();
        let mut cfg = config(dir.path());
        cfg.unauthenticated.per_source = 0;
        assert!(refused(cfg).contains("must be at least 1"));
        let mut cfg = config(dir.path());
        cfg.unauthenticated.per_source = 5000;
        let msg = refused(cfg);
        assert!(
            msg.contains("must not exceed --max-unauthenticated-connections"),
            "{msg}"
        );
        let mut cfg = config(dir.path());
        cfg.endpoint_proxy.per_source = cfg.endpoint_proxy.total + 1;
        assert!(refused(cfg).contains("--endpoint-max-connections-per-source"));
        let mut cfg = config(dir.path());
        cfg.request_body_timeout = Duration::from_millis(10);
        assert!(refused(cfg).contains("--request-body-timeout"));

        let key = dir.path().join("key");
        std::fs::write(&key, "x\n").unwrap();
        for (mode, ok) in [
            (0o600, true),
            (0o640, true),
            (0o644, true),
            (0o660, false),
            (0o602, false),
        ] {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            match config(dir.path()).validate() {
                Ok(_) => assert!(ok, "mode {mode:o} accepted"),
                Err(e) => {
                    assert!(!ok, "mode {mode:o} refused: {e}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&format!("chmod 600 {}", key.display())),
                        "{msg}"
                    );
                }
            }
        }
    }

    #[test]
    fn start_up_file_errors_name_the_path_and_what_to_do() {
        let e = StartupFileError {
            action: "set mode 0700 on the data directory",
            path: "/srv/drover".into(),
            source: std::io::Error::from_raw_os_error(libc::EROFS),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("/srv/drover") && msg.contains("mount it read-write"),
            "{msg}"
        );
        let e = StartupFileError {
            action: "write in the data directory",
            path: "/srv/drover/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert!(e.to_string().contains("free space"), "{e}");
        // A file where the data directory should be.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, "").unwrap();
        let msg = prepare_data_dir(&file.join("sub")).unwrap_err().to_string();
        assert!(
            msg.contains(&file.join("sub").display().to_string()),
            "{msg}"
        );
    }

    #[test]
    fn store_flags_are_checked_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let ca = drover_common::pki::CertificateAuthority::generate("etcd CA").unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &ca.cert_pem).unwrap();
        let key_file = dir.path().join("ca.key");
        std::fs::write(&key_file, &ca.key_pem).unwrap();
        let (sqlite, etcd) = (
            Location::Sqlite(None),
            "etcd://127.0.0.1:2379".parse().unwrap(),
        );
        let refused =
            |store: &Location, ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>| {
                match store_settings(store, ca, cert, key) {
                    Err(e) => e.to_string(),
                    Ok(_) => panic!("accepted {store} {ca:?} {cert:?} {key:?}"),
                }
            };
        assert!(store_settings(&sqlite, None, None, None).unwrap().is_none());
        assert!(store_settings(&etcd, None, None, None).unwrap().is_none());
        assert!(store_settings(&etcd, Some(&ca_file), None, None)
            .unwrap()
            .is_some());
        // The CA's own certificate and key make a client identity too.
        assert!(
            store_settings(&etcd, Some(&ca_file), Some(&ca_file), Some(&key_file))
                .unwrap()
                .is_some()
        );

        let msg = refused(&sqlite, Some(&ca_file), None, None);
        assert!(msg.contains("--etcd-ca-file is for an etcd store"), "{msg}");
        let msg = refused(&etcd, Some(&ca_file), Some(&ca_file), None);
        assert!(msg.contains("--etcd-key-file"), "{msg}");
        let msg = refused(&etcd, Some(&ca_file), None, Some(&key_file));
        assert!(
            msg.contains("--etcd-key-file needs --etcd-cert-file"),
            "{msg}"
        );
        let msg = refused(&etcd, None, Some(&ca_file), Some(&key_file));
        assert!(msg.contains("needs --etcd-ca-file"), "{msg}");
        let missing = dir.path().join("missing.crt");
        let msg = refused(&etcd, Some(&missing), None, None);
        assert!(
            msg.contains("--etcd-ca-file") && msg.contains("missing.crt"),
            "{msg}"
        );
        let msg = refused(&etcd, Some(&key_file), None, None);
        assert!(
            msg.contains("--etcd-ca-file") && msg.contains("no PEM certificate"),
            "{msg}"
        );
        let msg = refused(&etcd, Some(&ca_file), Some(&key_file), Some(&key_file));
        assert!(msg.contains("--etcd-cert-file"), "{msg}");
        let msg = refused(&etcd, Some(&ca_file), Some(&ca_file), Some(&ca_file));
        assert!(msg.contains("--etcd-key-file"), "{msg}");
        let file = Location::Sqlite(Some(ca_file.clone()));
        let msg = refused(&file, None, None, None);
        assert!(msg.contains("--store sqlite:"), "{msg}");
    }
}
