//! What an apply changes of the files and commands a cluster puts on its
//! machines and of what goes into it (addons, the pod network's source),
//! for the audit log: anything that runs as root on every machine or as an
//! admin in the cluster is recorded with who set it and a hash of what was
//! set.

use drover_common::api::{hidden_text, Cluster, ClusterSpec, MachineFile};
use sha2::{Digest, Sha256};

/// The first 12 hex digits of the SHA-256 of `text`: enough to tell two
/// versions apart in an audit line without copying a file's content (it may
/// hold a secret) into the log.
pub fn short_hash(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..6])
}

/// One line per file or command list that differs between `old` (absent
/// for a new cluster) and `new`, such as
/// `spec.files /etc/x added (sha256 0a1b2c3d4e5f, 0644 root:root)` or
/// `spec.workerPools[gpu].preKubeadmCommands changed to 2 commands (sha256 …)`.
pub fn changes(old: Option<&ClusterSpec>, new: &ClusterSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (scope, files, pre, post) in scopes(new) {
        let before = old.and_then(|o| scopes(o).into_iter().find(|s| s.0 == scope));
        let (old_files, old_pre, old_post) = match &before {
            Some((_, f, pre, post)) => (*f, *pre, *post),
            None => (&[][..], &[][..], &[][..]),
        };
        file_changes(&scope, old_files, files, &mut out);
        for (name, was, now) in [
            ("preKubeadmCommands", old_pre, pre),
            ("postKubeadmCommands", old_post, post),
        ] {
            if was != now {
                out.push(format!(
                    "{scope}.{name} changed to {} commands (sha256 {})",
                    now.len(),
                    short_hash(&now.join("\n"))
                ));
            }
        }
    }
    addon_changes(old, new, &mut out);
    // A pool removed from the spec takes its files and commands with it.
    if let Some(old) = old {
        for (scope, files, pre, post) in scopes(old) {
            if !scopes(new).iter().any(|s| s.0 == scope)
                && (!files.is_empty() || !pre.is_empty() || !post.is_empty())
            {
                out.push(format!("{scope} removed with its files and commands"));
            }
        }
    }
    out
}

/// Addons added, changed (content, mode) or removed, and a change of the
/// pod network's source: what goes into the cluster as its admin.
fn addon_changes(old: Option<&ClusterSpec>, new: &ClusterSpec, out: &mut Vec<String>) {
    let old_addons = old.map_or(&[][..], |o| &o.addons[..]);
    for a in &new.addons {
        let hash = drover_common::api::manifests_hash(&a.manifests);
        match old_addons.iter().find(|o| o.name == a.name) {
            None => out.push(format!(
                "spec.addons {} added ({:?}, sha256 {})",
                a.name,
                a.mode,
                &hash[..12]
            )),
            Some(o) if o.manifests != a.manifests || o.mode != a.mode => out.push(format!(
                "spec.addons {} changed ({:?}, sha256 {}; was {:?}, sha256 {})",
                a.name,
                a.mode,
                &hash[..12],
                o.mode,
                &drover_common::api::manifests_hash(&o.manifests)[..12]
            )),
            Some(_) => {}
        }
    }
    for o in old_addons {
        if !new.addons.iter().any(|a| a.name == o.name) {
            out.push(format!(
                "spec.addons {} removed (what it applied stays)",
                o.name
            ));
        }
    }
    let old_cni = old.map(|o| o.network.cni).unwrap_or_default();
    if old_cni != new.network.cni {
        out.push(format!(
            "spec.network.cni changed to {:?} (was {old_cni:?})",
            new.network.cni
        ));
    }
}

/// What a viewer token is shown of a cluster: the paths, modes and owners
/// of the files it puts on machines and the Secrets they read, but in
/// place of an inline file's content, each command and each addon's
/// manifests only their size and SHA-256
/// ([`drover_common::api::hidden_text`]). Admin tokens see the spec as
/// applied.
pub fn for_viewer(mut cluster: Cluster) -> Cluster {
    fn hide(spec_files: &mut [MachineFile], pre: &mut [String], post: &mut [String]) {
        for file in spec_files {
            if let Some(content) = &mut file.content {
                *content = hidden_text(content);
            }
        }
        for command in pre.iter_mut().chain(post.iter_mut()) {
            *command = hidden_text(command);
        }
    }
    let spec = &mut cluster.spec;
    hide(
        &mut spec.files,
        &mut spec.pre_kubeadm_commands,
        &mut spec.post_kubeadm_commands,
    );
    let cp = &mut spec.control_plane;
    hide(
        &mut cp.files,
        &mut cp.pre_kubeadm_commands,
        &mut cp.post_kubeadm_commands,
    );
    for pool in &mut spec.worker_pools {
        hide(
            &mut pool.files,
            &mut pool.pre_kubeadm_commands,
            &mut pool.post_kubeadm_commands,
        );
    }
    for addon in &mut spec.addons {
        if !addon.manifests.is_empty() {
            addon.manifests = hidden_text(&addon.manifests);
        }
    }
    cluster
}

type Scope<'a> = (String, &'a [MachineFile], &'a [String], &'a [String]);

fn scopes(spec: &ClusterSpec) -> Vec<Scope<'_>> {
    let mut out: Vec<Scope<'_>> = vec![
        (
            "spec".into(),
            &spec.files,
            &spec.pre_kubeadm_commands,
            &spec.post_kubeadm_commands,
        ),
        (
            "spec.controlPlane".into(),
            &spec.control_plane.files,
            &spec.control_plane.pre_kubeadm_commands,
            &spec.control_plane.post_kubeadm_commands,
        ),
    ];
    for pool in &spec.worker_pools {
        out.push((
            format!("spec.workerPools[{}]", pool.name),
            &pool.files,
            &pool.pre_kubeadm_commands,
            &pool.post_kubeadm_commands,
        ));
    }
    out
}

