//! The commands that look after the coordinator itself: `drover
//! admin-token` (admin and viewer tokens), `drover keys` (the keys that
//! encrypt secrets at rest) and `drover audit` (the audit log).

use anyhow::bail;

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::{age, print_table};
use crate::cli::{api_path, object_name, Output};

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
