//! The operator commands: apply, get, describe, delete, kubeconfig, token.

pub mod client;
pub mod documents;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context};
use drover_common::api::{
    Cluster, CreateRegistrationToken, CreatedRegistrationToken, KubeconfigResponse, Machine,
    MachinePhase, ProviderSpec, RegistrationToken, SecretInfo,
};
use drover_common::wire::ProbeState;
use time::OffsetDateTime;

use crate::cli::client::{Client, ConnectArgs};

/// The operator commands: each talks to a coordinator through [`Client`].
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create or update Clusters and Secrets from YAML files, a directory or
    /// standard input.
    Apply(ApplyArgs),
    /// List objects.
    Get(GetArgs),
    /// Show one object in detail.
    Describe(DescribeArgs),
    /// Delete an object.
    Delete(DeleteArgs),
    /// Print an admin kubeconfig for a cluster.
    Kubeconfig(KubeconfigArgs),
    /// Manage registration tokens for self-registering machines.
    Token(TokenArgs),
    /// Change the replica count of one pool of a cluster.
    Scale(ScaleArgs),
    /// Manage admin tokens (roles admin and viewer).
    AdminToken(AdminTokenArgs),
    /// Manage the keys that encrypt secrets at rest.
    Keys(KeysArgs),
    /// Show the audit log.
    Audit(AuditArgs),
    /// Revoke a machine's identity: every certificate of it is refused from
    /// its next request on.
    Revoke(RevokeArgs),
    /// Follow or resume a cluster's rollout to a new version or image.
    Rollout(RolloutArgs),
    /// Print this client's version and the coordinator's.
    Version(VersionArgs),
}

