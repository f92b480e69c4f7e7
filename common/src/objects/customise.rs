//! What a cluster puts on its machines around kubeadm: files written
//! before it runs and commands run before and after it (`spec.files`,
//! `spec.preKubeadmCommands`, `spec.postKubeadmCommands`, and the same per
//! pool), with the rules both the coordinator (at `drover apply`) and the
//! agent (before it writes anything) check.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::secret::{check_secret_key, SecretKeyRef};

/// A file every machine of a cluster (or of one pool) gets before kubeadm
/// runs, written atomically under the agent's root.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineFile {
    /// An absolute path on the machine, such as
    /// `/etc/cni/net.d/10-bridge.conflist`. The paths the agent and kubeadm
    /// own are refused ([`RESERVED_PATHS`]).
    pub path: String,
    /// Octal permission bits, such as `"0644"` (the default).
    pub permissions: Option<String>,
    /// `user`, `user:group` or numeric ids (default `root:root`). Names are
    /// looked up in the machine's own `/etc/passwd` and `/etc/group`.
    pub owner: Option<String>,
    /// The file's text. Give this or `contentFrom`.
    pub content: Option<String>,
    /// A Secret's key whose value is the file's text, read when a machine's
    /// config bundle is built.
    pub content_from: Option<SecretKeyRef>,
    /// Whether only control-plane machines get it; a worker never does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control_plane_only: bool,
}

/// A machine file as it travels in a signed config bundle: resolved for one
/// machine, its permissions parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineFileContent {
    pub path: String,
    /// Permission bits, at most `0o777`.
    pub mode: u32,
    /// `user[:group]`, as in the spec; `root:root` when the spec says
    /// nothing.
    pub owner: String,
    pub content: String,
}

/// The permissions a file gets when the spec gives none.
pub const DEFAULT_PERMISSIONS: u32 = 0o644;
/// The owner a file gets when the spec gives none.
pub const DEFAULT_OWNER: &str = "root:root";
/// The largest content of one file, in bytes.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// The most files in one list (`spec.files` or a pool's).
pub const MAX_FILES: usize = 64;
/// The most commands in one of `preKubeadmCommands` or `postKubeadmCommands`.
pub const MAX_COMMANDS: usize = 64;
/// The longest command, in bytes.
pub const MAX_COMMAND_BYTES: usize = 4096;
/// The largest config bundle the coordinator sends one machine, in bytes
/// of the signed bundle as it travels (its JSON). `drover apply` refuses a
/// Cluster, or a Secret a cluster's files read, that would make a larger
/// one; a bundle built past it anyway is refused, not sent.
pub const MAX_BUNDLE_BYTES: usize = 4 * 1024 * 1024;
/// What a bundle's own part may take (the CA set, the kubeadm config, the
/// other fields and the signature): the cluster's files and commands get
/// the rest of [`MAX_BUNDLE_BYTES`].
pub const BUNDLE_OWN_BYTES: usize = 64 * 1024;
/// What one machine file takes in a bundle besides its path, owner and
/// content (the field names, its mode, the punctuation), at most.
pub const BUNDLE_FILE_OVERHEAD: usize = 64;

/// How many bytes `text` takes in a signed bundle as it travels: a JSON
/// string inside the payload, which is itself sent as a JSON string, so
/// escaped twice (a `"` takes 4 bytes, a control character up to 7).
pub fn bundle_text_bytes(text: &str) -> usize {
    let quotes = 4;
    quotes
        + text
            .chars()
            .map(|c| match c {
                '"' | '\\' => 4,
                '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 3,
                c if (c as u32) < 0x20 => 7,
                c => c.len_utf8(),
            })
            .sum::<usize>()
}

/// How a viewer token is shown a file's inline content, a command or an
/// addon's manifests: this prefix, the text's size and its SHA-256. Apply
/// refuses a text that begins with it (a viewer's copy applied by
/// mistake would put the placeholder on every machine).
pub const HIDDEN_PREFIX: &str = "<hidden from viewers: ";

