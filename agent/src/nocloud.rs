//! The cloud-init NoCloud seed: where a machine finds its bootstrap document
//! when the agent is given no `--bootstrap` and has no saved state.
//!
//! The seed directory (default `/var/lib/cloud/seed/nocloud`) is the real
//! machine's, never under `--root`. Its `user-data` holds either
//! - the bootstrap document itself (what `drover token create` prints), or
//! - a `#cloud-config` document whose top-level key `drover_bootstrap` holds
//!   the bootstrap document as a string (`drover_bootstrap: |` followed by
//!   the document, indented) or as a mapping.
//!
//! Its `meta-data` may name the machine (`local-hostname: NAME`), which the
//! agent reports when `--hostname` is not given.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use drover_common::wire::BootstrapDocument;
use serde::Deserialize;

/// Where cloud-init looks for a local NoCloud seed.
pub const DEFAULT_DIR: &str = "/var/lib/cloud/seed/nocloud";

/// The `#cloud-config` key that carries the bootstrap document.
pub const CLOUD_CONFIG_KEY: &str = "drover_bootstrap";

/// The header line that marks cloud-init's cloud-config format.
const CLOUD_CONFIG_HEADER: &str = "#cloud-config";

/// The largest seed file read. A bare bootstrap document is limited to
/// [`BootstrapDocument::MAX_LEN`]; a cloud-config may carry more.
const MAX_SEED_FILE: u64 = 1024 * 1024;

/// The seed's user data file.
pub fn user_data_path(dir: &Path) -> PathBuf {
    dir.join("user-data")
}

/// The seed's meta data file.
pub fn meta_data_path(dir: &Path) -> PathBuf {
    dir.join("meta-data")
}

/// Reads a seed file; `None` when it does not exist.
fn read_seed_file(path: &Path) -> anyhow::Result<Option<String>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(MAX_SEED_FILE + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_SEED_FILE {
        bail!("{} is larger than {MAX_SEED_FILE} bytes", path.display());
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        anyhow!(
            "{} is not UTF-8 text (compressed or binary user data is not supported)",
            path.display()
        )
    })?;
    Ok(Some(text))
}

/// Reads the bootstrap document from the seed's `user-data`; `None` when the
/// file does not exist.
pub fn read_bootstrap(dir: &Path) -> anyhow::Result<Option<BootstrapDocument>> {
    let path = user_data_path(dir);
    let Some(text) = read_seed_file(&path)? else {
        return Ok(None);
    };
    parse_user_data(&text)
        .map(Some)
        .with_context(|| format!("invalid NoCloud user data {}", path.display()))
}

/// The top-level keys of a cloud-config the agent reads; every other key is
/// cloud-init's business.
#[derive(Debug, Deserialize)]
struct CloudConfig {
    #[serde(default)]
    drover_bootstrap: Option<serde_json::Value>,
}

/// Parses user data: a bare bootstrap document, or a `#cloud-config` whose
/// `drover_bootstrap` key holds one.
pub fn parse_user_data(text: &str) -> anyhow::Result<BootstrapDocument> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.starts_with(CLOUD_CONFIG_HEADER) {
        return parse_cloud_config(text);
    }
    if text.starts_with("#!") {
        bail!("it is a script; expected a Drover bootstrap document or {CLOUD_CONFIG_HEADER} with a {CLOUD_CONFIG_KEY} key");
    }
    if text
        .get(..13)
        .is_some_and(|s| s.eq_ignore_ascii_case("content-type:"))
    {
        bail!("it is MIME multipart user data, which the agent does not read; expected a Drover bootstrap document or {CLOUD_CONFIG_HEADER} with a {CLOUD_CONFIG_KEY} key");
    }
    Ok(BootstrapDocument::parse(text)?)
}

