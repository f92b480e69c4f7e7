//! `drover get`: lists of clusters, machines, registration tokens,
//! coordinators, background tasks and secrets, as a table, JSON, YAML or
//! names; with `--watch`, each object again whenever it changes.

use drover_common::api::{Cluster, Machine, RegistrationToken, SecretInfo};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::tables::{
    clusters_table, coordinators_table, machines_rows, machines_table, secrets_table,
    snapshots_table, tasks_table, tokens_table,
};
use crate::cli::render::{column_widths, object_name_of, print_table, printable, table_line};
use crate::cli::{api_path, object_name, Output};

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
    /// Clusters' etcd snapshots; NAME, when given, is the cluster's.
    #[value(alias = "snapshot")]
    Snapshots,
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
    /// Read lists this many objects a request (as kubectl does); 0 reads
    /// each list in one answer.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub chunk_size: u64,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(super) async fn get(g: GetArgs) -> anyhow::Result<()> {
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
                .map(|o| serde_json::to_value(o).map(without_managed_fields))
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

/// `o` without `metadata.managedFields`, which `-o yaml` and `-o json`
/// leave out as kubectl does (`kubectl get --show-managed-fields` shows
/// them).
pub(super) fn without_managed_fields(mut o: serde_json::Value) -> serde_json::Value {
    if let Some(meta) = o.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
    }
    o
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

/// Objects a list request asks for.
fn chunk(g: &GetArgs) -> usize {
    g.chunk_size as usize
}

async fn fetch(client: &Client, g: &GetArgs) -> anyhow::Result<Listing> {
    match g.resource {
        Resource::Clusters => {
            let list: Vec<Cluster> = match &g.name {
                Some(n) => vec![client.get(&api_path(&["v1", "clusters", n])).await?],
                None => client.list("/v1/clusters", chunk(g)).await?,
            };
            Listing::new("cluster", &list, g.output, clusters_table)
        }
        Resource::Machines => {
            let list: Vec<Machine> = match &g.name {
                Some(n) => vec![client.get(&api_path(&["v1", "machines", n])).await?],
                None => client
                    .list::<Machine>("/v1/machines", chunk(g))
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
                let clusters: Vec<Cluster> = client.list("/v1/clusters", chunk(g)).await?;
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
        Resource::Snapshots => {
            let list: Vec<drover_common::api::Snapshot> = match &g.name {
                Some(cluster) => {
                    client
                        .get(&format!("/v1/snapshots?cluster={cluster}"))
                        .await?
                }
                None => client.list("/v1/snapshots", chunk(g)).await?,
            };
            Listing::new("snapshot", &list, g.output, snapshots_table)
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