/// What a viewer is shown in place of `text`:
/// `<hidden from viewers: 12 bytes, sha256:0a1b…>`.
pub fn hidden_text(text: &str) -> String {
    use sha2::{Digest, Sha256};
    format!(
        "{HIDDEN_PREFIX}{} bytes, sha256:{}>",
        text.len(),
        hex::encode(Sha256::digest(text.as_bytes()))
    )
}

/// How long one command may run before the agent kills it and fails the
/// machine.
pub const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Paths a machine file may not be at or under: the agent's own config and
/// state, and what kubeadm writes or the coordinator hands out (the cluster
/// CAs, the static Pod manifests, the kubeconfigs). A directory entry ends
/// in `/`.
pub const RESERVED_PATHS: &[&str] = &[
    "/etc/drover/",
    "/var/lib/drover-agent/",
    "/usr/lib/drover/",
    "/usr/local/bin/drover-agent",
    "/etc/kubernetes/pki/",
    "/etc/kubernetes/manifests/",
    "/etc/kubernetes/admin.conf",
    "/etc/kubernetes/super-admin.conf",
    "/etc/kubernetes/kubelet.conf",
    "/etc/kubernetes/bootstrap-kubelet.conf",
    "/etc/kubernetes/controller-manager.conf",
    "/etc/kubernetes/scheduler.conf",
    "/var/lib/kubelet/config.yaml",
    "/var/lib/kubelet/kubeadm-flags.env",
    "/var/lib/kubelet/pki/",
    "/var/lib/etcd/",
];

/// Why a machine file or command is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CustomiseError {
    #[error("path {0:?} must be absolute (start with /)")]
    NotAbsolute(String),
    #[error(
        "path {0:?} must name a file: no `.` or `..` components, no empty ones, no trailing /"
    )]
    NotNormal(String),
    #[error("path {path:?} is reserved: {owner} owns {prefix}; put the file elsewhere")]
    Reserved {
        path: String,
        prefix: &'static str,
        owner: &'static str,
    },
    #[error("permissions {0:?} must be octal digits such as \"0644\" or \"0600\", at most 0777")]
    Permissions(String),
    #[error(
        "owner {0:?} must be `user` or `user:group`, each a name such as `root` or a numeric id"
    )]
    Owner(String),
    #[error("content is {0} bytes; a file may hold at most {MAX_FILE_BYTES}")]
    TooLarge(usize),
    #[error("the file has neither content nor contentFrom; give one")]
    NoContent,
    #[error("the file gives both content and contentFrom; give one")]
    BothContents,
    #[error("{0}")]
    SecretRef(String),
    #[error(
        "secret {secret:?} does not exist; apply it first (`drover apply -f` a Secret document)"
    )]
    MissingSecret { secret: String },
    #[error("secret {secret:?} has no key {key:?} (its keys: {keys}); add the key to the Secret or fix contentFrom")]
    MissingKey {
        secret: String,
        key: String,
        keys: String,
    },
    #[error(
        "the value of secret {secret:?} key {key:?} is not UTF-8 text; a machine file holds text"
    )]
    NotText { secret: String, key: String },
    #[error("command must not be empty")]
    EmptyCommand,
    #[error("command is {0} bytes; at most {MAX_COMMAND_BYTES} are allowed")]
    LongCommand(usize),
    #[error("command contains a NUL byte")]
    NulCommand,
    #[error("is what a viewer token is shown in place of the text, not the text itself; fetch the cluster with an admin token (`drover get cluster NAME -o yaml`) and apply that")]
    Hidden,
}

