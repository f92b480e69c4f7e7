//! What `drover apply -f` reads, as kubectl reads it: files, the `.yaml`,
//! `.yml` and `.json` files of a directory in name order (not its
//! subdirectories), and standard input (`-`); each split into documents on
//! `---` lines, empty ones (a lone `---`, only comments) skipped. Every
//! document is checked here, before anything is sent: it parses, it is a
//! Cluster or a Secret, it has a valid name, and a cluster's
//! `manifestsFrom` files can be read. YAML errors are told in the parser's
//! words for people, at the line of the whole file, never with the
//! library's hints to programmers.

use std::path::{Path, PathBuf};

/// The name `-f` gives standard input.
pub const STDIN: &str = "-";

/// What a document of a `-f` source cannot be.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read standard input: {0}")]
    Stdin(std::io::Error),
    #[error("standard input (-f -) can be given only once")]
    StdinTwice,
    #[error("{source_name} is not UTF-8 text")]
    NotUtf8 { source_name: String },
    #[error(
        "{} holds no .yaml, .yml or .json file (a directory's own files are read, not its subdirectories')",
        path.display()
    )]
    EmptyDirectory { path: PathBuf },
    #[error("nothing to apply: {0} hold only empty documents or comments")]
    Nothing(String),
    #[error("{at}: not valid YAML: {message}")]
    Yaml { at: String, message: String },
    #[error("{at}: the document is not a mapping of apiVersion, kind, metadata and the rest")]
    NotAMapping { at: String },
    #[error("{at}: the document has no kind; give kind: Cluster or kind: Secret")]
    NoKind { at: String },
    #[error("{at}: kind {kind:?} cannot be applied; only Cluster and Secret can")]
    UnknownKind { at: String, kind: String },
    #[error("{at}: metadata.name is missing")]
    NoName { at: String },
    #[error("{at}: metadata.name {name:?} is not a valid {kind} name ({rule})")]
    BadName {
        at: String,
        kind: Kind,
        name: String,
        rule: &'static str,
    },
    #[error("{at}: spec.addons[{index}] gives both manifests and manifestsFrom; give one")]
    BothManifests { at: String, index: usize },
    #[error("{at}: spec.addons[{index}].manifestsFrom {from:?}: cannot read {}: {source}", path.display())]
    ManifestsFrom {
        at: String,
        index: usize,
        from: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{at}: cannot write the document with its manifests: {message}")]
    Write { at: String, message: String },
}

/// Where a document came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(PathBuf),
    Stdin,
}

impl Source {
    /// The name messages give it.
    pub fn name(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Stdin => "standard input".into(),
        }
    }

    /// The directory a document's relative paths (`manifestsFrom`) are
    /// read from: the file's, or the current one for standard input.
    pub fn dir(&self) -> &Path {
        match self {
            Source::File(p) => p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
            Source::Stdin => Path::new("."),
        }
    }
}

/// One non-empty document of a source.
#[derive(Debug, Clone)]
pub struct Document {
    pub source: Source,
    /// 1-based, among the non-empty documents of its source.
    pub index: usize,
    /// Its first line in its source, 1-based.
    pub line: usize,
    /// Its text as written; sent as it is, so the coordinator's messages
    /// point to what the user wrote.
    pub text: String,
    pub value: serde_json::Value,
}

impl Document {
    /// Where it is, as messages name it: `FILE document N (line L)`.
    pub fn at(&self) -> String {
        at(&self.source, self.index, self.line)
    }

    /// The object it applies: its kind, its name and the body to send,
    /// with a cluster's `manifestsFrom` files read in.
    pub fn object(&self) -> Result<Object, DocumentError> {
        let at = self.at();
        let kind = match self.value.get("kind") {
            None | Some(serde_json::Value::Null) => {
                return Err(DocumentError::NoKind { at });
            }
            Some(serde_json::Value::String(k)) if k == "Cluster" => Kind::Cluster,
            Some(serde_json::Value::String(k)) if k == "Secret" => Kind::Secret,
            Some(serde_json::Value::String(k)) => {
                return Err(DocumentError::UnknownKind {
                    at,
                    kind: k.clone(),
                })
            }
            Some(other) => {
                return Err(DocumentError::UnknownKind {
                    at,
                    kind: other.to_string(),
                })
            }
        };
        let Some(name) = self.value["metadata"]["name"].as_str().map(str::to_owned) else {
            return Err(DocumentError::NoName { at });
        };
        let valid = match kind {
            Kind::Cluster => drover_common::names::check_dns_label("cluster name", &name).is_ok(),
            Kind::Secret => drover_common::names::check_object_name("secret name", &name).is_ok(),
        };
        if !valid {
            let rule = match kind {
                Kind::Cluster => "lowercase letters, digits and '-'",
                Kind::Secret => "lowercase letters, digits, '-' and '.'",
            };
            return Err(DocumentError::BadName {
                at,
                kind,
                name,
                rule,
            });
        }
        let body = match kind {
            Kind::Cluster => self.with_manifests_inlined()?,
            Kind::Secret => self.as_sent(),
        };
        Ok(Object {
            kind,
            name,
            body,
            at,
        })
    }