#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Print only the client's version; do not ask the coordinator.
    #[arg(long)]
    pub client: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `drover version`: the client's version, then the coordinator's (its
/// replica and whether it leads). Exits 69 after the client line when the
/// coordinator cannot be reached.
async fn version(v: VersionArgs) -> anyhow::Result<()> {
    println!("client: drover {}", env!("CARGO_PKG_VERSION"));
    if v.client {
        return Ok(());
    }
    /// The part of `GET /v1/status` this command reads.
    #[derive(serde::Deserialize)]
    struct Status {
        version: String,
        replica: crate::types::ReplicaInfo,
        leader: bool,
    }
    let s: Status = Client::connect(&v.conn)?.get("/v1/status").await?;
    println!(
        "server: drover {} (replica {}, {})",
        s.version,
        s.replica.id,
        if s.leader { "leader" } else { "follower" }
    );
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: RolloutCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Show each pool's progress (`2/3 at v1.32.0`) and any halt.
    Status(RolloutStatusArgs),
    /// Resume a halted rollout: the next step is taken again.
    Resume(RolloutResumeArgs),
}

#[derive(Debug, clap::Args)]
pub struct RolloutStatusArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// Follow the rollout until it is done or halted, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "60m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub struct RolloutResumeArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// A YAML or JSON file of Clusters and Secrets (documents separated by
    /// `---`), a directory (its .yaml, .yml and .json files in name order),
    /// or `-` for standard input; may be given more than once. Objects are
    /// applied in order; the first refused stops the rest.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// Wait until the cluster is Running, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "15m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Resource {
    #[value(alias = "cluster")]
    Clusters,
    #[value(alias = "machine")]
    Machines,
    #[value(alias = "token", alias = "registrationtokens")]
    Tokens,
    /// The coordinator replicas sharing the store, and the leader.
    #[value(alias = "coordinator")]
    Coordinators,
    /// The coordinator's background tasks and their last runs.
    #[value(alias = "task")]
    Tasks,
    /// Secrets machine files read: keys and sizes, never values (admin
    /// tokens only).
    #[value(alias = "secret")]
    Secrets,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Columns (for `describe`: the text view).
    #[value(alias = "text")]
    Table,
    /// More columns.
    Wide,
    Json,
    Yaml,
    /// `kind/name`, one per line.
    Name,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    pub resource: Resource,
    /// Show only this object.
    #[arg(value_parser = object_name)]
    pub name: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    /// Include deleted machines kept for their history.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// After the list, print each object again whenever it changes (a row,
    /// or one JSON document per line with -o json), and `kind/name deleted`
    /// when it goes; until interrupted.
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Single {
    Cluster,
    Machine,
    Secret,
}

#[derive(Debug, clap::Args)]
pub struct DescribeArgs {
    pub kind: Single,
    #[arg(value_parser = object_name)]
    pub name: String,
    /// `table` (or `text`, `wide`): the text view; `json`, `yaml`: the
    /// whole object; `name`: `kind/name`.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    pub kind: Single,
    #[arg(value_parser = object_name)]
    pub name: String,
    /// Wait until the object is gone.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "10m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Revocable {
    Machine,
}

#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    pub kind: Revocable,
    #[arg(value_parser = object_name)]
    pub name: String,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `drover revoke machine NAME`.
async fn revoke(r: RevokeArgs) -> anyhow::Result<()> {
    let client = Client::connect(&r.conn)?;
    match r.kind {
        Revocable::Machine => {
            let m: Machine = client
                .post(
                    &api_path(&["v1", "machines", &r.name, "revoke"]),
                    &serde_json::json!({}),
                )
                .await?;
            println!(
                "machine/{} identity revoked at {}: its certificates are refused from their next request; it needs a new ticket to come back",
                m.metadata.name,
                m.status
                    .identity_revoked_at
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            );
            Ok(())
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// Lifetime of the client certificate.
    #[arg(long, default_value = "1h", value_parser = drover_common::api::parse_duration)]
    pub ttl: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Create a registration token and print its bootstrap document.
    Create {
        /// The pool machines registering with it join.
        #[arg(long, value_parser = object_name)]
        pool: String,
        #[arg(long, default_value = "1h", value_parser = drover_common::api::parse_duration)]
        ttl: std::time::Duration,
        /// How many machines may register with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// Labels for the machines, as k=v,k2=v2.
        #[arg(long, value_parser = parse_labels, default_value = "")]
        labels: BTreeMap<String, String>,
        /// Write the bootstrap document to this file instead of standard output.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// List registration tokens.
    List {
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Revoke a registration token.
    Revoke {
        #[arg(value_parser = object_name)]
        name: String,
        #[command(flatten)]
        conn: ConnectArgs,
    },
}

/// Why a `--labels` value is refused.
#[derive(Debug, thiserror::Error)]
enum LabelsError {
    #[error("label {0:?} must be key=value")]
    NotKeyValue(String),
    #[error("{0} (keys: an optional DNS subdomain and '/', then up to 63 letters, digits, '-', '_' and '.'; values: empty or the same shape)")]
    Invalid(drover_common::names::NameError),
}

fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, LabelsError> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| LabelsError::NotKeyValue(pair.to_owned()))?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    if let Some(e) = drover_common::names::check_labels(&out).into_iter().next() {
        return Err(LabelsError::Invalid(e));
    }
    Ok(out)
}

/// Parses an object name argument: a DNS-1123 subdomain, checked before any
/// request so a name can never reach another path (`../admintokens/x`).
fn object_name(s: &str) -> Result<String, drover_common::names::NameError> {
    drover_common::names::check_object_name("name", s).map(|()| s.to_owned())
}

/// An API path from its segments, each percent-encoded.
fn api_path(segments: &[&str]) -> String {
    crate::cli::client::path(segments)
}

/// Runs one operator command.
pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Apply(a) => apply(a).await,
        Command::Get(g) => get(g).await,
        Command::Describe(d) => describe(d).await,
        Command::Delete(d) => delete(d).await,
        Command::Kubeconfig(k) => {
            let client = Client::connect(&k.conn)?;
            let resp: KubeconfigResponse = client
                .post(
                    &api_path(&["v1", "clusters", &k.cluster, "kubeconfig"]),
                    &serde_json::json!({"ttlSeconds": k.ttl.as_secs()}),
                )
                .await?;
            print!("{}", resp.kubeconfig);
            eprintln!("# client certificate expires at {}", resp.expires_at);
            Ok(())
        }
        Command::Token(t) => token(t.command).await,
        Command::Scale(s) => scale(s).await,
        Command::AdminToken(t) => admin_token(t.command).await,
        Command::Keys(k) => keys(k.command).await,
        Command::Audit(a) => audit(a).await,
        Command::Revoke(r) => revoke(r).await,
        Command::Rollout(r) => rollout(r.command).await,
        Command::Version(v) => version(v).await,
    }
}

/// One line per pool of a cluster's rollout, or that none is under way.
pub fn rollout_lines(c: &Cluster) -> Vec<String> {
    if c.status.observed_generation < c.metadata.generation {
        return vec![format!(
            "the coordinator has not planned generation {} yet",
            c.metadata.generation
        )];
    }
    let Some(r) = &c.status.rollout else {
        return vec![format!(
            "no rollout: every machine is at {}",
            c.spec.kubernetes_version
        )];
    };
    let verb = if c.spec.provider.creates_machines() {
        "replace"
    } else {
        "upgrade"
    };
    let mut out: Vec<String> = r
        .pools
        .iter()
        .map(|p| {
            format!(
                "{}: {}/{} at {}{}",
                p.name,
                p.updated,
                p.desired,
                r.version,
                if p.outdated > 0 {
                    format!(", {} to {verb}", p.outdated)
                } else {
                    String::new()
                }
            )
        })
        .collect();
    if let Some(u) = &c.status.machine_upgrade {
        out.push(format!(
            "upgrading {} in place ({}): {} since {}{}",
            u.machine,
            u.command,
            u.step,
            rfc3339(u.requested_at),
            match &u.result {
                Some(r) if !r.ok => format!(" (failed: {})", printable(&r.message)),
                _ => String::new(),
            }
        ));
    }
    if let Some(w) = &r.waiting_for {
        out.push(format!("waiting for {}", printable(w)));
    }
    for f in &r.failures {
        out.push(format!(
            "new machine {} failed (step {}): {}",
            f.machine,
            f.step,
            printable(&f.reason)
        ));
    }
    if let Some(h) = &r.halted {
        out.push(format!(
            "HALTED at machine {} (step {}): {}; `drover rollout resume {}` to go on",
            h.machine,
            h.step,
            printable(&h.reason),
            c.metadata.name
        ));
    }
    out
}

async fn rollout(command: RolloutCommand) -> anyhow::Result<()> {
    match command {
        RolloutCommand::Resume(r) => {
            let client = Client::connect(&r.conn)?;
            let c: Cluster = client
                .post(
                    &api_path(&["v1", "clusters", &r.cluster, "rollout", "resume"]),
                    &serde_json::json!({}),
                )
                .await?;
            println!("cluster/{} rollout resumed", c.metadata.name);
            Ok(())
        }
        RolloutCommand::Status(s) => {
            let client = Client::connect(&s.conn)?;
            let path = api_path(&["v1", "clusters", &s.cluster]);
            if !s.wait {
                let c: Cluster = client.get(&path).await?;
                for line in rollout_lines(&c) {
                    println!("{line}");
                }
                return Ok(());
            }
            let deadline = std::time::Instant::now() + s.timeout;
            let started = std::time::Instant::now();
            let mut last = vec![];
            loop {
                let c: Cluster = client.get(&path).await?;
                let lines = rollout_lines(&c);
                if lines != last {
                    eprintln!(
                        "{:>4}s  cluster/{}: {}",
                        started.elapsed().as_secs(),
                        s.cluster,
                        lines.join("; ")
                    );
                    last = lines;
                }
                match &c.status.rollout {
                    None if c.status.observed_generation >= c.metadata.generation => {
                        println!(
                            "cluster/{}: rollout done, every machine is at {}",
                            s.cluster, c.spec.kubernetes_version
                        );
                        return Ok(());
                    }
                    Some(r) if r.halted.is_some() => {
                        bail!(
                            "cluster/{}: the rollout is halted: {}",
                            s.cluster,
                            last.join("; ")
                        )
                    }
                    _ => {}
                }
                if std::time::Instant::now() > deadline {
                    bail!(
                        "cluster/{}: the rollout is not done after {:?}: {}",
                        s.cluster,
                        s.timeout,
                        last.join("; ")
                    );
                }
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

async fn apply(a: ApplyArgs) -> anyhow::Result<()> {
    // Every document is read and checked before the first is sent.
    let objects = documents::read_all(&a.files)?
        .iter()
        .map(documents::Document::object)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{e}; nothing was applied"))?;
    let client = Client::connect(&a.conn)?;
    let mut clusters = Vec::new();
    for (done, o) in objects.iter().enumerate() {
        let applied = apply_object(&client, o).await.map_err(|e| {
            let before = match done {
                0 => "nothing was applied".to_owned(),
                1 => "the object before it was applied".to_owned(),
                n => format!("the {n} objects before it were applied"),
            };
            e.context(format!(
                "{} ({}/{}) was refused; {before}, none after it",
                o.at, o.kind, o.name
            ))
        })?;
        if let Some(generation) = applied {
            clusters.push((o.name.clone(), generation));
        }
    }
    if a.wait {
        for (name, generation) in clusters {
            wait_running(&client, &name, generation, a.timeout).await?;
        }
    }
    Ok(())
}

/// Sends one checked object and prints its line; a cluster's generation
/// for `--wait`.
async fn apply_object(client: &Client, o: &documents::Object) -> anyhow::Result<Option<u64>> {
    match o.kind {
        documents::Kind::Secret => {
            let s: SecretInfo = client
                .put_yaml(&api_path(&["v1", "secrets", &o.name]), o.body.clone())
                .await?;
            println!(
                "secret/{} applied (generation {}, keys {})",
                s.metadata.name,
                s.metadata.generation,
                s.keys
                    .iter()
                    .map(|k| k.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(None)
        }
        documents::Kind::Cluster => {
            let c: Cluster = client
                .put_yaml(&api_path(&["v1", "clusters", &o.name]), o.body.clone())
                .await?;
            println!(
                "cluster/{} applied (generation {}, resourceVersion {})",
                c.metadata.name,
                c.metadata.generation,
                c.metadata.resource_version.unwrap_or_default()
            );
            Ok(Some(c.metadata.generation))
        }
    }
}

/// Polls the cluster until it is Running at `generation`, printing a line
/// whenever its progress changes (a live line on a terminal).
async fn wait_running(
    client: &Client,
    name: &str,
    generation: u64,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let started = std::time::Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last = String::new();
    loop {
        let c: Cluster = client.get(&api_path(&["v1", "clusters", name])).await?;
        let pools: Vec<String> = c
            .status
            .pools
            .iter()
            .map(|p| format!("{} {}/{}", p.name, p.running, p.desired))
            .collect();
        let line = format!("{} [{}]", c.status.phase, pools.join(", "));
        if line != last {
            if tty {
                eprint!(
                    "\r\x1b[2K{:>4}s  cluster/{name}: {line}",
                    started.elapsed().as_secs()
                );
            } else {
                eprintln!(
                    "{:>4}s  cluster/{name}: {line}",
                    started.elapsed().as_secs()
                );
            }
            last = line;
        }
        if c.status.phase == drover_common::api::ClusterPhase::Running
            && c.status.observed_generation >= generation
        {
            if tty {
                eprintln!();
            }
            println!("cluster/{name} is Running");
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            if tty {
                eprintln!();
            }
            bail!(
                "cluster {name} is not Running after {:?} (it is {}); see `drover describe cluster {name}`",
                timeout,
                c.status.phase
            );
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// `drover scale`: change one pool's replica count.
pub async fn scale(s: ScaleArgs) -> anyhow::Result<()> {
    let client = Client::connect(&s.conn)?;
    let mut c: Cluster = client
        .get(&api_path(&["v1", "clusters", &s.cluster]))
        .await?;
    if s.pool == drover_common::api::CONTROL_PLANE_POOL {
        c.spec.control_plane.replicas = s.replicas;
    } else {
        let pool = c
            .spec
            .worker_pools
            .iter_mut()
            .find(|p| p.name == s.pool)
            .with_context(|| format!("cluster {} has no pool {:?}", s.cluster, s.pool))?;
        pool.replicas = s.replicas;
    }
    c.status = Default::default();
    let generation_before = c.metadata.generation;
    let yaml = serde_saphyr::to_string(&c)?;
    let updated: Cluster = client
        .put_yaml(&api_path(&["v1", "clusters", &s.cluster]), yaml)
        .await?;
    println!(
        "cluster/{} pool {} scaled to {} (generation {} -> {})",
        s.cluster, s.pool, s.replicas, generation_before, updated.metadata.generation
    );
    if s.wait {
        wait_running(&client, &s.cluster, updated.metadata.generation, s.timeout).await?;
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    #[arg(value_parser = object_name)]
    pub cluster: String,
    /// The pool: `control-plane` or a worker pool name.
    #[arg(long, default_value = "default", value_parser = object_name)]
    pub pool: String,
    #[arg(long)]
    pub replicas: u32,
    /// Wait until the cluster is Running again.
    #[arg(long)]
    pub wait: bool,
    #[arg(long, default_value = "15m", value_parser = drover_common::api::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

async fn get(g: GetArgs) -> anyhow::Result<()> {
    let client = Client::connect(&g.conn)?;
    let listing = fetch(&client, &g).await?;
    print_listing(&listing, g.output)?;
    if !g.watch {
        return Ok(());
    }
    let mut widths = column_widths(&listing.rows);
    let mut seen: std::collections::HashMap<String, String> =
        listing.rendered(g.output).into_iter().collect();
    loop {
        tokio::time::sleep(WATCH_PERIOD).await;
        let listing = fetch(&client, &g).await?;
        let now = listing.rendered(g.output);
        for (i, (name, text)) in now.iter().enumerate() {
            if seen.get(name) == Some(text) {
                continue;
            }
            match g.output {
                Output::Table | Output::Wide => {
                    let row = &listing.rows[i + 1];
                    for (w, c) in widths.iter_mut().zip(row) {
                        *w = (*w).max(printable(c).chars().count());
                    }
                    println!("{}", table_line(row, &widths));
                }
                _ => println!("{text}"),
            }
        }
        for name in seen.keys().filter(|n| !now.iter().any(|(m, _)| m == *n)) {
            println!("{}/{name} deleted", listing.kind);
        }
        seen = now.into_iter().collect();
        use std::io::Write;
        std::io::stdout().flush()?;
    }
}

/// How often `--watch` lists again.
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// What `drover get` shows: the objects (for json, yaml and name) and the
/// table (header first) for the output asked.
struct Listing {
    kind: &'static str,
    objects: Vec<serde_json::Value>,
    rows: Vec<Vec<String>>,
}

impl Listing {
    fn new<T: serde::Serialize>(
        kind: &'static str,
        list: &[T],
        output: Output,
        table: fn(&[T], bool) -> Vec<Vec<String>>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            kind,
            objects: list
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?,
            rows: table(list, output == Output::Wide),
        })
    }

    /// Each object's name and how it prints in `output`, in list order.
    fn rendered(&self, output: Output) -> Vec<(String, String)> {
        self.objects
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let text = match output {
                    Output::Table | Output::Wide => self.rows[i + 1].join("\u{1f}"),
                    Output::Name => format!("{}/{}", self.kind, object_name_of(o)),
                    _ => serde_json::to_string(o).unwrap_or_default(),
                };
                (object_name_of(o), text)
            })
            .collect()
    }
}

/// An object's name: `metadata.name`, else `name`, else `replica.id`.
fn object_name_of(o: &serde_json::Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .or(o["name"].as_str())
        .or(o["replica"]["id"].as_str())
        .unwrap_or("?")
        .to_owned()
}

fn print_listing(l: &Listing, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&l.objects)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&l.objects)?),
        Output::Name => {
            for o in &l.objects {
                println!("{}/{}", l.kind, object_name_of(o));
            }
        }
        Output::Table | Output::Wide => print_table(&l.rows),
    }
    Ok(())
}

async fn fetch(client: &Client, g: &GetArgs) -> anyhow::Result<Listing> {
    match g.resource {
        Resource::Clusters => {
            let list: Vec<Cluster> = match &g.name {
                Some(n) => vec![client.get(&api_path(&["v1", "clusters", n])).await?],
                None => client.get("/v1/clusters").await?,
            };
            Listing::new("cluster", &list, g.output, clusters_table)
        }
        Resource::Machines => {
            let list: Vec<Machine> = match &g.name {
                Some(n) => vec![client.get(&api_path(&["v1", "machines", n])).await?],
                None => client
                    .get::<Vec<Machine>>("/v1/machines")
                    .await?
                    .into_iter()
                    .filter(|m| {
                        g.all || m.status.phase != drover_common::api::MachinePhase::Deleted
                    })
                    .collect(),
            };
            if g.output == Output::Wide {
                // The kubelet that runs is what its Node reports, on the
                // cluster's status.
                let clusters: Vec<Cluster> = client.get("/v1/clusters").await?;
                let kubelets: std::collections::HashMap<(String, String), String> = clusters
                    .iter()
                    .flat_map(|c| {
                        c.status.nodes.iter().map(|n| {
                            (
                                (c.metadata.name.clone(), n.name.clone()),
                                n.kubelet_version.clone(),
                            )
                        })
                    })
                    .collect();
                let mut l = Listing::new("machine", &list, g.output, machines_table)?;
                l.rows = machines_rows(&list, true, &kubelets);
                return Ok(l);
            }
            Listing::new("machine", &list, g.output, machines_table)
        }
        Resource::Tokens => {
            let list: Vec<RegistrationToken> = client.get("/v1/registrationtokens").await?;
            Listing::new("token", &list, g.output, tokens_table)
        }
        Resource::Coordinators => {
            let list: Vec<crate::types::CoordinatorEntry> = client.get("/v1/coordinators").await?;
            Listing::new("coordinator", &list, g.output, coordinators_table)
        }
        Resource::Tasks => {
            /// The part of `GET /v1/status` this command reads.
            #[derive(serde::Deserialize)]
            struct Status {
                tasks: Vec<crate::types::TaskStatus>,
            }
            let status: Status = client.get("/v1/status").await?;
            let list: Vec<_> = match &g.name {
                Some(n) => {
                    let task = status.tasks.into_iter().find(|t| &t.name == n);
                    vec![task.ok_or_else(|| {
                        anyhow::anyhow!(
                            "the coordinator has no background task named {n:?}; `drover get tasks` lists them"
                        )
                    })?]
                }
                None => status.tasks,
            };
            Listing::new("task", &list, g.output, tasks_table)
        }
        Resource::Secrets => {
            let list: Vec<SecretInfo> = match &g.name {
                Some(n) => vec![client.get(&api_path(&["v1", "secrets", n])).await?],
                None => client.get("/v1/secrets").await?,
            };
            Listing::new("secret", &list, g.output, secrets_table)
        }
    }
}

fn secrets_table(list: &[SecretInfo], _wide: bool) -> Vec<Vec<String>> {
    let mut rows = vec![["NAME", "KEYS", "BYTES", "AGE"].map(String::from).to_vec()];
    for s in list {
        rows.push(vec![
            s.metadata.name.clone(),
            s.keys
                .iter()
                .map(|k| k.key.as_str())
                .collect::<Vec<_>>()
                .join(","),
            s.keys.iter().map(|k| k.bytes).sum::<usize>().to_string(),
            age(s.metadata.creation_timestamp),
        ]);
    }
    rows
}

/// `drover describe secret NAME`: its keys and sizes, and the files of
/// clusters that read it.
fn describe_secret(s: &SecretInfo, clusters: &[Cluster]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "Name:        {}", s.metadata.name);
    let _ = writeln!(
        out,
        "Created:     {} ago",
        age(s.metadata.creation_timestamp)
    );
    let _ = writeln!(out, "Generation:  {}", s.metadata.generation);
    let _ = writeln!(out, "Keys:");
    for k in &s.keys {
        let _ = writeln!(out, "  {:<24} {} bytes", k.key, k.bytes);
    }
    let _ = writeln!(out, "Read by:");
    let mut any = false;
    for c in clusters {
        for (field, r) in c.spec.secret_refs() {
            if r.secret == s.metadata.name {
                any = true;
                let _ = writeln!(out, "  cluster {} {field} (key {})", c.metadata.name, r.key);
            }
        }
    }
    if !any {
        let _ = writeln!(out, "  no cluster");
    }
    out
}

fn tasks_table(list: &[crate::types::TaskStatus], _wide: bool) -> Vec<Vec<String>> {
    let mut rows = vec![["NAME", "PERIOD", "LAST RUN", "LAST ERROR", "NEXT RUN"]
        .map(String::from)
        .to_vec()];
    for t in list {
        rows.push(vec![
            t.name.clone(),
            format!("{:?}", std::time::Duration::from_millis(t.period_millis)),
            match t.last_run_started {
                Some(_) => format!("{} ago ({} runs)", age(t.last_run_started), t.runs),
                None => "-".into(),
            },
            t.last_error.clone().unwrap_or_else(|| "-".into()),
            match (t.queue, t.next_run) {
                (Some(q), _) => format!(
                    "queue: {} ready, {} running, {} waiting (last waited {} ms)",
                    q.ready, q.processing, q.delayed, q.last_wait_millis
                ),
                (None, Some(next)) => {
                    let s = (next - drover_common::now()).whole_seconds().max(0);
                    format!("in {s}s")
                }
                (None, None) => "now".into(),
            },
        ]);
    }
    rows
}

fn coordinators_table(list: &[crate::types::CoordinatorEntry], _wide: bool) -> Vec<Vec<String>> {
    let mut rows = vec![["ID", "ROLE", "URL", "VERSION", "AGE"]
        .map(String::from)
        .to_vec()];
    for c in list {
        rows.push(vec![
            c.replica.id.clone(),
            if c.leader { "leader" } else { "follower" }.into(),
            c.replica.url.clone(),
            c.replica.version.clone(),
            age(Some(c.replica.started_at)),
        ]);
    }
    rows
}

fn print_table(rows: &[Vec<String>]) {
    let widths = column_widths(rows);
    for r in rows {
        println!("{}", table_line(r, &widths));
    }
}

/// The width of each column of `rows`, as printed.
fn column_widths(rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths = vec![0; rows.first().map_or(0, |r| r.len())];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(printable(c).chars().count());
        }
    }
    widths
}

/// One row, its cells padded to `widths` (the last one not).
fn table_line(row: &[String], widths: &[usize]) -> String {
    let line: Vec<String> = row
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = printable(c);
            if i + 1 == row.len() {
                c
            } else {
                format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0))
            }
        })
        .collect();
    line.join("   ").trim_end().to_owned()
}

