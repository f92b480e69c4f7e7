//! kube-proxy and CoreDNS, the addons `kubeadm init` installs (its
//! "essential addons"): the images kubeadm gives them for a Kubernetes
//! version, so that a cluster whose machines are replaced (never upgraded
//! in place with `kubeadm upgrade apply`) gets them too. Pure.
//!
//! kubeadm names kube-proxy's image `<imageRepository>/kube-proxy:<version>`
//! (`cmd/kubeadm/app/images/images.go` `GetKubernetesImage`, a `+` in the
//! version becoming `_`) and CoreDNS's `<repository>/coredns:<tag>`, the
//! repository being `dns.imageRepository` or `imageRepository`, with the
//! default `registry.k8s.io` becoming `registry.k8s.io/coredns` (the
//! image's official home), and the tag `dns.imageTag` or the CoreDNS
//! version that kubeadm release pairs with (`GetDNSImage`;
//! `cmd/kubeadm/app/constants/constants.go` `CoreDNSVersion`), kept here
//! per minor release in [`COREDNS_BY_MINOR`].

/// kubeadm's default image repository, and the CoreDNS version each
/// Kubernetes minor release pairs with: a minor missing from the table
/// leaves CoreDNS as it is (unless the cluster's ClusterConfiguration names
/// `dns.imageTag`).
pub use drover_common::kubeadm::{COREDNS_BY_MINOR, DEFAULT_IMAGE_REPOSITORY};

/// The CoreDNS version kubeadm of Kubernetes 1.`minor` deploys.
pub fn coredns_version(minor: u32) -> Option<&'static str> {
    COREDNS_BY_MINOR
        .iter()
        .find(|(m, _)| *m == minor)
        .map(|(_, v)| *v)
}

/// The images kube-proxy and CoreDNS should run for a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    pub kube_proxy: String,
    /// `None`: no CoreDNS version is known for the version's minor, and
    /// the cluster names no tag of its own.
    pub coredns: Option<String>,
}

/// Why the images of kube-proxy and CoreDNS cannot be named or set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the version {version:?} {detail}")]
    Version { version: String, detail: String },
    #[error("imageRepository {0:?} is not an image repository")]
    Repository(String),
    #[error("it has no spec.template.spec.containers")]
    NoContainers,
    #[error("it has no container named {0:?}")]
    NoContainer(String),
}

/// The images for Kubernetes `version` under the cluster's
/// `ClusterConfiguration` (as kubeadm-config holds it, parsed).
pub fn images(cluster_config: &serde_json::Value, version: &str) -> Result<Images, ImageError> {
    let parsed =
        drover_common::api::KubernetesVersion::parse(version).map_err(|e| ImageError::Version {
            version: version.to_owned(),
            detail: e.to_string(),
        })?;
    let string = |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let repository = string(&cluster_config["imageRepository"])
        .unwrap_or_else(|| DEFAULT_IMAGE_REPOSITORY.to_owned());
    if repository
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ImageError::Repository(repository));
    }
    let dns = &cluster_config["dns"];
    let mut dns_repository = string(&dns["imageRepository"]).unwrap_or(repository.clone());
    if dns_repository == DEFAULT_IMAGE_REPOSITORY {
        dns_repository.push_str("/coredns");
    }
    let tag = string(&dns["imageTag"]).or_else(|| coredns_version(parsed.minor).map(str::to_owned));
    Ok(Images {
        kube_proxy: format!("{repository}/kube-proxy:{}", version.replace('+', "_")),
        coredns: tag.map(|tag| format!("{dns_repository}/coredns:{tag}")),
    })
}

/// Sets the image of container `container` of a workload (a DaemonSet or
/// Deployment as read) to `image`; the image it had, or why it cannot.
pub fn set_image(
    workload: &mut serde_json::Value,
    container: &str,
    image: &str,
) -> Result<String, ImageError> {
    let containers = workload["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .ok_or(ImageError::NoContainers)?;
    let c = containers
        .iter_mut()
        .find(|c| c["name"] == container)
        .ok_or_else(|| ImageError::NoContainer(container.to_owned()))?;
    let was = c["image"].as_str().unwrap_or_default().to_owned();
    c["image"] = serde_json::Value::String(image.to_owned());
    Ok(was)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn images_are_kubeadms_for_the_version_and_repository() {
        let i = images(&json!({"kubernetesVersion": "v1.31.2"}), "v1.32.0").unwrap();
        assert_eq!(
            i,
            Images {
                kube_proxy: "registry.k8s.io/kube-proxy:v1.32.0".into(),
                coredns: Some("registry.k8s.io/coredns/coredns:v1.11.3".into()),
            }
        );
        let i = images(&json!({}), "v1.33.1+k3s1").unwrap();
        assert_eq!(i.kube_proxy, "registry.k8s.io/kube-proxy:v1.33.1_k3s1");
        assert_eq!(
            i.coredns.as_deref(),
            Some("registry.k8s.io/coredns/coredns:v1.12.0")
        );
        // A mirror holds both; a DNS override wins.
        let mirror = json!({"imageRepository": "mirror.example/k8s"});
        let i = images(&mirror, "v1.31.2").unwrap();
        assert_eq!(i.kube_proxy, "mirror.example/k8s/kube-proxy:v1.31.2");
        assert_eq!(
            i.coredns.as_deref(),
            Some("mirror.example/k8s/coredns:v1.11.3")
        );
        let own = json!({"dns": {"imageRepository": "dns.example", "imageTag": "v9.0.0"}});
        assert_eq!(
            images(&own, "v1.31.2").unwrap().coredns.as_deref(),
            Some("dns.example/coredns:v9.0.0")
        );
        // An unknown minor leaves CoreDNS alone.
        assert_eq!(images(&json!({}), "v1.99.0").unwrap().coredns, None);
        assert!(images(&json!({}), "1.31").is_err());
    }

    #[test]
    fn set_image_changes_only_the_named_container() {
        let mut ds = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "image": "s:1"},
            {"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.31.2",
             "command": ["/usr/local/bin/kube-proxy"]}]}}}});
        let was = set_image(&mut ds, "kube-proxy", "registry.k8s.io/kube-proxy:v1.32.0").unwrap();
        assert_eq!(was, "registry.k8s.io/kube-proxy:v1.31.2");
        let c = &ds["spec"]["template"]["spec"]["containers"];
        assert_eq!(c[0]["image"], "s:1");
        assert_eq!(c[1]["image"], "registry.k8s.io/kube-proxy:v1.32.0");
        assert_eq!(c[1]["command"][0], "/usr/local/bin/kube-proxy");
        assert!(set_image(&mut ds, "coredns", "x").is_err());
        assert!(set_image(&mut json!({}), "coredns", "x").is_err());
    }
}
