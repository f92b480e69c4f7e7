//! kubeadm's patches: `patches.directory` of an InitConfiguration or
//! JoinConfiguration, and `--patches` of `kubeadm upgrade`.
//!
//! The directory is read as `cmd/kubeadm/app/util/patches/patches.go`
//! (`getPatchSetsFromPath`, `parseFilename`, `createPatchSet`) reads it: it
//! is walked (sub-directories descended into, their own entries ignored, in
//! lexical order as `filepath.Walk` goes); a file is named
//! `target[suffix][+patchtype].extension`; a file whose extension is not
//! json or yaml, or whose name starts with no known target, is ignored with
//! a `[patches] Ignoring file` line; a `+` followed by no known patch type
//! is an error; an empty file is ignored; a file's YAML documents are
//! separate patches. Patch types are `json` (RFC 6902), `merge` (RFC 7386)
//! and `strategic`, the default.
//!
//! The stand-in applies only `kubeletconfiguration` patches (to the
//! kubelet configuration, as `cmd/kubeadm/app/phases/kubelet/config.go`
//! does before writing `/var/lib/kubelet/config.yaml`): a patch of any
//! other known target is refused, since it does not patch static Pod
//! manifests or CoreDNS. For the KubeletConfiguration a strategic merge
//! patch is a JSON merge patch (its Go type has no `patchStrategy` or
//! `patchMergeKey` markers: maps merge, lists are replaced, null deletes);
//! strategic merge directives (`$patch`, `$retainKeys`,
//! `$setElementOrder/...`, `$deleteFromPrimitiveList/...`) are refused
//! rather than guessed at.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::util::Root;

/// kubeadm's known patch targets, in its order (`patches.KnownTargets`).
pub const KNOWN_TARGETS: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubeletconfiguration",
    "corednsdeployment",
];

/// The target the stand-in applies.
pub const KUBELET_CONFIGURATION: &str = "kubeletconfiguration";

const KNOWN_EXTENSIONS: [&str; 2] = ["json", "yaml"];
const PATCH_TYPES: [&str; 3] = ["json", "merge", "strategic"];

/// A patch type, as kubeadm names it in its output (`types.PatchType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
}

impl PatchType {
    fn media_type(self) -> &'static str {
        match self {
            Self::Json => "application/json-patch+json",
            Self::Merge => "application/merge-patch+json",
            Self::Strategic => "application/strategic-merge-patch+json",
        }
    }
}

/// The patches of one file.
#[derive(Debug, Clone, PartialEq)]
struct PatchSet {
    file: String,
    target: &'static str,
    patch_type: PatchType,
    patches: Vec<Value>,
}

/// The patches of a directory, in the order kubeadm applies them.
#[derive(Debug, Clone, PartialEq)]
pub struct Patches {
    sets: Vec<PatchSet>,
}

/// Go's `%v` of a string slice: `[a b c]`.
fn go_list(items: &[&str]) -> String {
    format!("[{}]", items.join(" "))
}

/// The directory `patches` names (`patches: {directory: DIR}`), if any.
/// v1beta4's `Patches` has `directory` alone: any other key is a strict
/// decoding error, as kubeadm's strict decoding makes it.
pub fn directory(patches: Option<&Value>, what: &str) -> Result<Option<String>> {
    let Some(patches) = patches.filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let map = patches.as_object().ok_or_else(|| {
        anyhow!("{what}: strict decoding error: patches must be a mapping such as {{directory: /etc/kubeadm/patches}}")
    })?;
    if let Some(key) = map.keys().find(|k| *k != "directory") {
        bail!("{what}: strict decoding error: unknown field \"patches.{key}\" (v1beta4 patches has only directory)");
    }
    match map.get("directory") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(dir)) if dir.is_empty() => Ok(None),
        Some(Value::String(dir)) => Ok(Some(dir.clone())),
        Some(other) => {
            bail!("{what}: strict decoding error: patches.directory must be a string, got {other}")
        }
    }
}