/// `s` with every control character (terminal escape sequences, carriage
/// returns, newlines, tabs) shown escaped, e.g. `\u{1b}`: what machines
/// report reaches the operator's terminal only as visible text.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Like [`printable`], keeping the line breaks of a multi-line text this
/// program composed.
pub fn printable_text(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

/// "5s", "3m", "2h", "4d".
pub fn age(t: Option<OffsetDateTime>) -> String {
    let Some(t) = t else { return "-".into() };
    let s = (drover_common::now() - t).whole_seconds().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn clusters_table(list: &[Cluster], wide: bool) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "NAME",
        "PHASE",
        "VERSION",
        "CONTROL-PLANE",
        "WORKERS",
        "ENDPOINT",
        "AGE",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>()];
    if wide {
        rows[0].extend(["PROVIDER".into(), "GENERATION".into()]);
    }
    for c in list {
        let cp = c
            .status
            .pools
            .iter()
            .find(|p| p.name == drover_common::api::CONTROL_PLANE_POOL);
        let (wr, wd) = c
            .status
            .pools
            .iter()
            .filter(|p| p.name != drover_common::api::CONTROL_PLANE_POOL)
            .fold((0, 0), |(r, d), p| (r + p.running, d + p.desired));
        let wd = if c.status.pools.is_empty() {
            c.spec.worker_pools.iter().map(|p| p.replicas).sum()
        } else {
            wd
        };
        let phase = if c.metadata.deletion_timestamp.is_some() {
            "Deleting".to_string()
        } else {
            c.status.phase.to_string()
        };
        let mut row = vec![
            c.metadata.name.clone(),
            phase,
            c.spec.kubernetes_version.clone(),
            format!(
                "{}/{}",
                cp.map(|p| p.running).unwrap_or(0),
                c.spec.control_plane.replicas
            ),
            format!("{wr}/{wd}"),
            c.status
                .control_plane_endpoint
                .clone()
                .unwrap_or_else(|| "-".into()),
            age(c.metadata.creation_timestamp),
        ];
        if wide {
            row.push(c.spec.provider.name().into());
            row.push(c.metadata.generation.to_string());
        }
        rows.push(row);
    }
    rows
}