/// Checks a machine file's path: absolute, every component a plain name,
/// and not at or under a [`RESERVED_PATHS`] entry.
pub fn check_machine_file_path(path: &str) -> Result<(), CustomiseError> {
    if !path.starts_with('/') {
        return Err(CustomiseError::NotAbsolute(path.to_owned()));
    }
    let body = &path[1..];
    let plain = !body.is_empty()
        && !path.ends_with('/')
        && !path.contains('\0')
        && path.len() <= 4096
        && body
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255);
    if !plain {
        return Err(CustomiseError::NotNormal(path.to_owned()));
    }
    for prefix in RESERVED_PATHS {
        let hit = if let Some(dir) = prefix.strip_suffix('/') {
            path == dir || path.starts_with(prefix)
        } else {
            path == *prefix
        };
        if hit {
            let owner = if prefix.contains("drover") {
                "the Drover agent"
            } else if prefix.contains("etcd") {
                "etcd"
            } else {
                "kubeadm"
            };
            return Err(CustomiseError::Reserved {
                path: path.to_owned(),
                prefix,
                owner,
            });
        }
    }
    Ok(())
}

/// Parses octal permissions such as `"0644"` or `"600"`.
pub fn parse_permissions(s: &str) -> Result<u32, CustomiseError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(CustomiseError::Permissions(s.to_owned()));
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| CustomiseError::Permissions(s.into()))?;
    if mode > 0o777 {
        return Err(CustomiseError::Permissions(s.to_owned()));
    }
    Ok(mode)
}

/// The two halves of `user[:group]`, each a name or a numeric id.
pub fn parse_owner(s: &str) -> Result<(&str, Option<&str>), CustomiseError> {
    let bad = || CustomiseError::Owner(s.to_owned());
    let (user, group) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 32
            && (part.bytes().all(|b| b.is_ascii_digit())
                || (part.as_bytes()[0].is_ascii_lowercase() || part.as_bytes()[0] == b'_')
                    && part.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b)
                    }))
    };
    if !ok(user) || group.is_some_and(|g| !ok(g)) {
        return Err(bad());
    }
    Ok((user, group))
}

/// Checks one pre- or post-kubeadm command.
pub fn check_command(command: &str) -> Result<(), CustomiseError> {
    if command.trim().is_empty() {
        return Err(CustomiseError::EmptyCommand);
    }
    if command.len() > MAX_COMMAND_BYTES {
        return Err(CustomiseError::LongCommand(command.len()));
    }
    if command.contains('\0') {
        return Err(CustomiseError::NulCommand);
    }
    if command.starts_with(HIDDEN_PREFIX) {
        return Err(CustomiseError::Hidden);
    }
    Ok(())
}

/// Finds the text a `contentFrom` names: the coordinator reads its
/// Secrets; a check without them ([`check_file`]) never calls it.
pub type SecretLookup<'a> = &'a dyn Fn(&SecretKeyRef) -> Result<String, CustomiseError>;

/// Checks a file as the spec gives it, without reading any Secret: its
/// path, permissions, owner, inline content's size and the shape of its
/// `contentFrom`. Returns its mode.
pub fn check_file(file: &MachineFile) -> Result<u32, CustomiseError> {
    check_machine_file_path(&file.path)?;
    let mode = match &file.permissions {
        Some(p) => parse_permissions(p)?,
        None => DEFAULT_PERMISSIONS,
    };
    parse_owner(file.owner.as_deref().unwrap_or(DEFAULT_OWNER))?;
    match (&file.content, &file.content_from) {
        (None, None) => return Err(CustomiseError::NoContent),
        (Some(_), Some(_)) => return Err(CustomiseError::BothContents),
        (Some(content), None) if content.len() > MAX_FILE_BYTES => {
            return Err(CustomiseError::TooLarge(content.len()))
        }
        (Some(content), None) if content.starts_with(HIDDEN_PREFIX) => {
            return Err(CustomiseError::Hidden)
        }
        (Some(_), None) => {}
        (None, Some(r)) => {
            crate::names::check_object_name("the secret name", &r.secret)
                .map_err(|e| CustomiseError::SecretRef(e.to_string()))?;
            check_secret_key(&r.key).map_err(|e| CustomiseError::SecretRef(e.to_string()))?;
        }
    }
    Ok(mode)
}

