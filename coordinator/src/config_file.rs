//! `drover serve --config FILE`: a YAML file whose keys are the serve
//! flags' names in camelCase (`listen`, `dataDir`, `heartbeatTimeout`).
//!
//! The file is turned into flags before the command line is parsed, so one
//! set of value parsers checks both, and every value of the file is checked
//! first with its file, line and key named. A flag given on the command line
//! wins over the file, and so does an environment variable the flag reads
//! (`DROVER_DATA_DIR`, `DROVER_STORE`): flags, then the environment, then
//! the file, then the defaults. Secrets never come from the file: the
//! encryption key comes from its key file or `DROVER_ENCRYPTION_KEY`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::Command;

/// The flags of `drover serve` that are about the file itself, never keys
/// in it.
pub const NOT_IN_FILE: &[&str] = &["config", "print-config", "help"];

/// Environment variables whose values are secrets: `--print-config` says
/// they are set, never what they hold.
pub const SECRET_ENV: &[&str] = &["DROVER_ENCRYPTION_KEY"];

/// Why the config file was refused. Each names the file, and where it can,
/// the line and key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not YAML: {detail}")]
    Syntax { path: PathBuf, detail: String },
    #[error(
        "config file {path} must be a mapping of keys to values, such as `listen: 0.0.0.0:7443`"
    )]
    NotMapping { path: PathBuf },
    #[error(
        "{at}: unknown key `{key}`; the keys are the flags of `drover serve` in camelCase: {known}"
    )]
    UnknownKey {
        at: String,
        key: String,
        known: String,
    },
    #[error("{at}: key `{key}` cannot be set in the file; {why}")]
    NotAllowed {
        at: String,
        key: String,
        why: &'static str,
    },
    #[error("{at}: key `{key}`: {detail}")]
    BadValue {
        at: String,
        key: String,
        detail: String,
    },
}

/// One key of the file, where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub key: String,
    /// 1-based; 0 when the key was not found at the start of a line (a
    /// flow mapping).
    pub line: usize,
    pub values: Vec<String>,
}

/// A read config file.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub entries: Vec<FileEntry>,
}

impl ConfigFile {
    /// Reads and parses `path`: a YAML mapping of scalars and lists of
    /// scalars.
    pub fn read(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigFileError> {
        let value: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigFileError::Syntax {
                path: path.to_owned(),
                detail: e.to_string(),
            })?
        };
        let serde_json::Value::Object(map) = value else {
            return Err(ConfigFileError::NotMapping {
                path: path.to_owned(),
            });
        };
        let mut entries = Vec::new();
        for (key, value) in map {
            let line = key_line(text, &key);
            let at = location(path, line);
            let scalar = |v: &serde_json::Value| match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                serde_json::Value::Bool(b) => Some(b.to_string()),
                _ => None,
            };
            let values = match &value {
                serde_json::Value::Array(items) => items.iter().map(scalar).collect(),
                serde_json::Value::Null => Some(vec![]),
                v => scalar(v).map(|s| vec![s]),
            };
            let values = values.ok_or_else(|| ConfigFileError::BadValue {
                at,
                key: key.clone(),
                detail: "must be a value or a list of values, not a mapping".into(),
            })?;
            entries.push(FileEntry { key, line, values });
        }
        entries.sort_by_key(|e| e.line);
        Ok(Self {
            path: path.to_owned(),
            entries,
        })
    }

    /// The flags the file adds to `given` (the command line after `serve`)
    /// for command `cmd`: each key whose flag is neither on the command line
    /// nor set through its environment variable (read with `env`). Every
    /// value is checked with its flag's parser first.
    pub fn flags(
        &self,
        cmd: &Command,
        given: &[OsString],
        env: &dyn Fn(&OsStr) -> Option<OsString>,
    ) -> Result<Vec<OsString>, ConfigFileError> {
        let mut out = Vec::new();
        for entry in &self.entries {
            let at = location(&self.path, entry.line);
            let long = kebab(&entry.key);
            if NOT_IN_FILE.contains(&long.as_str()) {
                return Err(ConfigFileError::NotAllowed {
                    at,
                    key: entry.key.clone(),
                    why: "it is a flag about the file itself",
                });
            }
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(long.as_str()) && !a.is_hide_set())
                .ok_or_else(|| ConfigFileError::UnknownKey {
                    at: at.clone(),
                    key: entry.key.clone(),
                    known: known_keys(cmd).join(", "),
                })?;
            let repeatable = matches!(arg.get_action(), clap::ArgAction::Append);
            if entry.values.len() > 1 && !repeatable {
                return Err(ConfigFileError::BadValue {
                    at,
                    key: entry.key.clone(),
                    detail: "takes one value, not a list".into(),
                });
            }
            let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
            let mut flags = Vec::new();
            for value in &entry.values {
                let flag = if switch {
                    match value.as_str() {
                        "true" => Some(format!("--{long}")),
                        "false" => None,
                        _ => {
                            return Err(ConfigFileError::BadValue {
                                at,
                                key: entry.key.clone(),
                                detail: format!("must be true or false, not {value:?}"),
                            })
                        }
                    }
                } else {
                    Some(format!("--{long}={value}"))
                };
                // The flag's own parser checks the value: a command of
                // this one argument parses it.
                let probe = Command::new("drover-serve")
                    .no_binary_name(true)
                    .arg(arg.clone().required(false));
                probe
                    .try_get_matches_from(flag.iter())
                    .map_err(|e| ConfigFileError::BadValue {
                        at: at.clone(),
                        key: entry.key.clone(),
                        detail: clap_message(&e),
                    })?;
                flags.extend(flag.map(OsString::from));
            }
            let on_command_line = given.iter().any(|g| {
                g.to_str().is_some_and(|g| {
                    g == format!("--{long}") || g.starts_with(&format!("--{long}="))
                })
            });
            let from_env = arg.get_env().is_some_and(|name| env(name).is_some());
            if on_command_line || from_env {
                continue;
            }
            out.extend(flags);
        }
        Ok(out)
    }
}