/// A one-word summary of a machine's health.
pub fn health_summary(m: &Machine) -> String {
    use drover_common::api::MachinePhase;
    // A deleted machine has no health; a silent or stopped one is not
    // healthy, whatever its last report said.
    if matches!(
        m.status.phase,
        MachinePhase::Deleting | MachinePhase::Deleted
    ) {
        return "-".into();
    }
    if let Some(c) = m
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::types::ALIVE_CONDITION && c.status == "False")
    {
        return c.reason.clone();
    }
    let Some(h) = &m.status.health else {
        return "-".into();
    };
    let mut bad = vec![];
    let mut unknown = true;
    if h.kubelet.state != ProbeState::Unknown {
        unknown = false;
    }
    if h.kubelet.state == ProbeState::Unhealthy {
        bad.push("kubelet");
    }
    if let Some(a) = &h.api_server {
        if a.state != ProbeState::Unknown {
            unknown = false;
        }
        if a.state == ProbeState::Unhealthy {
            bad.push("apiserver");
        }
    }
    if !bad.is_empty() {
        format!("Unhealthy({})", bad.join(","))
    } else if unknown {
        "Unknown".into()
    } else {
        "Healthy".into()
    }
}

fn machines_table(list: &[Machine], wide: bool) -> Vec<Vec<String>> {
    machines_rows(list, wide, &Default::default())
}