fn parse_cloud_config(text: &str) -> anyhow::Result<BootstrapDocument> {
    let config: CloudConfig = serde_saphyr::from_str(text)
        .map_err(|e| anyhow!("{CLOUD_CONFIG_HEADER} is not valid YAML: {e}"))?;
    match config.drover_bootstrap {
        None | Some(serde_json::Value::Null) => bail!(
            "the {CLOUD_CONFIG_HEADER} document has no top-level {CLOUD_CONFIG_KEY} key holding the bootstrap document"
        ),
        Some(serde_json::Value::String(doc)) => BootstrapDocument::parse(&doc)
            .with_context(|| format!("{CLOUD_CONFIG_KEY} is not a valid bootstrap document")),
        Some(doc @ serde_json::Value::Object(_)) => {
            // JSON is YAML: parse the mapping with the same checks as text.
            BootstrapDocument::parse(&doc.to_string())
                .with_context(|| format!("{CLOUD_CONFIG_KEY} is not a valid bootstrap document"))
        }
        Some(_) => bail!(
            "{CLOUD_CONFIG_KEY} must be a string holding the bootstrap document (`{CLOUD_CONFIG_KEY}: |` and the document indented below)"
        ),
    }
}

/// The `local-hostname` of the seed's `meta-data`, if the file exists and
/// names one.
pub fn local_hostname(dir: &Path) -> anyhow::Result<Option<String>> {
    let path = meta_data_path(dir);
    let Some(text) = read_seed_file(&path)? else {
        return Ok(None);
    };
    parse_local_hostname(&text)
        .with_context(|| format!("invalid NoCloud meta data {}", path.display()))
}