/// What a file name says (`parseFilename`): `Ok(None)` for a file that is
/// ignored (with the warning), an error for a `+` without a known type.
fn parse_file_name(name: &str) -> Result<Result<(&'static str, PatchType), String>> {
    let known_extension = name
        .rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && KNOWN_EXTENSIONS.contains(&ext));
    if !known_extension {
        return Ok(Err(format!(
            "the file extension must be one of {}",
            go_list(&KNOWN_EXTENSIONS)
        )));
    }
    // `^(targets)([^.+\n]*)?(\+)?(json|merge|strategic)?`, leftmost first.
    let Some(target) = KNOWN_TARGETS.iter().find(|t| name.starts_with(*t)) else {
        return Ok(Err(format!(
            "unknown target, must be one of {}",
            go_list(&KNOWN_TARGETS)
        )));
    };
    let rest = &name[target.len()..];
    let suffix_end = rest.find(['.', '+', '\n']).unwrap_or(rest.len());
    let Some(after_plus) = rest[suffix_end..].strip_prefix('+') else {
        return Ok(Ok((target, PatchType::Strategic)));
    };
    let patch_type = PATCH_TYPES
        .iter()
        .find(|t| after_plus.starts_with(*t))
        .ok_or_else(|| {
            anyhow!(
                "unknown or missing patch type after '+', must be one of {}",
                go_list(&PATCH_TYPES)
            )
        })?;
    Ok(Ok((
        target,
        match *patch_type {
            "json" => PatchType::Json,
            "merge" => PatchType::Merge,
            _ => PatchType::Strategic,
        },
    )))
}