/// The machines table; `kubelets` holds each Node's kubelet version by
/// (cluster, Node name).
fn machines_rows(
    list: &[Machine],
    wide: bool,
    kubelets: &std::collections::HashMap<(String, String), String>,
) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "NAME",
        "CLUSTER",
        "POOL",
        "ROLE",
        "PHASE",
        "ADDRESS",
        "HEARTBEAT",
        "HEALTH",
        "AGE",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>()];
    if wide {
        rows[0].extend([
            "HOSTNAME".into(),
            "REG-POOL".into(),
            "GENERATION".into(),
            "AGENT".into(),
            "MADE-FOR".into(),
            "KUBEADM".into(),
            "KUBELET".into(),
            "UID".into(),
        ]);
    }
    for m in list {
        let a = m.spec.assignment.as_ref();
        let mut row = vec![
            m.metadata.name.clone(),
            a.map(|a| a.cluster.clone()).unwrap_or_else(|| "-".into()),
            a.map(|a| a.machine_pool.clone())
                .unwrap_or_else(|| "-".into()),
            a.map(|a| a.role.to_string()).unwrap_or_else(|| "-".into()),
            m.status.phase.to_string(),
            m.status
                .addresses
                .first()
                .cloned()
                .unwrap_or_else(|| "-".into()),
            age(m.status.last_heartbeat_time),
            health_summary(m),
            age(m.metadata.creation_timestamp),
        ];
        if wide {
            row.extend([
                m.status.hostname.clone(),
                m.spec.pool.clone(),
                a.map(|a| a.generation.to_string())
                    .unwrap_or_else(|| "-".into()),
                m.status.agent_version.clone(),
                a.and_then(|a| a.kubernetes_version.clone())
                    .unwrap_or_else(|| "-".into()),
                if m.status.kubeadm_version.is_empty() {
                    "-".into()
                } else {
                    m.status.kubeadm_version.clone()
                },
                a.and_then(|a| kubelets.get(&(a.cluster.clone(), m.status.hostname.clone())))
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
                m.metadata.uid.clone().unwrap_or_default(),
            ]);
        }
        rows.push(row);
    }
    rows
}

fn tokens_table(list: &[RegistrationToken], _wide: bool) -> Vec<Vec<String>> {
    let mut rows = vec![vec!["NAME", "POOL", "USES", "EXPIRES", "REVOKED", "LABELS"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()];
    for t in list {
        rows.push(vec![
            t.metadata.name.clone(),
            t.spec.pool.clone(),
            format!("{}/{}", t.status.uses, t.spec.max_uses),
            t.spec
                .expires_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            t.spec.revoked.to_string(),
            t.spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    rows
}

async fn describe(d: DescribeArgs) -> anyhow::Result<()> {
    let client = Client::connect(&d.conn)?;
    let text_view = matches!(d.output, Output::Table | Output::Wide);
    let (kind, object, text) = match d.kind {
        Single::Machine => {
            let m: Machine = client.get(&api_path(&["v1", "machines", &d.name])).await?;
            let text = text_view.then(|| describe_machine(&m));
            ("machine", serde_json::to_value(&m)?, text)
        }
        Single::Cluster => {
            let c: Cluster = client.get(&api_path(&["v1", "clusters", &d.name])).await?;
            let text = if text_view {
                let machines: Vec<Machine> = client.get("/v1/machines").await?;
                Some(describe_cluster(&c, &machines))
            } else {
                None
            };
            ("cluster", serde_json::to_value(&c)?, text)
        }
        Single::Secret => {
            let s: SecretInfo = client.get(&api_path(&["v1", "secrets", &d.name])).await?;
            let text = if text_view {
                let clusters: Vec<Cluster> = client.get("/v1/clusters").await?;
                Some(describe_secret(&s, &clusters))
            } else {
                None
            };
            ("secret", serde_json::to_value(&s)?, text)
        }
    };
    match (d.output, text) {
        (_, Some(text)) => print!("{}", printable_text(&text)),
        (Output::Json, _) => println!("{}", serde_json::to_string_pretty(&object)?),
        (Output::Yaml, _) => print!("{}", serde_saphyr::to_string(&object)?),
        _ => println!("{kind}/{}", object_name_of(&object)),
    }
    Ok(())
}

/// The text of `drover describe machine`.
pub fn describe_machine(m: &Machine) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let s = &m.status;
    let _ = writeln!(o, "Name:           {}", m.metadata.name);
    let _ = writeln!(
        o,
        "UID:            {}",
        m.metadata.uid.as_deref().unwrap_or("-")
    );
    let _ = writeln!(o, "Registered in:  pool {}", m.spec.pool);
    let labels: Vec<String> = m
        .metadata
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(o, "Labels:         {}", labels.join(","));
    match &m.spec.assignment {
        Some(a) => {
            let _ = writeln!(
                o,
                "Cluster:        {} (pool {}, generation {})",
                a.cluster, a.machine_pool, a.generation
            );
            let _ = writeln!(o, "Role:           {}", a.role);
        }
        None => {
            let _ = writeln!(o, "Cluster:        - (unassigned)");
        }
    }
    let _ = writeln!(o, "Phase:          {}", s.phase);
    let _ = writeln!(o, "Hostname:       {}", printable(&s.hostname));
    let _ = writeln!(o, "Addresses:      {}", s.addresses.join(", "));
    let _ = writeln!(o, "API port:       {}", s.api_server_port);
    let _ = writeln!(o, "Agent version:  {}", printable(&s.agent_version));
    if !s.kubeadm_version.is_empty() {
        let _ = writeln!(o, "kubeadm:        {}", printable(&s.kubeadm_version));
    }
    if let Some(v) = m
        .spec
        .assignment
        .as_ref()
        .and_then(|a| a.kubernetes_version.as_deref())
    {
        let _ = writeln!(o, "Made for:       {}", printable(v));
    }
    let _ = writeln!(o, "Last heartbeat: {} ago", age(s.last_heartbeat_time));
    if let Some(why) = &s.heartbeat_fallback {
        let _ = writeln!(o, "Heartbeats:     over HTTPS: {}", printable(why));
    }
    if let Some(c) = &s.certificates {
        let _ = writeln!(
            o,
            "kubeadm certs:  first expires {} ({})",
            rfc3339(c.expires_at),
            printable(&c.certificate)
        );
    }
    if let Some(t) = s.certificate_not_after {
        let _ = writeln!(o, "Certificate:    valid until {t}");
    }
    if let Some(t) = s.identity_revoked_at {
        let _ = writeln!(
            o,
            "Identity:       revoked at {t}; its certificates are refused"
        );
    }
    let _ = writeln!(o, "Health:         {}", health_summary(m));
    if let Some(h) = &s.health {
        let _ = writeln!(
            o,
            "  kubelet:      {:?} {}",
            h.kubelet.state,
            printable(&h.kubelet.message)
        );
        if let Some(a) = &h.api_server {
            let _ = writeln!(o, "  apiserver:    {:?} {}", a.state, printable(&a.message));
        }
        let _ = writeln!(
            o,
            "  disk free:    {} MiB",
            h.disk_free_bytes / (1024 * 1024)
        );
    }
    if let Some(b) = &s.bootstrap {
        let _ = writeln!(o, "Bootstrap:      step {}", printable(&b.step));
        if let Some(f) = &b.failure {
            let _ = writeln!(o, "  failed at:    {}", f.at);
            let _ = writeln!(o, "  command:      {}", printable(&f.command));
            let _ = writeln!(
                o,
                "  exit code:    {}",
                f.exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "none (did not run or was killed)".into())
            );
            let _ = writeln!(o, "  output (last {} lines):", f.output_tail.len());
            for l in &f.output_tail {
                let _ = writeln!(o, "    | {}", printable(l));
            }
        }
    }
    if let Some(p) = &s.provider_id {
        let _ = writeln!(
            o,
            "Provider ID:    {} ({})",
            p,
            m.spec.provider.as_deref().unwrap_or("-")
        );
    }
    if !s.conditions.is_empty() {
        let _ = writeln!(o, "Conditions:");
        for c in &s.conditions {
            let _ = writeln!(
                o,
                "  {} = {} since {} ({}) {}",
                c.type_,
                c.status,
                c.last_transition_time
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                c.reason,
                printable(&c.message)
            );
        }
    }
    if !s.events.is_empty() {
        let _ = writeln!(o, "Events:");
        for e in &s.events {
            let _ = writeln!(
                o,
                "  {:>6} ago  {:<16} {}",
                age(Some(e.time)),
                e.reason,
                printable(&e.message)
            );
        }
    }
    o
}

/// A time as RFC 3339, `-` when it cannot be written so.
fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "-".into())
}