/// A command line with its config file's flags added.
#[derive(Debug, Clone)]
pub struct Expanded {
    /// What clap parses.
    pub argv: Vec<OsString>,
    /// The file read, if `--config` named one.
    pub file: Option<ConfigFile>,
    /// The arguments given after `serve`, before the file's were added.
    pub given: Vec<OsString>,
}

/// Inserts the flags of `--config FILE` into the arguments of `drover
/// serve`. `argv` is the whole command line; one without `serve` or
/// without `--config` is returned as is.
pub fn expand(
    argv: Vec<OsString>,
    cmd: &Command,
    env: &dyn Fn(&OsStr) -> Option<OsString>,
) -> Result<Expanded, ConfigFileError> {
    let unchanged = |argv| Expanded {
        argv,
        file: None,
        given: vec![],
    };
    let Some(serve_at) = subcommand_index(&argv, "serve") else {
        return Ok(unchanged(argv));
    };
    let Some(serve) = cmd.find_subcommand("serve") else {
        return Ok(unchanged(argv));
    };
    let rest = &argv[serve_at + 1..];
    let mut path = None;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--") => break,
            Some("--config") => path = it.next().map(PathBuf::from),
            Some(s) if s.starts_with("--config=") => {
                path = Some(PathBuf::from(&s["--config=".len()..]))
            }
            _ => {}
        }
    }
    let given = rest.to_vec();
    let Some(path) = path else {
        return Ok(Expanded {
            argv,
            file: None,
            given,
        });
    };
    let file = ConfigFile::read(&path)?;
    let added = file.flags(serve, rest, env)?;
    let mut out = argv[..=serve_at].to_vec();
    out.extend(added);
    out.extend(rest.iter().cloned());
    Ok(Expanded {
        argv: out,
        file: Some(file),
        given,
    })
}

/// Where a value of the effective configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Environment,
    File,
    Default,
}