/// Checks a file as the spec gives it and returns it as a bundle carries
/// it, its `contentFrom` read through `secrets`.
pub fn resolve_file(
    file: &MachineFile,
    secrets: SecretLookup<'_>,
) -> Result<MachineFileContent, CustomiseError> {
    let mode = check_file(file)?;
    let content = match (&file.content, &file.content_from) {
        (Some(content), _) => content.clone(),
        (None, Some(r)) => secrets(r)?,
        (None, None) => return Err(CustomiseError::NoContent),
    };
    if content.len() > MAX_FILE_BYTES {
        return Err(CustomiseError::TooLarge(content.len()));
    }
    Ok(MachineFileContent {
        path: file.path.clone(),
        mode,
        owner: file.owner.as_deref().unwrap_or(DEFAULT_OWNER).to_owned(),
        content,
    })
}

/// Checks a bundle's machine file again on the machine, before anything is
/// written: a bundle is signed, but the agent keeps its own rules.
pub fn check_file_content(file: &MachineFileContent) -> Result<(), CustomiseError> {
    check_machine_file_path(&file.path)?;
    if file.mode > 0o777 {
        return Err(CustomiseError::Permissions(format!("{:o}", file.mode)));
    }
    parse_owner(&file.owner)?;
    if file.content.len() > MAX_FILE_BYTES {
        return Err(CustomiseError::TooLarge(file.content.len()));
    }
    Ok(())
}

/// What one machine gets: the cluster's files and commands, then its
/// pool's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineCustomisation {
    pub files: Vec<MachineFileContent>,
    pub pre_kubeadm_commands: Vec<String>,
    pub post_kubeadm_commands: Vec<String>,
}