/// The control plane of `c` whose kubeadm certificate expires first, and
/// that certificate.
fn earliest_certificates<'m>(
    c: &Cluster,
    machines: &'m [Machine],
) -> Option<(&'m Machine, &'m drover_common::api::CertificateExpiry)> {
    let uid = c.metadata.uid.as_deref();
    machines
        .iter()
        .filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| Some(a.cluster_uid.as_str()) == uid)
        })
        .filter_map(|m| Some((m, m.status.certificates.as_ref()?)))
        .min_by_key(|(_, c)| c.expires_at)
}

fn describe_cluster(c: &Cluster, machines: &[Machine]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "Name:           {}", c.metadata.name);
    let _ = writeln!(
        o,
        "UID:            {}",
        c.metadata.uid.as_deref().unwrap_or("-")
    );
    let _ = writeln!(o, "Version:        {}", c.spec.kubernetes_version);
    let _ = writeln!(o, "Provider:       {}", c.spec.provider.name());
    let _ = writeln!(o, "Phase:          {}", c.status.phase);
    let _ = writeln!(
        o,
        "Endpoint:       {}{}",
        c.status.control_plane_endpoint.as_deref().unwrap_or("-"),
        match c.status.endpoint_ready {
            Some(true) => " (/readyz ok)",
            Some(false) => " (/readyz does not answer)",
            None => "",
        }
    );
    if let Some(lb) = &c.status.load_balancer {
        let backends = if lb.backends.is_empty() {
            "none yet".to_owned()
        } else {
            lb.backends.join(", ")
        };
        let _ = writeln!(o, "Load balancer:  {} -> {backends}", lb.id);
    }
    if c.status.rollout.is_some() {
        for (i, line) in rollout_lines(c).iter().enumerate() {
            let head = if i == 0 { "Rollout:" } else { "" };
            let _ = writeln!(o, "{head:<16}{line}");
        }
    }
    let _ = writeln!(
        o,
        "Init machine:   {}",
        c.status.init_machine.as_deref().unwrap_or("-")
    );
    if let Some(v) = &c.status.kubeadm_config_version {
        let _ = writeln!(o, "kubeadm-config: kubernetesVersion {}", printable(v));
    }
    if let Some(u) = &c.status.version_update {
        let _ = writeln!(
            o,
            "Config update:  to {} through {}{}",
            printable(&u.version),
            printable(&u.via),
            if u.error.is_empty() {
                String::new()
            } else {
                format!(" (failed, retrying: {})", printable(&u.error))
            }
        );
    }
    if let Some(u) = &c.status.essential_addons {
        let _ = match u.done_at {
            Some(at) => writeln!(
                o,
                "kube-proxy/DNS: at {}'s images since {}",
                printable(&u.version),
                rfc3339(at)
            ),
            None => writeln!(
                o,
                "kube-proxy/DNS: upgrading to {}'s images through {}{}",
                printable(&u.version),
                printable(&u.via),
                if u.error.is_empty() {
                    String::new()
                } else {
                    format!(" (failed, retrying: {})", printable(&u.error))
                }
            ),
        };
    }
    if let Some(r) = &c.status.certificate_renewal {
        let _ = writeln!(
            o,
            "Cert renewal:   {} ({}){}",
            printable(&r.machine),
            printable(&r.reason),
            if r.error.is_empty() {
                String::new()
            } else {
                format!(" failed, retrying: {}", printable(&r.error))
            }
        );
    }
    if let Some((m, c)) = earliest_certificates(c, machines) {
        let _ = writeln!(
            o,
            "Certificates:   first expires {} ({} of {})",
            rfc3339(c.expires_at),
            printable(&c.certificate),
            m.metadata.name
        );
    }
    let _ = writeln!(o, "Pools:");
    for p in &c.status.pools {
        let _ = writeln!(
            o,
            "├─ {}: {}/{} running, {} assigned",
            p.name, p.running, p.desired, p.assigned
        );
        let uid = c.metadata.uid.as_deref();
        for m in machines.iter().filter(|m| {
            m.spec
                .assignment
                .as_ref()
                .is_some_and(|a| Some(a.cluster_uid.as_str()) == uid && a.machine_pool == p.name)
        }) {
            let _ = writeln!(
                o,
                "│   └─ {} {} {} {}",
                m.metadata.name,
                m.spec
                    .assignment
                    .as_ref()
                    .map(|a| a.role.to_string())
                    .unwrap_or_default(),
                m.status.phase,
                health_summary(m)
            );
        }
    }
    if !c.status.etcd_members.is_empty() {
        let _ = writeln!(
            o,
            "etcd members:   (reported by {} at {})",
            printable(c.status.etcd_reported_by.as_deref().unwrap_or("-")),
            c.status
                .etcd_reported_at
                .map_or_else(|| "-".into(), rfc3339)
        );
        for m in &c.status.etcd_members {
            let _ = writeln!(
                o,
                "  {:<16} {:<20} {:<9} {:<9} {}",
                printable(&m.id),
                printable(if m.name.is_empty() {
                    "(unstarted)"
                } else {
                    &m.name
                }),
                match (m.started, m.is_learner) {
                    (_, true) => "learner",
                    (true, false) => "started",
                    (false, false) => "unstarted",
                },
                if m.healthy { "healthy" } else { "unhealthy" },
                printable(&m.peer_urls.join(","))
            );
        }
    }
    if !c.status.nodes.is_empty() {
        let _ = writeln!(o, "Nodes:");
        for n in &c.status.nodes {
            let _ = writeln!(
                o,
                "  {:<24} Ready={}{}",
                printable(&n.name),
                printable(&n.ready),
                if n.unschedulable { " (cordoned)" } else { "" }
            );
        }
    }
    if let Some(d) = &c.status.drain {
        let state = match &d.result {
            None => "under way".to_owned(),
            Some(r) if r.ok => format!("done: {}", r.message),
            Some(r) => format!("refused, retrying: {}", r.message),
        };
        let _ = writeln!(
            o,
            "Drain:          Node {} of machine {} through {}, since {}: {}",
            printable(&d.node),
            printable(&d.machine),
            printable(&d.via),
            d.started_at,
            printable(&state)
        );
    }
    if let Some(r) = &c.status.node_removal {
        let _ = writeln!(
            o,
            "Node removal:   {} through {} (its machine left)",
            printable(&r.node),
            printable(&r.via)
        );
    }
    if let Some(r) = &c.status.etcd_removal {
        let _ = writeln!(
            o,
            "etcd removal:   member {} ({}) through {}: {}",
            printable(&r.id),
            printable(&r.name),
            printable(&r.via),
            printable(&r.reason)
        );
    }
    if !c.status.addons.is_empty() {
        let _ = writeln!(o, "Addons:");
        for (i, a) in c.status.addons.iter().enumerate() {
            let mode = c
                .spec
                .addons
                .iter()
                .find(|s| s.name == a.name)
                .map_or("?".to_owned(), |s| format!("{:?}", s.mode));
            let hash = &a.hash[..a.hash.len().min(12)];
            let state = match a.phase {
                drover_common::api::AddonPhase::Applied => format!(
                    "Applied sha256:{hash} at {}",
                    a.applied_at.map(|t| t.to_string()).unwrap_or_default()
                ),
                drover_common::api::AddonPhase::Failed => format!(
                    "Failed ({} attempts) sha256:{hash}: {}",
                    a.failures,
                    printable(&a.message)
                ),
                drover_common::api::AddonPhase::Pending => "Pending".to_owned(),
            };
            let _ = writeln!(o, "  {}. {} ({mode}): {state}", i + 1, printable(&a.name));
        }
        if let Some(r) = &c.status.addon_apply {
            let _ = writeln!(
                o,
                "  applying {} through {} since {}",
                printable(&r.addon),
                printable(&r.via),
                r.requested_at
            );
        }
    }
    if !c.status.conditions.is_empty() {
        let _ = writeln!(o, "Conditions:");
        for cd in &c.status.conditions {
            let _ = writeln!(
                o,
                "  {} = {} ({}) {}",
                cd.type_, cd.status, cd.reason, cd.message
            );
        }
    }
    o
}