    /// The text as sent: after as many empty lines as come before it in its
    /// source, so the lines the coordinator's errors name are the file's.
    fn as_sent(&self) -> String {
        let mut out = "\n".repeat(self.line.saturating_sub(1));
        out.push_str(&self.text);
        out
    }

    /// The document with each `spec.addons[].manifestsFrom` replaced by
    /// `manifests`: the file's content, read relative to the document's
    /// directory, so the coordinator stores what was applied and never
    /// fetches anything. A document without one is sent as written.
    fn with_manifests_inlined(&self) -> Result<String, DocumentError> {
        let mut doc = self.value.clone();
        let Some(addons) = doc["spec"]["addons"].as_array_mut() else {
            return Ok(self.as_sent());
        };
        let mut changed = false;
        for (index, addon) in addons.iter_mut().enumerate() {
            let Some(from) = addon["manifestsFrom"].as_str().map(str::to_owned) else {
                continue;
            };
            if addon.get("manifests").is_some_and(|m| !m.is_null()) {
                return Err(DocumentError::BothManifests {
                    at: self.at(),
                    index,
                });
            }
            let path = self.source.dir().join(&from);
            let manifests =
                std::fs::read_to_string(&path).map_err(|source| DocumentError::ManifestsFrom {
                    at: self.at(),
                    index,
                    from: from.clone(),
                    path: path.clone(),
                    source,
                })?;
            let Some(object) = addon.as_object_mut() else {
                continue;
            };
            object.remove("manifestsFrom");
            object.insert("manifests".into(), manifests.into());
            changed = true;
        }
        if !changed {
            return Ok(self.as_sent());
        }
        serde_saphyr::to_string(&doc).map_err(|e| DocumentError::Write {
            at: self.at(),
            message: e.to_string(),
        })
    }
}

/// What `drover apply` can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cluster,
    Secret,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Cluster => "cluster",
            Kind::Secret => "secret",
        })
    }
}

/// One object to apply, checked.
#[derive(Debug, Clone)]
pub struct Object {
    pub kind: Kind,
    pub name: String,
    /// The YAML document to send.
    pub body: String,
    /// Where it was written, as [`Document::at`] says.
    pub at: String,
}

fn at(source: &Source, index: usize, line: usize) -> String {
    format!("{} document {index} (line {line})", source.name())
}

/// The documents of every `-f` source in order: each file, a directory's
/// files in name order, standard input once. At least one document.
pub fn read_all(sources: &[PathBuf]) -> Result<Vec<Document>, DocumentError> {
    let mut docs = Vec::new();
    let mut stdin_read = false;
    for s in sources {
        if s.as_os_str() == STDIN {
            if stdin_read {
                return Err(DocumentError::StdinTwice);
            }
            stdin_read = true;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .map_err(DocumentError::Stdin)?;
            docs.extend(split(Source::Stdin, bytes)?);
        } else if s.is_dir() {
            for file in directory_files(s)? {
                let bytes = read_file(&file)?;
                docs.extend(split(Source::File(file), bytes)?);
            }
        } else {
            let bytes = read_file(s)?;
            docs.extend(split(Source::File(s.clone()), bytes)?);
        }
    }
    if docs.is_empty() {
        let names: Vec<String> = sources
            .iter()
            .map(|s| {
                if s.as_os_str() == STDIN {
                    Source::Stdin.name()
                } else {
                    s.display().to_string()
                }
            })
            .collect();
        return Err(DocumentError::Nothing(names.join(", ")));
    }
    Ok(docs)
}

