//! Writing the files of a config bundle under the agent's root.
//!
//! A bundle may carry only the files kubeadm needs: the kubeadm config
//! (`/etc/drover/kubeadm.yaml`), the kubelet configuration patch its
//! `patches.directory` names (`/etc/drover/kubeadm-patches/`), and the
//! shared cluster CA set under `/etc/kubernetes/pki/` ([`ALLOWED_FILES`]). Any other path is refused
//! before anything is written, and the mode of each file is the agent's
//! choice, not the bundle's: private keys and the kubeadm config (it holds
//! a join token) 0600, certificates and public keys 0644. So even a bundle
//! signed with a stolen coordinator CA key cannot plant a cron job, an SSH
//! key or a binary the agent later runs.
//!
//! Bundle paths are absolute machine paths. They are joined under the root
//! only when every component is a plain name, so a bundle cannot escape the
//! root with `..`. Files are written atomically (temporary file in the same
//! directory, fsync, rename), so kubeadm never reads half a file.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use drover_common::bundle::BundleFile;
use drover_common::objects::customise::{check_file_content, parse_owner, CustomiseError};
use drover_common::objects::MachineFileContent;

/// Where the agent writes the kubeadm config it runs kubeadm with.
pub const KUBEADM_CONFIG_PATH: &str = "/etc/drover/kubeadm.yaml";

/// The only files a bundle may carry, each with the mode the agent gives it.
pub const ALLOWED_FILES: &[(&str, u32)] = &[
    (KUBEADM_CONFIG_PATH, 0o600),
    (drover_common::kubeadm::KUBELET_CONFIG_PATCH_FILE, 0o644),
    ("/etc/kubernetes/pki/ca.crt", 0o644),
    ("/etc/kubernetes/pki/ca.key", 0o600),
    ("/etc/kubernetes/pki/front-proxy-ca.crt", 0o644),
    ("/etc/kubernetes/pki/front-proxy-ca.key", 0o600),
    ("/etc/kubernetes/pki/etcd/ca.crt", 0o644),
    ("/etc/kubernetes/pki/etcd/ca.key", 0o600),
    ("/etc/kubernetes/pki/sa.key", 0o600),
    ("/etc/kubernetes/pki/sa.pub", 0o644),
];

/// The mode the agent gives an allowed bundle file, or why it is refused.
pub fn allowed_mode(path: &str) -> Result<u32, PathError> {
    ALLOWED_FILES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, mode)| *mode)
        .ok_or_else(|| PathError::NotAllowed(path.to_owned()))
}

/// Why a bundle path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("bundle path {0:?} is refused: a bundle may carry only the kubeadm config (/etc/drover/kubeadm.yaml), its kubelet configuration patch (/etc/drover/kubeadm-patches/) and the shared CA files under /etc/kubernetes/pki/; nothing was written")]
    NotAllowed(String),
    #[error("bundle path {0:?} is not absolute")]
    NotAbsolute(String),
    #[error("bundle path {0:?} contains a `..` component")]
    ParentComponent(String),
    #[error("bundle path {0:?} names no file")]
    NoFileName(String),
    #[error("bundle path {0:?} contains a NUL byte")]
    Nul(String),
}

/// Why a bundle file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(
        "bundle file {path} has mode {mode:#o}; only permission bits (at most 0o777) are allowed"
    )]
    Mode { path: String, mode: u32 },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("machine file {path} is refused: {source}; nothing was written")]
    Refused {
        path: String,
        source: CustomiseError,
    },
    #[error("machine file {path}: owner {owner:?} {why}")]
    Owner {
        path: String,
        owner: String,
        why: String,
    },
    #[error("spec.network.cni is image, but the node image has no CNI config in {path}: {detail}; use an image that ships one, or cni: none with a network addon or file")]
    ImageCni { path: PathBuf, detail: String },
    #[error("cannot give {path} the owner {uid}:{gid}: {source}")]
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
        source: io::Error,
    },
}

/// Joins an absolute bundle path under `root`, refusing relative paths and
/// `..` components.
pub fn safe_join(root: &Path, path: &str) -> Result<PathBuf, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul(path.to_owned()));
    }
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute(path.to_owned()));
    }
    let mut out = root.to_path_buf();
    let mut named = false;
    for component in Path::new(path).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => {
                out.push(name);
                named = true;
            }
            Component::ParentDir => return Err(PathError::ParentComponent(path.to_owned())),
            Component::Prefix(_) => return Err(PathError::NotAbsolute(path.to_owned())),
        }
    }
    if !named || path.ends_with('/') {
        return Err(PathError::NoFileName(path.to_owned()));
    }
    Ok(out)
}

pub use drover_common::fsutil::write_atomic;

