//! `drover token create|list|revoke`: registration tokens for
//! self-registering machines, and the bootstrap document of a new one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use drover_common::api::{CreateRegistrationToken, CreatedRegistrationToken, RegistrationToken};

use crate::cli::client::{Client, ConnectArgs};
use crate::cli::render::print_table;
use crate::cli::render::tables::tokens_table;
use crate::cli::{api_path, object_name};

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

pub(super) async fn token(cmd: TokenCommand) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