fn read_file(path: &Path) -> Result<Vec<u8>, DocumentError> {
    std::fs::read(path).map_err(|source| DocumentError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The `.yaml`, `.yml` and `.json` files of `dir`, sorted by name, as
/// kubectl takes them (its `FileExtensions`; no recursion without `-R`).
pub fn directory_files(dir: &Path) -> Result<Vec<PathBuf>, DocumentError> {
    let read_err = |source| DocumentError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let path = entry.map_err(read_err)?.path();
        let wanted = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if wanted && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(DocumentError::EmptyDirectory {
            path: dir.to_owned(),
        });
    }
    files.sort();
    Ok(files)
}

/// The non-empty documents of one source, parsed.
pub fn split(source: Source, bytes: Vec<u8>) -> Result<Vec<Document>, DocumentError> {
    let text = String::from_utf8(bytes).map_err(|_| DocumentError::NotUtf8 {
        source_name: source.name(),
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut docs = Vec::new();
    for (line, chunk) in chunks(text) {
        let value: serde_json::Value = serde_saphyr::from_str(&chunk).map_err(|e| {
            // Number the document as the next non-empty one: the one that
            // could not be read.
            let at = at(&source, docs.len() + 1, line);
            DocumentError::Yaml {
                at,
                message: yaml_message(&e, line),
            }
        })?;
        if value.is_null() {
            continue;
        }
        let index = docs.len() + 1;
        if !value.is_object() {
            return Err(DocumentError::NotAMapping {
                at: at(&source, index, line),
            });
        }
        docs.push(Document {
            source: source.clone(),
            index,
            line,
            text: chunk,
            value,
        });
    }
    Ok(docs)
}

/// The documents of `text` with their first lines (1-based), split as
/// kubectl's YAML reader splits: a line of `---` (alone, or followed by a
/// space and the rest of the line) starts a document and belongs to it. A
/// document of only directives (`%YAML 1.2`) goes on past the `---` that
/// ends them, as YAML has it.
fn chunks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    let mut only_directives = false;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let content = line.trim_end_matches(['\n', '\r']);
        let separator = content
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']));
        if separator && !only_directives && !current.is_empty() {
            out.push((start, std::mem::take(&mut current)));
            start = i + 1;
        }
        let trimmed = content.trim_start();
        if content.starts_with('%') {
            only_directives = true;
        } else if !(trimmed.is_empty() || trimmed.starts_with('#')) {
            only_directives = false;
        }
        current.push_str(line);
    }
    if !current.is_empty() {
        out.push((start, current));
    }
    out
}

/// A YAML error for people (see [`crate::types::yaml_error`]), at its
/// line in the whole source: the document starts at `first_line`.
pub fn yaml_message(e: &serde_saphyr::Error, first_line: usize) -> String {
    crate::types::yaml_error(e, None, first_line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(text: &str) -> Result<Vec<Document>, DocumentError> {
        split(Source::File("all.yaml".into()), text.as_bytes().to_vec())
    }

    const SECRET: &str = "apiVersion: drover.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: registry\nstringData:\n  token: x\n";
    const CLUSTER: &str = "apiVersion: drover.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: demo\nspec:\n  kubernetesVersion: v1.31.2\n";

    #[test]
    fn a_file_of_several_documents_is_split_in_order_skipping_empty_ones() {
        let text = format!(
            "# a Secret and its Cluster\n---\n{SECRET}---\n# nothing here\n---\n\n--- # the cluster\n{CLUSTER}...\n---\n"
        );
        let d = docs(&text).unwrap();
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!((d[0].index, d[0].line), (1, 2));
        assert_eq!(d[0].value["kind"], "Secret");
        assert_eq!((d[1].index, d[1].line), (2, 13));
        assert_eq!(d[1].value["kind"], "Cluster");
        assert_eq!(d[1].at(), "all.yaml document 2 (line 13)");
        let o = d[1].object().unwrap();
        assert_eq!((o.kind, o.name.as_str()), (Kind::Cluster, "demo"));
        // The text is sent as written, one document, on the lines it has
        // in the file.
        assert!(
            o.body
                .starts_with(&format!("{}--- # the cluster\n", "\n".repeat(12))),
            "{}",
            o.body
        );
        let _: serde_json::Value = serde_saphyr::from_str(&o.body).unwrap();
        // One document, CRLF and a byte-order mark as editors write them.
        let crlf = format!("\u{feff}{}", SECRET.replace('\n', "\r\n"));
        assert_eq!(docs(&crlf).unwrap().len(), 1);
        let two = format!("{SECRET}---\n{CLUSTER}").replace('\n', "\r\n");
        assert_eq!(docs(&two).unwrap().len(), 2);
        // A directive belongs to the document after it.
        let d = docs(&format!("%YAML 1.2\n---\n{SECRET}")).unwrap();
        assert_eq!((d.len(), d[0].line), (1, 1));
    }

    #[test]
    fn only_empty_documents_is_nothing_to_apply() {
        assert!(docs("---\n# only a comment\n---\n").unwrap().is_empty());
        let e = read_all(&[]).unwrap_err().to_string();
        assert!(e.contains("nothing to apply"), "{e}");
    }

    #[test]
    fn yaml_errors_name_the_document_and_the_file_line_never_the_library() {
        let text = format!("{SECRET}---\n{CLUSTER}  addons: [\n");
        let e = docs(&text).unwrap_err().to_string();
        assert!(
            e.starts_with("all.yaml document 2 (line 7): not valid YAML:") && e.contains("line 14"),
            "{e}"
        );
        let e = docs("kind: Secret\nkind: Cluster\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate mapping key `kind`"), "{e}");
        // A bare second document (after `...`): said in our words.
        let e = docs("kind: Secret\n...\nkind: Cluster\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("put a line of --- between documents"), "{e}");
        for e in [
            docs("kind: Secret\nkind: Cluster\n")
                .unwrap_err()
                .to_string(),
            docs("kind: Secret\n...\nkind: Cluster\n")
                .unwrap_err()
                .to_string(),
            docs("a: [1\n").unwrap_err().to_string(),
            docs("a: *x\n").unwrap_err().to_string(),
        ] {
            for library in [
                "from_str",
                "Options",
                "DuplicateKeyPolicy",
                "<input>",
                "-->",
            ] {
                assert!(!e.contains(library), "{library} in {e}");
            }
        }
    }

    #[test]
    fn the_coordinators_schema_errors_show_the_line_at_fault() {
        let doc = format!("{CLUSTER}  controlPlane:\n    replicas: two\n");
        let e = serde_saphyr::from_str::<drover_common::api::Cluster>(&doc).unwrap_err();
        let shown = crate::types::yaml_error(&e, Some(&doc), 1);
        assert!(
            shown.contains("at line 8") && shown.ends_with(", in \"replicas: two\""),
            "{shown}"
        );
        // A document sent from line 20 of its file is told at the file's line.
        let d = docs(&format!("{}---\n{doc}", "# x\n".repeat(18))).unwrap();
        let body = d[0].object().unwrap().body;
        let e = serde_saphyr::from_str::<drover_common::api::Cluster>(&body).unwrap_err();
        let shown = crate::types::yaml_error(&e, Some(&body), 1);
        assert!(shown.contains("at line 27"), "{shown}");
        // Never a Secret's line; never the library's hints.
        let e = serde_saphyr::from_str::<serde_json::Value>("a: 1\na: 2\n").unwrap_err();
        let shown = crate::types::yaml_error(&e, None, 1);
        assert_eq!(
            shown,
            "duplicate mapping key `a` is not allowed here at line 2, column 1"
        );
    }

    #[test]
    fn each_document_is_checked_before_any_is_sent() {
        let e = docs("kind: Pod\nmetadata: {name: x}\n").unwrap()[0]
            .object()
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "all.yaml document 1 (line 1): kind \"Pod\" cannot be applied; only Cluster and Secret can"
        );
        let e = docs(&format!(
            "{SECRET}---\nkind: Cluster\nmetadata: {{name: Demo}}\n"
        ))
        .unwrap()[1]
            .object()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("all.yaml document 2 (line 7): metadata.name \"Demo\""),
            "{e}"
        );
        let e = docs("- a\n").unwrap_err().to_string();
        assert!(e.contains("not a mapping"), "{e}");
        let e = docs("metadata: {name: x}\n").unwrap()[0]
            .object()
            .unwrap_err()
            .to_string();
        assert!(e.contains("no kind"), "{e}");
    }

    #[test]
    fn a_directory_gives_its_yaml_and_json_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.yml", "a.yaml", "c.json", "notes.txt", "d.yaml.swp"] {
            std::fs::write(dir.path().join(name), "{}").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
        let names: Vec<String> = directory_files(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.yaml", "b.yml", "c.json"]);
        let empty = tempfile::tempdir().unwrap();
        let e = directory_files(empty.path()).unwrap_err().to_string();
        assert!(e.contains("holds no .yaml, .yml or .json file"), "{e}");
    }

    #[test]
    fn manifests_from_is_read_beside_the_document() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("net.yaml"), "kind: ConfigMap\n").unwrap();
        let text = format!("{CLUSTER}  addons:\n    - name: net\n      manifestsFrom: net.yaml\n");
        let d = split(
            Source::File(dir.path().join("c.yaml")),
            text.clone().into_bytes(),
        )
        .unwrap();
        let body = d[0].object().unwrap().body;
        let v: serde_json::Value = serde_saphyr::from_str(&body).unwrap();
        assert_eq!(v["spec"]["addons"][0]["manifests"], "kind: ConfigMap\n");
        assert!(v["spec"]["addons"][0]["manifestsFrom"].is_null());
        let missing = split(
            Source::File(dir.path().join("sub/c.yaml")),
            text.into_bytes(),
        )
        .unwrap();
        let e = missing[0].object().unwrap_err().to_string();
        assert!(
            e.contains("spec.addons[0].manifestsFrom \"net.yaml\": cannot read"),
            "{e}"
        );
    }
}