fn describe(file: &MachineFile) -> String {
    format!(
        "{}, {} {}{}",
        match (&file.content, &file.content_from) {
            (Some(content), _) => format!("sha256 {}", short_hash(content)),
            (None, Some(r)) => format!("from {r}"),
            (None, None) => "no content".into(),
        },
        file.permissions.as_deref().unwrap_or("0644"),
        file.owner.as_deref().unwrap_or("root:root"),
        if file.control_plane_only {
            ", control planes only"
        } else {
            ""
        }
    )
}

fn file_changes(scope: &str, old: &[MachineFile], new: &[MachineFile], out: &mut Vec<String>) {
    for file in new {
        match old.iter().find(|o| o.path == file.path) {
            None => out.push(format!(
                "{scope}.files {} added ({})",
                file.path,
                describe(file)
            )),
            Some(was) if was != file => out.push(format!(
                "{scope}.files {} changed ({}; was {})",
                file.path,
                describe(file),
                describe(was)
            )),
            Some(_) => {}
        }
    }
    for file in old {
        if !new.iter().any(|n| n.path == file.path) {
            out.push(format!("{scope}.files {} removed", file.path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> ClusterSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const BASE: &str =
        "kubernetesVersion: v1.31.2\ncontrolPlane: {replicas: 1}\nprovider: {pool: {}}\n";

    #[test]
    fn viewers_see_sizes_and_hashes_not_text() {
        let applied = spec(&format!(
            "{BASE}files: [{{path: /etc/a, content: SECRET-A}}, {{path: /etc/b, contentFrom: {{secret: s, key: k}}}}]\n\
             preKubeadmCommands: [echo SECRET-B]\npostKubeadmCommands: [echo SECRET-C]\n\
             workerPools: [{{name: w, replicas: 1, files: [{{path: /etc/c, content: SECRET-D}}], preKubeadmCommands: [echo SECRET-E]}}]\n\
             addons: [{{name: x, manifests: \"apiVersion: v1\\nkind: ConfigMap\\nmetadata: {{name: SECRET-F}}\\n\"}}]\n"
        ));
        let cluster = Cluster {
            api_version: drover_common::API_VERSION.into(),
            kind: "Cluster".into(),
            metadata: Default::default(),
            spec: applied.clone(),
            status: Default::default(),
        };
        let shown = for_viewer(cluster);
        let text = serde_json::to_string(&shown).unwrap();
        assert!(!text.contains("SECRET-"), "{text}");
        let s = &shown.spec;
        assert_eq!(s.files[0].path, "/etc/a");
        assert_eq!(
            s.files[0].content.as_deref(),
            Some(hidden_text("SECRET-A").as_str())
        );
        assert_eq!(s.files[1].content, None);
        assert_eq!(s.files[1].content_from, applied.files[1].content_from);
        assert_eq!(s.pre_kubeadm_commands, [hidden_text("echo SECRET-B")]);
        assert_eq!(
            s.worker_pools[0].pre_kubeadm_commands,
            [hidden_text("echo SECRET-E")]
        );
        assert_eq!(
            s.addons[0].manifests,
            hidden_text(&applied.addons[0].manifests)
        );
    }

    #[test]
    fn audit_lines_name_what_changed_and_never_the_content() {
        let old = spec(&format!(
            "{BASE}files: [{{path: /etc/a, content: secret-one}}, {{path: /etc/gone, content: x}}]\n\
             workerPools: [{{name: w, replicas: 1, preKubeadmCommands: [\"true\"]}}]\n"
        ));
        let new = spec(&format!(
            "{BASE}files: [{{path: /etc/a, content: secret-two, permissions: \"0600\"}}, {{path: /etc/b, content: y, controlPlaneOnly: true}}]\n\
             postKubeadmCommands: [\"echo done\"]\n"
        ));
        let lines = changes(Some(&old), &new);
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert!(
            lines[0].starts_with("spec.files /etc/a changed (sha256 "),
            "{lines:#?}"
        );
        assert!(
            lines[0].contains("0600 root:root; was sha256 "),
            "{lines:#?}"
        );
        assert!(
            lines[1].starts_with("spec.files /etc/b added (sha256 "),
            "{lines:#?}"
        );
        assert!(lines[1].ends_with("control planes only)"), "{lines:#?}");
        assert_eq!(lines[2], "spec.files /etc/gone removed");
        assert!(lines[3].starts_with("spec.postKubeadmCommands changed to 1 commands (sha256 "));
        assert_eq!(
            lines[4],
            "spec.workerPools[w] removed with its files and commands"
        );
        assert!(lines.iter().all(|l| !l.contains("secret")), "{lines:#?}");
        assert!(changes(Some(&new), &new).is_empty());
        let with_addon = spec(&format!(
            "{BASE}addons: [{{name: net, manifests: \"apiVersion: v1\\nkind: Namespace\\nmetadata: {{name: n}}\\n\"}}]\nnetwork: {{cni: image}}\n"
        ));
        let lines = changes(Some(&spec(BASE)), &with_addon);
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].starts_with("spec.addons net added (ApplyOnce, sha256 "),
            "{lines:#?}"
        );
        assert_eq!(lines[1], "spec.network.cni changed to Image (was None)");
        assert_eq!(
            changes(Some(&with_addon), &spec(BASE)),
            [
                "spec.addons net removed (what it applied stays)",
                "spec.network.cni changed to None (was Image)"
            ]
        );
        assert_eq!(changes(None, &spec(BASE)), Vec::<String>::new());
    }
}