/// Reads `local-hostname` from meta data (YAML or JSON).
pub fn parse_local_hostname(text: &str) -> anyhow::Result<Option<String>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let meaningful = text
        .lines()
        .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    if !meaningful {
        return Ok(None);
    }
    let doc: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| anyhow!("not valid YAML: {e}"))?;
    let map = match doc {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => return Ok(None),
        _ => bail!("not a mapping of keys to values"),
    };
    match map.get("local-hostname") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.trim().to_owned())),
        Some(serde_json::Value::Number(n)) => Ok(Some(n.to_string())),
        Some(_) => bail!("local-hostname must be a string"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn raw_doc() -> String {
        format!(
            "apiVersion: drover.dev/v1alpha1\nkind: BootstrapConfig\ncoordinators:\n- https://drover.example:7443\ncaPin: {PIN}\nticket: dt1.abc.def\n"
        )
    }

    fn indent(text: &str) -> String {
        text.lines().map(|l| format!("  {l}\n")).collect()
    }

    #[test]
    fn bare_document() {
        let doc = parse_user_data(&raw_doc()).unwrap();
        assert_eq!(doc.coordinators, ["https://drover.example:7443"]);
        assert_eq!(doc.ticket, "dt1.abc.def");
        // A BOM is not part of the document.
        let doc2 = parse_user_data(&format!("\u{feff}{}", raw_doc())).unwrap();
        assert_eq!(doc, doc2);
    }

    #[test]
    fn cloud_config_with_string() {
        let text = format!(
            "#cloud-config\n# set by Drover\nhostname: node-1\npackages: [curl]\nwrite_files:\n  - path: /etc/motd\n    content: hi\n{CLOUD_CONFIG_KEY}: |\n{}",
            indent(&raw_doc())
        );
        let doc = parse_user_data(&text).unwrap();
        assert_eq!(doc, parse_user_data(&raw_doc()).unwrap());
    }

    #[test]
    fn cloud_config_with_mapping() {
        let text = format!("#cloud-config\n{CLOUD_CONFIG_KEY}:\n{}", indent(&raw_doc()));
        let doc = parse_user_data(&text).unwrap();
        assert_eq!(doc.ticket, "dt1.abc.def");
    }

    #[test]
    fn cloud_config_errors_name_the_problem() {
        let err = format!(
            "{:#}",
            parse_user_data("#cloud-config\npackages: [curl]\n").unwrap_err()
        );
        assert!(err.contains("no top-level drover_bootstrap key"), "{err}");

        let err = format!(
            "{:#}",
            parse_user_data("#cloud-config\ndrover_bootstrap: 42\n").unwrap_err()
        );
        assert!(err.contains("must be a string"), "{err}");

        let text = format!(
            "#cloud-config\n{CLOUD_CONFIG_KEY}: |\n{}",
            indent(&raw_doc().replace("BootstrapConfig", "Nope"))
        );
        let err = format!("{:#}", parse_user_data(&text).unwrap_err());
        assert!(err.contains("not a valid bootstrap document"), "{err}");
        assert!(err.contains("kind"), "{err}");

        let err = format!(
            "{:#}",
            parse_user_data("#cloud-config\n: : [\n").unwrap_err()
        );
        assert!(err.contains("not valid YAML"), "{err}");
    }

    #[test]
    fn other_user_data_is_refused_clearly() {
        let err = format!("{:#}", parse_user_data("#!/bin/sh\necho hi\n").unwrap_err());
        assert!(err.contains("script"), "{err}");
        let err = format!(
            "{:#}",
            parse_user_data("Content-Type: multipart/mixed; boundary=x\n\n--x\n").unwrap_err()
        );
        assert!(err.contains("MIME multipart"), "{err}");
        let err = format!("{:#}", parse_user_data("hello: world\n").unwrap_err());
        assert!(err.contains("bootstrap document"), "{err}");
    }

    #[test]
    fn read_from_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_bootstrap(dir.path()).unwrap().is_none());
        assert!(local_hostname(dir.path()).unwrap().is_none());
        assert!(read_bootstrap(&dir.path().join("missing"))
            .unwrap()
            .is_none());

        std::fs::write(user_data_path(dir.path()), raw_doc()).unwrap();
        assert_eq!(
            read_bootstrap(dir.path()).unwrap().unwrap().ticket,
            "dt1.abc.def"
        );

        std::fs::write(user_data_path(dir.path()), "#cloud-config\n").unwrap();
        let err = format!("{:#}", read_bootstrap(dir.path()).unwrap_err());
        assert!(err.contains("invalid NoCloud user data"), "{err}");
        assert!(err.contains("user-data"), "{err}");

        std::fs::write(user_data_path(dir.path()), [0x1f, 0x8b, 0x08, 0xff]).unwrap();
        let err = format!("{:#}", read_bootstrap(dir.path()).unwrap_err());
        assert!(err.contains("not UTF-8"), "{err}");

        let big = vec![b'#'; MAX_SEED_FILE as usize + 1];
        std::fs::write(user_data_path(dir.path()), big).unwrap();
        let err = format!("{:#}", read_bootstrap(dir.path()).unwrap_err());
        assert!(err.contains("larger than"), "{err}");

        std::fs::write(
            meta_data_path(dir.path()),
            "instance-id: iid-local01\nlocal-hostname: node-7\n",
        )
        .unwrap();
        assert_eq!(
            local_hostname(dir.path()).unwrap().as_deref(),
            Some("node-7")
        );
        std::fs::write(meta_data_path(dir.path()), "[1, 2]\n").unwrap();
        let err = format!("{:#}", local_hostname(dir.path()).unwrap_err());
        assert!(err.contains("invalid NoCloud meta data"), "{err}");
    }

    #[test]
    fn the_shipped_examples_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/cloud-init");
        let user_data = std::fs::read_to_string(dir.join("user-data.example")).unwrap();
        assert!(user_data.starts_with(CLOUD_CONFIG_HEADER));
        let doc = parse_user_data(&user_data).unwrap();
        assert_eq!(doc.coordinators, ["https://drover.example.com:7443"]);
        let meta_data = std::fs::read_to_string(dir.join("meta-data.example")).unwrap();
        assert_eq!(
            parse_local_hostname(&meta_data).unwrap().as_deref(),
            Some("node-1")
        );
    }

    #[test]
    fn meta_data_forms() {
        assert_eq!(parse_local_hostname("").unwrap(), None);
        assert_eq!(parse_local_hostname("# nothing\n\n").unwrap(), None);
        assert_eq!(parse_local_hostname("instance-id: iid-1\n").unwrap(), None);
        assert_eq!(
            parse_local_hostname("local-hostname: web-1\n")
                .unwrap()
                .as_deref(),
            Some("web-1")
        );
        assert_eq!(
            parse_local_hostname(r#"{"instance-id": "i-1", "local-hostname": "json-host"}"#)
                .unwrap()
                .as_deref(),
            Some("json-host")
        );
        assert_eq!(parse_local_hostname("local-hostname: ''\n").unwrap(), None);
        assert_eq!(
            parse_local_hostname("local-hostname: 1234\n")
                .unwrap()
                .as_deref(),
            Some("1234")
        );
        assert!(parse_local_hostname("local-hostname: [a]\n").is_err());
        assert!(parse_local_hostname("just text").is_err());
    }
}