/// Writes every bundle file under `root`. All paths are checked against
/// [`ALLOWED_FILES`] before anything is written; each file gets the mode the
/// agent decides for its path, whatever the bundle says. Returns the bundle
/// paths written.
pub fn write_bundle_files(root: &Path, files: &[BundleFile]) -> Result<Vec<String>, FileError> {
    let mut targets = Vec::with_capacity(files.len());
    for file in files {
        if file.mode > 0o777 {
            return Err(FileError::Mode {
                path: file.path.clone(),
                mode: file.mode,
            });
        }
        let mode = allowed_mode(&file.path)?;
        targets.push((safe_join(root, &file.path)?, mode));
    }
    let mut written = Vec::with_capacity(files.len());
    for (file, (target, mode)) in files.iter().zip(targets) {
        if file.mode != mode {
            tracing::debug!(path = %file.path, bundle_mode = format!("{:#o}", file.mode), mode = format!("{mode:#o}"), "bundle file written with the agent's mode, not the bundle's");
        }
        write_atomic(&target, file.content.as_bytes(), mode).map_err(|source| {
            FileError::Write {
                path: target.clone(),
                source,
            }
        })?;
        written.push(file.path.clone());
    }
    Ok(written)
}

/// Writes the files a cluster's spec puts on this machine under `root`,
/// each atomically with the mode and owner the bundle gives. Every file is
/// checked against the machine-file rules (no reserved path, no `..`) and
/// its owner resolved in the machine's own `/etc/passwd` and `/etc/group`
/// before anything is written. Returns the paths written.
pub fn write_machine_files(
    root: &Path,
    files: &[MachineFileContent],
) -> Result<Vec<String>, FileError> {
    let targets = check_machine_files(root, files)?;
    let mut written = Vec::with_capacity(files.len());
    for (file, (target, uid, gid)) in files.iter().zip(targets) {
        write_atomic(&target, file.content.as_bytes(), file.mode).map_err(|source| {
            FileError::Write {
                path: target.clone(),
                source,
            }
        })?;
        let owned = fs::metadata(&target).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid() == uid && m.gid() == gid
        });
        if !owned {
            std::os::unix::fs::chown(&target, Some(uid), Some(gid)).map_err(|source| {
                FileError::Chown {
                    path: target.clone(),
                    uid,
                    gid,
                    source,
                }
            })?;
        }
        written.push(file.path.clone());
    }
    Ok(written)
}

/// Sets up the node image's pod network (`spec.network.cni: image`): checks
/// the image's CNI config template (`<root>/usr/share/drover/cni/net.d`)
/// and writes the marker that starts the agent's pod network loop
/// ([`crate::podnet`]), which writes `/etc/cni/net.d`'s config once the
/// Node has its pod range. Returns the paths written; an image without a
/// usable template is an error saying so.
pub fn install_image_cni(root: &Path) -> Result<Vec<String>, FileError> {
    let source_path = format!("{}/net.d", drover_common::api::IMAGE_CNI_DIR);
    let source = safe_join(root, &source_path)?;
    let missing = |e: crate::podnet::ConfigError| FileError::ImageCni {
        path: source.clone(),
        detail: e.to_string(),
    };
    let (_, template) = crate::podnet::template(root).map_err(&missing)?;
    let probe = "10.244.0.0/24".parse().expect("a CIDR");
    crate::podnet::conflist(&template, probe).map_err(&missing)?;
    let path = format!("/{}", crate::podnet::MARKER);
    let target = safe_join(root, &path)?;
    write_atomic(&target, b"spec.network.cni: image\n", 0o644).map_err(|source| {
        FileError::Write {
            path: target.clone(),
            source,
        }
    })?;
    Ok(vec![path])
}

/// Checks every machine file (path rules, owner known on this machine)
/// without writing anything; returns where each goes and its owner's ids.
pub fn check_machine_files(
    root: &Path,
    files: &[MachineFileContent],
) -> Result<Vec<(PathBuf, u32, u32)>, FileError> {
    files
        .iter()
        .map(|file| {
            check_file_content(file).map_err(|source| FileError::Refused {
                path: file.path.clone(),
                source,
            })?;
            let (uid, gid) = resolve_owner(root, &file.owner).map_err(|why| FileError::Owner {
                path: file.path.clone(),
                owner: file.owner.clone(),
                why,
            })?;
            Ok((safe_join(root, &file.path)?, uid, gid))
        })
        .collect()
}

