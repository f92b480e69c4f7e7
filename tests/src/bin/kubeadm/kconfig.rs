//! Strict parsing of kubeadm config files, as kubeadm does it.

use anyhow::{anyhow, Result};
use drover_common::kubeadm::{parse_config, KubeadmConfig};

/// Parses a kubeadm config strictly; unknown fields and old API versions fail.
pub fn parse(text: &str) -> Result<KubeadmConfig> {
    parse_config(text).map_err(|e| anyhow!("{e}"))
}