/// The patches of one file's text (`createPatchSet`): each YAML document
/// that is not empty, as JSON.
fn split_patches(file: &str, text: &str) -> Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| anyhow!("could not convert patch to JSON: {file}: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The files under `dir`, walked as `filepath.Walk` walks: entries in
/// lexical order, directories descended into where they stand. Symbolic
/// links are not followed into (Walk uses Lstat).
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    let mut entries = std::fs::read_dir(dir)
        .with_context(|| format!("open {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("readdir {}", dir.display()))?;
    entries.sort();
    for path in entries {
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("lstat {}", path.display()))?;
        if meta.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads the patches of `dir` (a path on the machine) as kubeadm's
/// `GetPatchManagerForPath` does, printing its lines; refuses a patch the
/// stand-in does not apply.
pub fn load(root: &Root, dir: &str) -> Result<Patches> {
    println!("[patches] Reading patches from path {dir:?}");
    let host = root.path(dir);
    let list_error =
        |e: &dyn std::fmt::Display| anyhow!("could not list patch files for path {dir:?}: {e}");
    match std::fs::symlink_metadata(&host) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(list_error(&"not a directory")),
        Err(e) => return Err(list_error(&format!("lstat {dir}: {e}"))),
    }
    let mut paths = Vec::new();
    walk(&host, &mut paths).map_err(|e| list_error(&format!("{e:#}")))?;
    let (mut sets, mut found, mut ignored) = (Vec::new(), Vec::new(), Vec::new());
    for path in paths {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (target, patch_type) =
            match parse_file_name(&name).map_err(|e| list_error(&format!("{e:#}")))? {
                Ok(parsed) => parsed,
                Err(warning) => {
                    println!("[patches] Ignoring file {name:?}: {warning}");
                    ignored.push(name);
                    continue;
                }
            };
        let data = std::fs::read(&path)
            .map_err(|e| list_error(&format!("could not read the file {:?}: {e}", path)))?;
        if data.is_empty() {
            println!("[patches] Ignoring empty file: {name:?}");
            ignored.push(name);
            continue;
        }
        let text = String::from_utf8(data)
            .map_err(|_| list_error(&format!("the file {name:?} is not UTF-8 text")))?;
        let patches = split_patches(&name, &text).map_err(|e| list_error(&format!("{e:#}")))?;
        found.push(name.clone());
        sets.push(PatchSet {
            file: name,
            target,
            patch_type,
            patches,
        });
    }
    let names = |v: &[String]| go_list(&v.iter().map(String::as_str).collect::<Vec<_>>());
    if !found.is_empty() {
        println!(
            "[patches] Found the following patch files: {}",
            names(&found)
        );
    }
    if !ignored.is_empty() {
        println!("[patches] Ignored the following files: {}", names(&ignored));
    }
    if let Some(other) = sets.iter().find(|s| s.target != KUBELET_CONFIGURATION) {
        bail!(
            "[patches] {:?} in {dir:?} patches target {:?}: the stand-in kubeadm applies only {KUBELET_CONFIGURATION:?} patches (to /var/lib/kubelet/config.yaml), not patches of static Pod manifests or CoreDNS; remove the file",
            other.file,
            other.target
        );
    }
    Ok(Patches { sets })
}

/// The patches `patches` of a config names (none without a directory).
pub fn from_config(root: &Root, patches: Option<&Value>, what: &str) -> Result<Option<Patches>> {
    directory(patches, what)?
        .map(|dir| load(root, &dir))
        .transpose()
}

/// Fails on a strategic merge patch directive anywhere in `patch`.
fn refuse_directives(patch: &Value, at: &str) -> Result<()> {
    match patch {
        Value::Object(map) => {
            for (k, v) in map {
                if k.starts_with('$') {
                    bail!("the strategic merge patch directive {k:?} at {at:?}: the stand-in kubeadm applies a strategic merge patch to the KubeletConfiguration as a JSON merge patch (the type has no patch strategies or merge keys) and interprets no directives; use a +merge or +json patch");
                }
                refuse_directives(v, &format!("{at}/{k}"))?;
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                refuse_directives(v, &format!("{at}/{i}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn apply_one(doc: &mut Value, patch_type: PatchType, patch: &Value) -> Result<()> {
    match patch_type {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| anyhow!("invalid JSON patch: {e}"))?;
            json_patch::patch(doc, &ops).map_err(|e| anyhow!("{e}"))
        }
        PatchType::Merge | PatchType::Strategic => {
            if !patch.is_object() {
                bail!("a merge patch must be a mapping, got {patch}");
            }
            if patch_type == PatchType::Strategic {
                refuse_directives(patch, "")?;
            }
            json_patch::merge(doc, patch);
            Ok(())
        }
    }
}

impl Patches {
    /// Applies the `kubeletconfiguration` patches to `doc`, in order, as
    /// `PatchManager.ApplyPatchesToTarget` does, printing a line for each.
    pub fn apply_to_kubelet_config(&self, doc: &mut Value) -> Result<()> {
        for set in self
            .sets
            .iter()
            .filter(|s| s.target == KUBELET_CONFIGURATION)
        {
            for patch in &set.patches {
                apply_one(doc, set.patch_type, patch).map_err(|e| {
                    anyhow!(
                        "could not apply patches to the KubeletConfiguration: could not apply the following patch of type {:?} to target {:?} (file {:?}):\n{patch}\n: {e:#}",
                        set.patch_type.media_type(),
                        KUBELET_CONFIGURATION,
                        set.file
                    )
                })?;
                println!(
                    "[patches] Applied patch of type {:?} to target {KUBELET_CONFIGURATION:?}",
                    set.patch_type.media_type()
                );
            }
        }
        if !doc.is_object() {
            bail!("could not apply patches to the KubeletConfiguration: the patched configuration is not a mapping: {doc}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(files: &[(&str, &str)]) -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let p = dir.path().join("etc/patches").join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let root = Root(dir.path().to_path_buf());
        (dir, root)
    }

    fn patched(files: &[(&str, &str)], doc: Value) -> Result<Value> {
        let (_dir, root) = machine(files);
        let patches = load(&root, "/etc/patches")?;
        let mut doc = doc;
        patches.apply_to_kubelet_config(&mut doc)?;
        Ok(doc)
    }

    fn base() -> Value {
        json!({"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
               "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
               "clusterDNS": ["10.96.0.10"], "authentication": {"anonymous": {"enabled": false}}})
    }

    #[test]
    fn file_names_as_kubeadm_parses_them() {
        for (name, want) in [
            (
                "kubeletconfiguration.yaml",
                ("kubeletconfiguration", PatchType::Strategic),
            ),
            (
                "kubeletconfiguration+merge.yaml",
                ("kubeletconfiguration", PatchType::Merge),
            ),
            (
                "kubeletconfiguration0+json.json",
                ("kubeletconfiguration", PatchType::Json),
            ),
            (
                "kubeletconfiguration-a+strategic.yaml",
                ("kubeletconfiguration", PatchType::Strategic),
            ),
            ("etcd.json", ("etcd", PatchType::Strategic)),
            (
                "kube-apiserver+merge.yaml",
                ("kube-apiserver", PatchType::Merge),
            ),
        ] {
            assert_eq!(parse_file_name(name).unwrap().unwrap(), want, "{name}");
        }
        // Ignored with a warning: another extension, an unknown target.
        let warned = |name: &str| parse_file_name(name).unwrap().unwrap_err();
        assert_eq!(
            warned("kubeletconfiguration+merge.yml"),
            "the file extension must be one of [json yaml]"
        );
        assert_eq!(
            warned("kubeletconfiguration.yaml.bak"),
            "the file extension must be one of [json yaml]"
        );
        assert_eq!(
            warned("README"),
            "the file extension must be one of [json yaml]"
        );
        assert_eq!(
            warned("kubelet+merge.yaml"),
            "unknown target, must be one of [etcd kube-apiserver kube-controller-manager kube-scheduler kubeletconfiguration corednsdeployment]"
        );
        // A `+` without a known type is an error.
        for name in [
            "kubeletconfiguration+.yaml",
            "kubeletconfiguration+bogus.yaml",
        ] {
            let e = parse_file_name(name).unwrap_err().to_string();
            assert_eq!(
                e, "unknown or missing patch type after '+', must be one of [json merge strategic]",
                "{name}"
            );
        }
    }

    #[test]
    fn patches_config_is_a_directory_and_nothing_else() {
        assert_eq!(directory(None, "x").unwrap(), None);
        assert_eq!(
            directory(Some(&json!({"directory": ""})), "x").unwrap(),
            None
        );
        assert_eq!(
            directory(Some(&json!({"directory": "/etc/p"})), "x")
                .unwrap()
                .as_deref(),
            Some("/etc/p")
        );
        let e = directory(
            Some(&json!({"directory": "/etc/p", "files": []})),
            "JoinConfiguration",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field \"patches.files\""), "{e}");
        assert!(e.starts_with("JoinConfiguration"), "{e}");
        assert!(directory(Some(&json!({"directory": 3})), "x").is_err());
        assert!(directory(Some(&json!("/etc/p")), "x").is_err());
    }

    #[test]
    fn merge_json_and_strategic_patches_apply_in_file_order() {
        let doc = patched(
            &[
                // Applied first (lexical order), then overridden below.
                ("kubeletconfiguration+merge.yaml", "healthzPort: 10300\nclusterDNS: null\n"),
                (
                    "kubeletconfiguration1+json.json",
                    r#"[{"op": "replace", "path": "/healthzPort", "value": 10301},
                        {"op": "add", "path": "/healthzBindAddress", "value": "127.0.0.5"}]"#,
                ),
                // Two documents, two patches; the strategic patch merges maps.
                (
                    "kubeletconfiguration2.yaml",
                    "authentication:\n  webhook:\n    enabled: true\n---\nevictionHard:\n  memory.available: 1%\n",
                ),
                // A sub-directory is walked; empty and unknown files are ignored.
                ("sub/kubeletconfiguration3+merge.yaml", "healthzPort: 10302\n"),
                ("kubeletconfiguration9+merge.yaml", ""),
                ("notes.txt", "not a patch"),
            ],
            base(),
        )
        .unwrap();
        assert_eq!(doc["healthzPort"], 10302, "{doc}");
        assert_eq!(doc["healthzBindAddress"], "127.0.0.5");
        assert!(doc.get("clusterDNS").is_none(), "null deletes: {doc}");
        assert_eq!(
            doc["authentication"],
            json!({"anonymous": {"enabled": false}, "webhook": {"enabled": true}})
        );
        assert_eq!(doc["evictionHard"]["memory.available"], "1%");
    }

    #[test]
    fn what_kubeadm_refuses_and_what_the_stand_in_does_not_apply_are_errors() {
        // A JSON patch whose test fails, or that removes what is not there.
        let failed = |files: &[(&str, &str)]| patched(files, base()).unwrap_err().to_string();
        let e = failed(&[(
            "kubeletconfiguration+json.yaml",
            "- op: test\n  path: /healthzPort\n  value: 1\n",
        )]);
        assert!(e.contains("could not apply the following patch of type \"application/json-patch+json\" to target \"kubeletconfiguration\""), "{e}");
        let e = failed(&[(
            "kubeletconfiguration+json.yaml",
            "- op: remove\n  path: /nothing\n",
        )]);
        assert!(
            e.contains("could not apply patches to the KubeletConfiguration"),
            "{e}"
        );
        let e = failed(&[(
            "kubeletconfiguration+json.yaml",
            "- op: frobnicate\n  path: /a\n",
        )]);
        assert!(e.contains("invalid JSON patch"), "{e}");
        // Strategic merge directives are not guessed at.
        for directive in [
            "$patch: replace\nhealthzPort: 1\n",
            "authentication:\n  $retainKeys: [x]\n",
            "$setElementOrder/clusterDNS: []\n",
        ] {
            let e = failed(&[("kubeletconfiguration.yaml", directive)]);
            assert!(e.contains("strategic merge patch directive"), "{e}");
            // The same as a merge patch is a plain key.
            patched(&[("kubeletconfiguration+merge.yaml", directive)], base()).unwrap();
        }
        // A patch of a static Pod or CoreDNS: not applied by the stand-in.
        let (_dir, root) = machine(&[
            ("kubeletconfiguration+merge.yaml", "healthzPort: 1\n"),
            ("kube-apiserver0+json.yaml", "[]\n"),
        ]);
        let e = load(&root, "/etc/patches").unwrap_err().to_string();
        assert!(e.contains("\"kube-apiserver0+json.yaml\""), "{e}");
        assert!(
            e.contains("applies only \"kubeletconfiguration\" patches"),
            "{e}"
        );
        // A bad file name is an error; a missing directory too.
        let (_dir, root) = machine(&[("kubeletconfiguration+xml.yaml", "a: 1\n")]);
        let e = load(&root, "/etc/patches").unwrap_err().to_string();
        assert!(e.contains("could not list patch files for path \"/etc/patches\": unknown or missing patch type"), "{e}");
        let e = load(&root, "/etc/nowhere").unwrap_err().to_string();
        assert!(
            e.starts_with("could not list patch files for path \"/etc/nowhere\""),
            "{e}"
        );
        let (_dir, root) = machine(&[("file.yaml", "a: 1\n")]);
        let e = load(&root, "/etc/patches/file.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("not a directory"), "{e}");
        // No patches at all: the document stays.
        let (_dir, root) = machine(&[]);
        std::fs::create_dir_all(root.path("/etc/patches")).unwrap();
        let mut doc = base();
        load(&root, "/etc/patches")
            .unwrap()
            .apply_to_kubelet_config(&mut doc)
            .unwrap();
        assert_eq!(doc, base());
    }
}