/// `user[:group]` as numeric ids, names looked up in `root`'s
/// `/etc/passwd` and `/etc/group`; a user without a group gets its primary
/// group. `root` is 0 even where no passwd file exists.
pub fn resolve_owner(root: &Path, owner: &str) -> Result<(u32, u32), String> {
    let (user, group) = parse_owner(owner).map_err(|e| e.to_string())?;
    let passwd = || fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let (uid, primary) = if let Ok(uid) = user.parse::<u32>() {
        (uid, None)
    } else if user == "root" {
        (0, Some(0))
    } else {
        passwd()
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 4 && f[0] == user)
            .and_then(|f| Some((f[2].parse().ok()?, Some(f[3].parse().ok()?))))
            .ok_or_else(|| format!("names user {user:?}, which is not in the machine's /etc/passwd; give a numeric id or a user the machine image has"))?
    };
    let gid = match group {
        Some(g) => {
            if let Ok(gid) = g.parse::<u32>() {
                gid
            } else if g == "root" {
                0
            } else {
                fs::read_to_string(root.join("etc/group"))
                    .unwrap_or_default()
                    .lines()
                    .map(|l| l.split(':').collect::<Vec<_>>())
                    .find(|f| f.len() >= 3 && f[0] == g)
                    .and_then(|f| f[2].parse().ok())
                    .ok_or_else(|| format!("names group {g:?}, which is not in the machine's /etc/group; give a numeric id or a group the machine image has"))?
            }
        }
        None => primary.unwrap_or(uid),
    };
    Ok((uid, gid))
}

/// Removes bundle files again (those that still exist). Returns the paths
/// that could not be removed, with the reason.
pub fn remove_bundle_files(root: &Path, paths: &[String]) -> Vec<String> {
    remove_under(root, paths.iter().map(String::as_str), |p| {
        fs::remove_file(p)
    })
}

/// Removes each of `paths` under `root` with `remove`; what is already gone
/// is no problem. Returns what could not be removed, with why.
fn remove_under<'a>(
    root: &Path,
    paths: impl IntoIterator<Item = &'a str>,
    remove: impl Fn(&Path) -> io::Result<()>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for path in paths {
        match safe_join(root, path) {
            Ok(target) => match remove(&target) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => problems.push(format!("{}: {e}", target.display())),
            },
            Err(e) => problems.push(e.to_string()),
        }
    }
    problems
}

/// What `kubeadm reset` leaves on a machine by design (its output says so)
/// and a machine going back to its pool must not keep: the CNI
/// configuration and the kubeconfig copied to root's home. A machine reused
/// in another cluster inherits nothing of them.
pub const LEFT_BY_RESET: &[&str] = &["/etc/cni/net.d", "/root/.kube"];

/// Everything a machine going back to its pool must not keep after
/// `kubeadm reset`: [`LEFT_BY_RESET`] and, on a real root, the rules
/// kube-proxy wrote into the kernel (see `netfilter`). Kernel state is the
/// host's, so an agent under another root (the tests' machines sharing one
/// host) leaves it alone. Returns what could not be removed, with why.
pub fn clean_after_reset(root: &Path) -> Vec<String> {
    let mut problems = remove_left_by_reset(root);
    if root == Path::new("/") {
        problems.extend(crate::netfilter::remove_kube_proxy_rules());
    }
    problems
}