/// The effective configuration of `cmd` as `--print-config` shows it:
/// `key: value  # source` lines in the flags' order, secrets redacted.
pub fn render(
    cmd: &Command,
    matches: &clap::ArgMatches,
    expanded: &Expanded,
    env: &dyn Fn(&OsStr) -> Option<OsString>,
) -> String {
    use std::fmt::Write;
    let file = expanded.file.as_ref();
    let mut out = String::new();
    if let Some(f) = file {
        let _ = writeln!(
            out,
            "# drover serve: effective configuration (file {})",
            f.path.display()
        );
    } else {
        let _ = writeln!(
            out,
            "# drover serve: effective configuration (no config file)"
        );
    }
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if NOT_IN_FILE.contains(&long) || arg.is_hide_set() || long == "version" {
            continue;
        }
        let id = arg.get_id().as_str();
        let key = camel(long);
        let values: Vec<String> = matches
            .get_raw(id)
            .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let source = match matches.value_source(id) {
            Some(clap::parser::ValueSource::EnvVariable) => Source::Environment,
            Some(clap::parser::ValueSource::DefaultValue) | None => Source::Default,
            Some(_) if file.is_some_and(|f| f.entries.iter().any(|e| e.key == key)) => {
                let flagged = expanded.given.iter().any(|a| {
                    a.to_str().is_some_and(|a| {
                        a == format!("--{long}") || a.starts_with(&format!("--{long}="))
                    })
                });
                if flagged {
                    Source::Flag
                } else {
                    Source::File
                }
            }
            Some(_) => Source::Flag,
        };
        let secret = arg
            .get_env()
            .is_some_and(|e| SECRET_ENV.iter().any(|s| OsStr::new(s) == e));
        let shown = if secret {
            "<redacted>".to_owned()
        } else if values.is_empty() {
            "null".to_owned()
        } else if values.len() == 1 && !matches!(arg.get_action(), clap::ArgAction::Append) {
            yaml_scalar(&values[0])
        } else {
            format!(
                "[{}]",
                values
                    .iter()
                    .map(|v| yaml_scalar(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let from = match source {
            Source::Flag => "flag".to_owned(),
            Source::Environment => format!(
                "environment {}",
                arg.get_env()
                    .map(|e| e.to_string_lossy())
                    .unwrap_or_default()
            ),
            Source::File => "file".to_owned(),
            Source::Default => "default".to_owned(),
        };
        let _ = writeln!(out, "{key}: {shown}  # {from}");
    }
    for name in SECRET_ENV {
        if env(OsStr::new(name)).is_some() {
            let _ = writeln!(out, "# {name} is set (redacted)");
        }
    }
    out
}

/// Every key the file may hold, for `cmd`.
pub fn known_keys(cmd: &Command) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !NOT_IN_FILE.contains(l) && *l != "version")
        .map(camel)
        .collect()
}

/// `heartbeat-timeout` as `heartbeatTimeout`.
pub fn camel(long: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in long.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `heartbeatTimeout` as `heartbeat-timeout`.
pub fn kebab(key: &str) -> String {
    let mut out = String::new();
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The index of subcommand `name` in `argv`: the first argument that is
/// neither the program, an option nor an option's value.
fn subcommand_index(argv: &[OsString], name: &str) -> Option<usize> {
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].to_str()?;
        if a == "--log-format" {
            i += 2;
            continue;
        }
        if a.starts_with('-') {
            i += 1;
            continue;
        }
        return (a == name).then_some(i);
    }
    None
}

/// The line a top-level key starts, 0 when none does.
fn key_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| {
            let l = l.strip_prefix('"').unwrap_or(l);
            l.strip_prefix(key)
                .is_some_and(|r| r.trim_start_matches('"').trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
        .unwrap_or(0)
}

fn location(path: &Path, line: usize) -> String {
    if line == 0 {
        path.display().to_string()
    } else {
        format!("{}:{line}", path.display())
    }
}

/// A clap error's message without its `error:` prefix and usage lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

/// A value as a YAML scalar, quoted when plain YAML would read it as
/// something else.
fn yaml_scalar(v: &str) -> String {
    let plain = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "./_-:".contains(c))
        && !v.starts_with(['-', ':'])
        && !matches!(v, "true" | "false" | "null" | "yes" | "no");
    if plain {
        v.to_owned()
    } else {
        serde_json::to_string(v).expect("a string serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cmd() -> Command {
        Command::new("drover")
            .arg(Arg::new("log_format").long("log-format").global(true))
            .subcommand(
                Command::new("serve")
                    .arg(Arg::new("data_dir").long("data-dir").env("TEST_DATA_DIR"))
                    .arg(
                        Arg::new("listen")
                            .long("listen")
                            .default_value("127.0.0.1:7443")
                            .value_parser(clap::value_parser!(std::net::SocketAddr)),
                    )
                    .arg(
                        Arg::new("heartbeat_timeout")
                            .long("heartbeat-timeout")
                            .default_value("40s")
                            .value_parser(|s: &str| drover_common::api::parse_duration(s)),
                    )
                    .arg(Arg::new("san").long("san").action(ArgAction::Append))
                    .arg(Arg::new("config").long("config"))
                    .arg(
                        Arg::new("print_config")
                            .long("print-config")
                            .action(ArgAction::SetTrue),
                    ),
            )
    }

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn no_env(_: &OsStr) -> Option<OsString> {
        None
    }

    #[test]
    fn names() {
        assert_eq!(camel("heartbeat-timeout"), "heartbeatTimeout");
        assert_eq!(camel("listen"), "listen");
        assert_eq!(
            kebab("maxUnauthenticatedConnectionsPerSource"),
            "max-unauthenticated-connections-per-source"
        );
        assert_eq!(kebab(&camel("advertise-url")), "advertise-url");
    }

    #[test]
    fn flags_win_over_the_environment_over_the_file() {
        let text = "# the team's coordinator\ndataDir: /var/lib/drover\nlisten: 0.0.0.0:7443\nheartbeatTimeout: 1m\nsan: [a.example, 10.0.0.1]\n";
        let file = ConfigFile::parse(Path::new("/etc/drover/coordinator.yaml"), text).unwrap();
        assert_eq!(file.entries[0].line, 2);
        assert_eq!(file.entries[3].values, ["a.example", "10.0.0.1"]);
        let c = cmd();
        let serve = c.find_subcommand("serve").unwrap();
        let added = file
            .flags(serve, &args(&["--listen", "127.0.0.1:9"]), &no_env)
            .unwrap();
        assert_eq!(
            added,
            args(&[
                "--data-dir=/var/lib/drover",
                "--heartbeat-timeout=1m",
                "--san=a.example",
                "--san=10.0.0.1"
            ])
        );
        let env = |n: &OsStr| (n == "TEST_DATA_DIR").then(|| OsString::from("/env"));
        let added = file.flags(serve, &[], &env).unwrap();
        assert!(
            !added
                .iter()
                .any(|a| a.to_string_lossy().starts_with("--data-dir")),
            "{added:?}"
        );

        // The whole command line: the file's flags go right after `serve`,
        // before the given ones; the effective config says where each
        // value came from.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.yaml");
        std::fs::write(&path, text).unwrap();
        let argv = vec![
            OsString::from("drover"),
            "--log-format".into(),
            "json".into(),
            "serve".into(),
            "--config".into(),
            path.clone().into_os_string(),
            "--listen=127.0.0.1:9".into(),
        ];
        let expanded = expand(argv, &c, &no_env).unwrap();
        assert_eq!(expanded.argv.len(), 7 + 4, "{:?}", expanded.argv);
        assert_eq!(expanded.argv[4], "--data-dir=/var/lib/drover");
        let matches = c.clone().try_get_matches_from(&expanded.argv).unwrap();
        let (_, m) = matches.subcommand().unwrap();
        let shown = render(serve, m, &expanded, &no_env);
        assert!(
            shown.contains("dataDir: /var/lib/drover  # file\n"),
            "{shown}"
        );
        assert!(shown.contains("listen: 127.0.0.1:9  # flag\n"), "{shown}");
        assert!(shown.contains("heartbeatTimeout: 1m  # file\n"), "{shown}");
        assert!(
            shown.contains("san: [a.example, 10.0.0.1]  # file\n"),
            "{shown}"
        );
        // Without `serve`, or without `--config`, nothing changes.
        let other = args(&["drover", "get", "clusters", "--config", "x"]);
        assert_eq!(expand(other.clone(), &c, &no_env).unwrap().argv, other);
    }

    #[test]
    fn every_refusal_names_file_line_and_key() {
        let c = cmd();
        let serve = c.find_subcommand("serve").unwrap();
        let p = Path::new("/etc/drover/coordinator.yaml");
        // Refused when the file's flags are made, or when it is read.
        let by_flags = |text: &str| {
            ConfigFile::parse(p, text)
                .unwrap()
                .flags(serve, &[], &no_env)
                .unwrap_err()
                .to_string()
        };
        let by_parse = |text: &str| ConfigFile::parse(p, text).unwrap_err().to_string();
        let e = by_flags("listen: 0.0.0.0:1\nlisen: x\n");
        assert!(
            e.starts_with("/etc/drover/coordinator.yaml:2: unknown key `lisen`; the keys are"),
            "{e}"
        );
        assert!(e.contains("dataDir, listen, heartbeatTimeout, san"), "{e}");
        let e = by_flags("heartbeatTimeout: 4 parsecs\n");
        assert!(
            e.starts_with(
                "/etc/drover/coordinator.yaml:1: key `heartbeatTimeout`: invalid value '4 parsecs'"
            ),
            "{e}"
        );
        type Refuse<'a> = &'a dyn Fn(&str) -> String;
        let refusals: [(Refuse, &str, &str); 4] = [
            (
                &by_flags,
                "listen: [a, b]\n",
                ":1: key `listen`: takes one value, not a list",
            ),
            (
                &by_flags,
                "\n\nconfig: /other.yaml\n",
                ":3: key `config` cannot be set in the file",
            ),
            (
                &by_parse,
                "listen: {host: x}\n",
                ":1: key `listen`: must be a value or a list",
            ),
            (&by_parse, "- listen\n", "must be a mapping"),
        ];
        for (refuse, text, says) in refusals {
            let e = refuse(text);
            assert!(e.contains(says), "{e}");
        }
        let e = by_parse("listen: [\n");
        assert!(
            e.starts_with("config file /etc/drover/coordinator.yaml is not YAML: "),
            "{e}"
        );
    }
}