/// Reports every problem of one list of files and the two command lists
/// under `prefix` (`spec` or `spec.workerPools[1]`).
pub(crate) fn validate_customisation(
    prefix: &str,
    files: &[MachineFile],
    pre: &[String],
    post: &[String],
    err: &mut dyn FnMut(&str, String),
) {
    if files.len() > MAX_FILES {
        err(
            &format!("{prefix}.files"),
            format!("at most {MAX_FILES} files, got {}", files.len()),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, file) in files.iter().enumerate() {
        let field = format!("{prefix}.files[{i}]");
        if let Err(e) = check_file(file) {
            let part = match e {
                CustomiseError::Permissions(_) => "permissions",
                CustomiseError::Owner(_) => "owner",
                CustomiseError::TooLarge(_)
                | CustomiseError::NoContent
                | CustomiseError::BothContents
                | CustomiseError::Hidden => "content",
                CustomiseError::SecretRef(_) => "contentFrom",
                _ => "path",
            };
            err(&format!("{field}.{part}"), e.to_string());
        }
        if !seen.insert(file.path.as_str()) {
            err(
                &format!("{field}.path"),
                format!("{:?} is listed twice; give each path once", file.path),
            );
        }
    }
    for (name, list) in [("preKubeadmCommands", pre), ("postKubeadmCommands", post)] {
        if list.len() > MAX_COMMANDS {
            err(
                &format!("{prefix}.{name}"),
                format!("at most {MAX_COMMANDS} commands, got {}", list.len()),
            );
        }
        for (i, command) in list.iter().enumerate() {
            if let Err(e) = check_command(command) {
                err(&format!("{prefix}.{name}[{i}]"), e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> MachineFile {
        MachineFile {
            path: path.into(),
            permissions: None,
            owner: None,
            content: Some("x".into()),
            content_from: None,
            control_plane_only: false,
        }
    }

    #[test]
    fn paths() {
        assert!(check_machine_file_path("/etc/cni/net.d/10-bridge.conflist").is_ok());
        assert!(check_machine_file_path("/etc/kubernetes/audit-policy.yaml").is_ok());
        for bad in [
            "etc/x",
            "/",
            "/etc/",
            "/etc//x",
            "/etc/../x",
            "/etc/./x",
            "/a\0b",
        ] {
            assert!(
                matches!(
                    check_machine_file_path(bad),
                    Err(CustomiseError::NotAbsolute(_) | CustomiseError::NotNormal(_))
                ),
                "{bad:?}"
            );
        }
        for reserved in [
            "/etc/drover/kubeadm.yaml",
            "/etc/drover",
            "/etc/kubernetes/pki/ca.key",
            "/etc/kubernetes/admin.conf",
            "/var/lib/drover-agent/state.json",
            "/etc/kubernetes/manifests/kube-apiserver.yaml",
        ] {
            let e = check_machine_file_path(reserved).unwrap_err();
            assert!(matches!(e, CustomiseError::Reserved { .. }), "{reserved}");
            assert!(e.to_string().contains("put the file elsewhere"), "{e}");
        }
        // A name that only starts like a reserved file is fine.
        assert!(check_machine_file_path("/etc/kubernetes/admin.conf.d/x").is_ok());
        assert!(check_machine_file_path("/etc/droverx/y").is_ok());
    }

    #[test]
    fn permissions_and_owners() {
        assert_eq!(parse_permissions("0644").unwrap(), 0o644);
        assert_eq!(parse_permissions("600").unwrap(), 0o600);
        assert_eq!(parse_permissions("0o755").unwrap(), 0o755);
        for bad in ["", "0888", "4755", "rw-r--r--", "01777", "-1"] {
            assert!(parse_permissions(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_owner("root").unwrap(), ("root", None));
        assert_eq!(parse_owner("0:0").unwrap(), ("0", Some("0")));
        assert_eq!(parse_owner("etcd:etcd").unwrap(), ("etcd", Some("etcd")));
        for bad in ["", ":", "root:", "Root", "a b", "x;rm", "root:wheel:x"] {
            assert!(parse_owner(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resolve_defaults_and_limits() {
        let none: SecretLookup = &|r| panic!("no secret is read for inline content: {r}");
        let f = resolve_file(&file("/etc/x"), none).unwrap();
        assert_eq!((f.mode, f.owner.as_str()), (0o644, "root:root"));
        let mut big = file("/etc/x");
        big.content = Some("x".repeat(MAX_FILE_BYTES + 1));
        assert!(matches!(
            resolve_file(&big, none),
            Err(CustomiseError::TooLarge(_))
        ));
        let mut bad = file("/etc/x");
        bad.permissions = Some("0999".into());
        assert!(check_file_content(&MachineFileContent {
            path: "/etc/drover/kubeadm.yaml".into(),
            mode: 0o600,
            owner: "root".into(),
            content: String::new(),
        })
        .is_err());
        let mut errs = Vec::new();
        validate_customisation(
            "spec",
            &[bad, file("/etc/y"), file("/etc/y")],
            &["".into()],
            &["echo ok".into()],
            &mut |f, m| errs.push(format!("{f}: {m}")),
        );
        assert_eq!(errs.len(), 3, "{errs:#?}");
        assert!(
            errs[0].starts_with("spec.files[0].permissions: "),
            "{errs:#?}"
        );
        assert!(errs[1].starts_with("spec.files[2].path: "), "{errs:#?}");
        assert!(
            errs[2].starts_with("spec.preKubeadmCommands[0]: "),
            "{errs:#?}"
        );
    }
    #[test]
    fn bundle_text_bytes_are_the_text_escaped_twice() {
        for text in [
            "plain",
            "",
            "quote \" back \\ nl \n tab \t bell \u{7} é ✓",
            "\u{1f}\u{7f}",
        ] {
            // Inside the payload, whose own quotes are counted once.
            let once = serde_json::to_string(text).unwrap();
            let twice = serde_json::to_string(&once).unwrap();
            assert_eq!(bundle_text_bytes(text), twice.len() - 2, "{text:?}");
        }
    }

    #[test]
    fn what_viewers_are_shown_cannot_be_applied() {
        let shown = hidden_text("echo hi");
        assert_eq!(
            shown,
            "<hidden from viewers: 7 bytes, sha256:56a79f3b115448072387c2480044bfa2cf8f90e4f5fddd8c943b4e051b81f80b>"
        );
        assert_eq!(check_command(&shown), Err(CustomiseError::Hidden));
        let mut f = file("/etc/x");
        f.content = Some(shown);
        assert_eq!(check_file(&f), Err(CustomiseError::Hidden));
    }

    #[test]
    fn content_from_a_secret() {
        let lookup: SecretLookup = &|r| match (r.secret.as_str(), r.key.as_str()) {
            ("registry", "auth.json") => Ok("{\"auths\": {}}".into()),
            ("registry", _) => Err(CustomiseError::MissingKey {
                secret: r.secret.clone(),
                key: r.key.clone(),
                keys: "auth.json".into(),
            }),
            ("big", _) => Ok("x".repeat(MAX_FILE_BYTES + 1)),
            _ => Err(CustomiseError::MissingSecret {
                secret: r.secret.clone(),
            }),
        };
        let from = |secret: &str, key: &str| MachineFile {
            content: None,
            content_from: Some(SecretKeyRef {
                secret: secret.into(),
                key: key.into(),
            }),
            permissions: Some("0600".into()),
            ..file("/etc/containerd/auth.json")
        };
        // A Secret's value may be as large as a file.
        assert_eq!(super::super::secret::MAX_SECRET_VALUE_BYTES, MAX_FILE_BYTES);
        let f = resolve_file(&from("registry", "auth.json"), lookup).unwrap();
        assert_eq!((f.content.as_str(), f.mode), ("{\"auths\": {}}", 0o600));
        let e = resolve_file(&from("registry", "token"), lookup).unwrap_err();
        assert!(
            e.to_string()
                .contains("has no key \"token\" (its keys: auth.json)"),
            "{e}"
        );
        let e = resolve_file(&from("gone", "k"), lookup).unwrap_err();
        assert!(e.to_string().contains("apply it first"), "{e}");
        assert!(matches!(
            resolve_file(&from("big", "k"), lookup),
            Err(CustomiseError::TooLarge(_))
        ));
        // The shapes are checked without reading any Secret.
        let mut both = from("registry", "auth.json");
        both.content = Some("x".into());
        let mut neither = from("registry", "auth.json");
        neither.content_from = None;
        let mut errs = Vec::new();
        validate_customisation(
            "spec.workerPools[0]",
            &[
                both,
                neither,
                from("Registry", "k"),
                from("registry", "a/b"),
            ],
            &[],
            &[],
            &mut |f, m| errs.push(format!("{f}: {m}")),
        );
        assert_eq!(
            errs,
            [
                "spec.workerPools[0].files[0].content: the file gives both content and contentFrom; give one",
                "spec.workerPools[0].files[1].content: the file has neither content nor contentFrom; give one",
                "spec.workerPools[0].files[1].path: \"/etc/containerd/auth.json\" is listed twice; give each path once",
                "spec.workerPools[0].files[2].contentFrom: the secret name \"Registry\" is invalid: an object name must be a DNS-1123 subdomain: at most 253 characters, dot-separated parts of 1 to 63 lowercase letters, digits and '-', each starting and ending with a letter or digit",
                "spec.workerPools[0].files[2].path: \"/etc/containerd/auth.json\" is listed twice; give each path once",
                "spec.workerPools[0].files[3].contentFrom: key \"a/b\" must be 1 to 253 letters, digits, '-', '_' or '.' (not \".\" or \"..\")",
                "spec.workerPools[0].files[3].path: \"/etc/containerd/auth.json\" is listed twice; give each path once",
            ],
        );
    }
}