/// Removes [`LEFT_BY_RESET`] under `root`; returns what could not be
/// removed, with why.
pub fn remove_left_by_reset(root: &Path) -> Vec<String> {
    remove_under(root, LEFT_BY_RESET.iter().copied(), |p| {
        fs::remove_dir_all(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn what_reset_leaves_is_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for f in [
            "etc/cni/net.d/10-flannel.conflist",
            "root/.kube/config",
            "etc/cni/keep",
            "root/keep",
        ] {
            let p = root.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, "x").unwrap();
        }
        assert!(remove_left_by_reset(root).is_empty());
        assert!(!root.join("etc/cni/net.d").exists());
        assert!(!root.join("root/.kube").exists());
        assert!(root.join("etc/cni/keep").exists() && root.join("root/keep").exists());
        // Already clean: nothing to report.
        assert!(remove_left_by_reset(root).is_empty());
    }

    #[test]
    fn safe_join_rules() {
        let root = Path::new("/srv/root");
        assert_eq!(
            safe_join(root, "/etc/drover/kubeadm.yaml").unwrap(),
            PathBuf::from("/srv/root/etc/drover/kubeadm.yaml")
        );
        assert_eq!(
            safe_join(root, "/etc/./kubernetes//pki/ca.crt").unwrap(),
            PathBuf::from("/srv/root/etc/kubernetes/pki/ca.crt")
        );
        assert_eq!(
            safe_join(Path::new("/"), "/etc/x").unwrap(),
            PathBuf::from("/etc/x")
        );
        type Refusal = fn(String) -> PathError;
        let refused: [(&str, Refusal); 4] = [
            ("etc/x", PathError::NotAbsolute),
            ("../etc/x", PathError::NotAbsolute),
            ("/etc/../../x", PathError::ParentComponent),
            ("/etc/kubernetes/..", PathError::ParentComponent),
        ];
        for (path, error) in refused {
            assert_eq!(safe_join(root, path), Err(error(path.into())), "{path}");
        }
        assert!(matches!(
            safe_join(root, "/"),
            Err(PathError::NoFileName(_))
        ));
        assert!(matches!(
            safe_join(root, "/etc/"),
            Err(PathError::NoFileName(_))
        ));
        assert!(matches!(
            safe_join(root, ""),
            Err(PathError::NotAbsolute(_))
        ));
        assert!(matches!(safe_join(root, "/a\0b"), Err(PathError::Nul(_))));
    }

    #[test]
    fn writes_files_with_modes_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let file = |path: &str, mode| BundleFile {
            path: path.into(),
            mode,
            content: format!("content of {path}"),
        };
        let written = write_bundle_files(
            dir.path(),
            &[
                file("/etc/drover/kubeadm.yaml", 0o600),
                file("/etc/kubernetes/pki/ca.crt", 0o644),
            ],
        )
        .unwrap();
        assert_eq!(written.len(), 2);
        let cfg = dir.path().join("etc/drover/kubeadm.yaml");
        assert_eq!(
            fs::read_to_string(&cfg).unwrap(),
            "content of /etc/drover/kubeadm.yaml"
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&cfg), 0o600);
        assert_eq!(mode(&dir.path().join("etc/kubernetes/pki/ca.crt")), 0o644);
        // Overwriting changes the content; the mode stays the agent's
        // choice whatever the bundle says; no temporary file remains.
        write_bundle_files(dir.path(), &[file("/etc/drover/kubeadm.yaml", 0o777)]).unwrap();
        assert_eq!(mode(&cfg), 0o600);
        write_bundle_files(dir.path(), &[file("/etc/kubernetes/pki/ca.key", 0o644)]).unwrap();
        assert_eq!(mode(&dir.path().join("etc/kubernetes/pki/ca.key")), 0o600);
        std::fs::remove_file(dir.path().join("etc/kubernetes/pki/ca.key")).unwrap();
        assert_eq!(
            fs::read_dir(dir.path().join("etc/drover")).unwrap().count(),
            1
        );
        // The kubelet configuration patch the kubeadm config names is
        // readable, as kubeadm's own files are.
        let patch = drover_common::kubeadm::KUBELET_CONFIG_PATCH_FILE;
        write_bundle_files(dir.path(), &[file(patch, 0o600)]).unwrap();
        let patch_path = safe_join(dir.path(), patch).unwrap();
        assert_eq!(mode(&patch_path), 0o644);
        assert_eq!(
            fs::read_to_string(&patch_path).unwrap(),
            format!("content of {patch}")
        );
        std::fs::remove_dir_all(dir.path().join("etc/drover/kubeadm-patches")).unwrap();

        // A path kubeadm does not need, anywhere, means nothing is written,
        // and the refusal names it.
        for evil in [
            "/etc/cron.d/drover",
            "/root/.ssh/authorized_keys",
            "/usr/bin/kubeadm",
            "/etc/kubernetes/pki/apiserver.key",
            "/etc/drover/../cron.d/x",
            "/etc/drover/kubeadm.yaml/x",
            "/etc/kubernetes/pki//ca.crt",
            // Only the kubelet configuration patch: a patch of a static
            // Pod (the API server's flags) is no bundle's business.
            "/etc/drover/kubeadm-patches/kube-apiserver+merge.yaml",
            "/etc/drover/kubeadm-patches/kubeletconfiguration+json.yaml",
        ] {
            let err = write_bundle_files(
                dir.path(),
                &[file("/etc/kubernetes/pki/sa.pub", 0o644), file(evil, 0o777)],
            )
            .unwrap_err();
            assert!(err.to_string().contains(evil), "{err}");
            assert!(
                matches!(err, FileError::Path(PathError::NotAllowed(_))),
                "{err}"
            );
        }
        assert!(!dir.path().join("etc/kubernetes/pki/sa.pub").exists());
        assert!(!dir.path().join("etc/cron.d").exists());
        assert!(!dir.path().join("usr").exists());
        assert!(matches!(
            write_bundle_files(dir.path(), &[file("/etc/kubernetes/pki/ca.crt", 0o4755)]),
            Err(FileError::Mode { .. })
        ));

        assert!(remove_bundle_files(dir.path(), &written).is_empty());
        assert!(!cfg.exists());
        // Removing again is fine.
        assert!(remove_bundle_files(dir.path(), &written).is_empty());
    }
}