async fn delete(d: DeleteArgs) -> anyhow::Result<()> {
    let client = Client::connect(&d.conn)?;
    match d.kind {
        Single::Cluster => {
            let c: Cluster = client
                .delete(&api_path(&["v1", "clusters", &d.name]))
                .await?;
            let what = match c.spec.provider {
                ProviderSpec::Pool(_) => "its machines are reset and return to their pools",
                ProviderSpec::Docker(_) => "its containers and its Docker network are removed",
                ProviderSpec::Aws(_) => "its EC2 instances are terminated",
            };
            println!("cluster/{} deletion requested; {what}", d.name);
            if d.wait {
                let deadline = std::time::Instant::now() + d.timeout;
                let tty = std::io::stderr().is_terminal();
                loop {
                    match client
                        .get::<Cluster>(&api_path(&["v1", "clusters", &d.name]))
                        .await
                    {
                        Err(e) if e.to_string().contains("does not exist") => break,
                        Err(e) => return Err(e),
                        Ok(c) => {
                            let assigned: u32 = c.status.pools.iter().map(|p| p.assigned).sum();
                            if tty {
                                eprint!(
                                    "\rwaiting for {} machine(s) to be released...   ",
                                    assigned
                                );
                            }
                        }
                    }
                    if std::time::Instant::now() > deadline {
                        bail!("cluster {} still exists after {:?}", d.name, d.timeout);
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                if tty {
                    eprintln!();
                }
                println!("cluster/{} deleted", d.name);
            }
            Ok(())
        }
        Single::Machine => delete_machine(&client, &d).await,
        Single::Secret => {
            let s: SecretInfo = client
                .delete(&api_path(&["v1", "secrets", &d.name]))
                .await?;
            println!(
                "secret/{} deleted (it held {} key(s))",
                s.metadata.name,
                s.keys.len()
            );
            Ok(())
        }
    }
}

/// `drover delete machine NAME [--wait]`: the machine leaves its cluster
/// through the safe path (replaced or released, control planes one at a
/// time); with `--wait`, until it is gone.
async fn delete_machine(client: &Client, d: &DeleteArgs) -> anyhow::Result<()> {
    let path = api_path(&["v1", "machines", &d.name]);
    let m: Machine = client.delete(&path).await?;
    let Some(a) = &m.spec.assignment else {
        println!("machine/{} deregistered (it served no cluster)", d.name);
        return Ok(());
    };
    let how = if m.spec.provider.is_some() {
        "a replacement is created and then the machine is deleted"
    } else {
        "it is reset and a free matching machine is claimed in its place"
    };
    println!(
        "machine/{} deletion requested; it leaves cluster {} safely: {how}",
        d.name, a.cluster
    );
    if !d.wait {
        return Ok(());
    }
    let deadline = std::time::Instant::now() + d.timeout;
    let tty = std::io::stderr().is_terminal();
    loop {
        match client.get::<Machine>(&path).await {
            Err(e) if e.to_string().contains("does not exist") => break,
            Err(e) => return Err(e),
            Ok(m) if m.status.phase == MachinePhase::Deleted => break,
            Ok(m) => {
                if tty {
                    eprint!("\rmachine {} is {}...   ", d.name, m.status.phase);
                }
            }
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "machine {} has not left its cluster after {:?}; `drover describe machine {}` and `drover describe cluster {}` say what it waits for",
                d.name,
                d.timeout,
                d.name,
                a.cluster
            );
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    if tty {
        eprintln!();
    }
    println!("machine/{} deleted", d.name);
    Ok(())
}

async fn token(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create {
            pool,
            ttl,
            uses,
            labels,
            output,
            conn,
        } => {
            // Whatever can fail here fails before the token exists.
            if let Some(path) = &output {
                check_writable(path)?;
            }
            let client = Client::connect(&conn)?;
            let created: CreatedRegistrationToken = client
                .post(
                    "/v1/registrationtokens",
                    &CreateRegistrationToken {
                        pool,
                        labels,
                        ttl_seconds: ttl.as_secs(),
                        max_uses: uses,
                    },
                )
                .await?;
            let doc = created.bootstrap.to_yaml();
            let name = &created.token.metadata.name;
            match output {
                Some(path) => {
                    if let Err(e) = write_private(&path, &doc) {
                        // A token nobody holds is revoked again, not left live.
                        let revoked: anyhow::Result<RegistrationToken> = client
                            .delete(&api_path(&["v1", "registrationtokens", name]))
                            .await;
                        return Err(match revoked {
                            Ok(_) => e.context(format!(
                                "token {name} was created but its bootstrap document could not be written, so it was revoked again; nothing can register with it"
                            )),
                            Err(r) => e.context(format!(
                                "token {name} was created but its bootstrap document could not be written, and revoking it failed too ({r:#}); revoke it with `drover token revoke {name}`"
                            )),
                        });
                    }
                    eprintln!(
                        "token {name} created; bootstrap document written to {}",
                        path.display()
                    );
                }
                None => {
                    print!("{doc}");
                    eprintln!("# token {name} created");
                }
            }
            Ok(())
        }
        TokenCommand::List { conn } => {
            let client = Client::connect(&conn)?;
            let list: Vec<RegistrationToken> = client.get("/v1/registrationtokens").await?;
            print_table(&tokens_table(&list, false));
            Ok(())
        }
        TokenCommand::Revoke { name, conn } => {
            let client = Client::connect(&conn)?;
            let _: RegistrationToken = client
                .delete(&api_path(&["v1", "registrationtokens", &name]))
                .await?;
            println!("token {name} revoked");
            Ok(())
        }
    }
}

/// Why `path` cannot take a private file, found without writing it: it is a
/// directory, or its directory cannot be made or written (a file is
/// created there and removed again).
fn check_writable(path: &std::path::Path) -> anyhow::Result<()> {
    let cannot = |why: String| anyhow::anyhow!("cannot write {}: {why}", path.display());
    if path.is_dir() {
        return Err(cannot(
            "it is a directory; give a file name (-o DIR/bootstrap.yaml)".into(),
        ));
    }
    let dir = drover_common::fsutil::parent_dir(path).map_err(|e| cannot(e.to_string()))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| cannot(format!("cannot make its directory {}: {e}", dir.display())))?;
    let probe = dir.join(format!(".drover-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .map_err(|e| cannot(format!("cannot create a file in {}: {e}", dir.display())))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    drover_common::fsutil::write_atomic(path, text.as_bytes(), 0o600)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[derive(Debug, clap::Args)]
pub struct AdminTokenArgs {
    #[command(subcommand)]
    pub command: AdminTokenCommand,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RoleArg {
    Admin,
    Viewer,
}

#[derive(Debug, clap::Subcommand)]
pub enum AdminTokenCommand {
    /// Create an admin token; its secret is printed once.
    Create {
        #[arg(long, value_enum)]
        role: RoleArg,
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// List admin tokens (ids and roles, never secrets).
    List {
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Revoke an admin token by id.
    Revoke {
        #[arg(value_parser = object_name)]
        id: String,
        #[command(flatten)]
        conn: ConnectArgs,
    },
}

/// `drover admin-token ...`.
pub async fn admin_token(cmd: AdminTokenCommand) -> anyhow::Result<()> {
    use crate::types::{AdminTokenInfo, CreatedAdminToken};
    match cmd {
        AdminTokenCommand::Create { role, conn } => {
            let client = Client::connect(&conn)?;
            let role = match role {
                RoleArg::Admin => "admin",
                RoleArg::Viewer => "viewer",
            };
            let created: CreatedAdminToken = client
                .post("/v1/admintokens", &serde_json::json!({ "role": role }))
                .await?;
            println!("{}", created.token);
            eprintln!(
                "# admin token {} ({role}) created; the secret above is shown only now",
                created.id
            );
        }
        AdminTokenCommand::List { conn } => {
            let client = Client::connect(&conn)?;
            let list: Vec<AdminTokenInfo> = client.get("/v1/admintokens").await?;
            let mut rows = vec![vec!["ID".to_string(), "ROLE".into(), "CREATED".into()]];
            for t in list {
                rows.push(vec![
                    t.id,
                    format!("{:?}", t.role).to_lowercase(),
                    age(Some(t.created_at)),
                ]);
            }
            print_table(&rows);
        }
        AdminTokenCommand::Revoke { id, conn } => {
            let client = Client::connect(&conn)?;
            client
                .delete_empty(&api_path(&["v1", "admintokens", &id]))
                .await?;
            println!("admin token {id} revoked");
        }
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Show the ids of the keys encrypting secrets at rest.
    List {
        #[command(flatten)]
        conn: ConnectArgs,
    },
    /// Encrypt every secret with a new key, without downtime.
    Rotate {
        #[command(flatten)]
        conn: ConnectArgs,
    },
}

/// `drover keys ...`.
pub async fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    use crate::types::KeysInfo;
    match cmd {
        KeysCommand::List { conn } => {
            let info: KeysInfo = Client::connect(&conn)?.get("/v1/keys").await?;
            println!(
                "primary: {}",
                info.key_ids.first().cloned().unwrap_or_default()
            );
            for k in info.key_ids.iter().skip(1) {
                println!("older:   {k}");
            }
        }
        KeysCommand::Rotate { conn } => {
            let info: KeysInfo = Client::connect(&conn)?
                .post("/v1/keys/rotate", &serde_json::json!({}))
                .await?;
            println!(
                "rotated: secrets are now encrypted with key {} ({} records re-encrypted)",
                info.key_ids.first().cloned().unwrap_or_default(),
                info.resealed
            );
        }
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// How many of the latest entries to show.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// `drover audit`: who changed what, and when.
pub async fn audit(a: AuditArgs) -> anyhow::Result<()> {
    let list: Vec<crate::types::AuditEntry> = Client::connect(&a.conn)?
        .get(&format!("/v1/audit?limit={}", a.limit))
        .await?;
    match a.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&list)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&list)?),
        Output::Name => bail!("audit entries have no names; use -o table, json or yaml"),
        Output::Table | Output::Wide => {
            let mut rows = vec![["TIME", "ACTOR", "SOURCE", "METHOD", "PATH", "STATUS"]
                .map(String::from)
                .to_vec()];
            for e in list {
                rows.push(vec![
                    e.time
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                    e.actor,
                    e.source,
                    e.method,
                    match e.suppressed {
                        // A summary: refusals not recorded one by one.
                        Some(n) => format!("{} refused, the last {}", n, e.path),
                        None => e.path,
                    },
                    match e.stage {
                        // Written before the change was made; its answer follows.
                        Some(crate::types::AuditStage::RequestReceived) => "received".into(),
                        None => e.status.to_string(),
                    },
                ]);
            }
            print_table(&rows);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_takes_files_directories_and_standard_input_more_than_once() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Command,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "drover",
            "apply",
            "-f",
            "a.yaml",
            "-f",
            "-",
            "--filename",
            "dir/",
        ])
        .unwrap();
        let Command::Apply(a) = cli.command else {
            panic!("not apply");
        };
        assert_eq!(
            a.files,
            [PathBuf::from("a.yaml"), "-".into(), "dir/".into()]
        );
        assert!(<Cli as clap::Parser>::try_parse_from(["drover", "apply"]).is_err());
    }

    #[test]
    fn a_token_output_path_is_checked_before_the_token_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/boot.yaml");
        check_writable(&path).unwrap();
        assert!(!path.exists(), "the check writes nothing at the path");
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            0
        );
        // A bare file name is written in the current directory.
        check_writable(std::path::Path::new("boot-check.yaml")).unwrap();
        let e = check_writable(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory; give a file name"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = check_writable(&file.join("boot.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot make its directory"), "{e}");
    }
}
