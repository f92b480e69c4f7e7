//! `kubeadm token create [TOKEN]`: creates the bootstrap-token Secret through
//! the API server named by the admin kubeconfig.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use drover_common::pin::CaPin;
use drover_common::token::BootstrapToken;

use crate::certs::parse_kubeconfig;
use crate::cmd_init::{check_token_groups, check_token_usages, DEFAULT_TOKEN_GROUP};
use crate::net::{is_connect_error, status_message};
use crate::store::StoredToken;
use crate::util::{parse_go_duration_std, Root};

pub struct CreateOpts {
    pub token: Option<String>,
    pub ttl: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub description: Option<String>,
    pub usages: Vec<String>,
    pub groups: Vec<String>,
    pub print_join_command: bool,
    pub certificate_key: Option<String>,
    pub dry_run: bool,
}

pub const TOKEN_PATTERN: &str = r"\A([a-z0-9]{6})\.([a-z0-9]{16})\z";

pub async fn create(root: &Root, o: CreateOpts) -> Result<()> {
    let token: BootstrapToken = match &o.token {
        Some(t) => t.parse().map_err(|_| {
            anyhow!("the bootstrap token {t:?} was not of the form {TOKEN_PATTERN:?}")
        })?,
        None => BootstrapToken::generate(),
    };
    let ttl = match &o.ttl {
        Some(t) => parse_go_duration_std(t)
            .map_err(|e| anyhow!("invalid argument {t:?} for \"--ttl\" flag: {e}"))?,
        None => Duration::from_secs(24 * 3600),
    };
    let usages = if o.usages.is_empty() {
        vec!["signing".to_owned(), "authentication".to_owned()]
    } else {
        o.usages.clone()
    };
    check_token_usages(&usages, "usages")?;
    let groups = if o.groups.is_empty() {
        vec![DEFAULT_TOKEN_GROUP.to_owned()]
    } else {
        o.groups.clone()
    };
    check_token_groups(&groups, "groups")?;
    if !usages.iter().any(|u| u == "authentication") && !o.groups.is_empty() {
        bail!("token groups cannot be specified unless --usages includes \"authentication\"");
    }
    if o.certificate_key.is_some() && !o.print_join_command {
        bail!("the --certificate-key flag can only be used with --print-join-command");
    }
    let kubeconfig_logical = o
        .kubeconfig
        .clone()
        .unwrap_or_else(|| PathBuf::from("/etc/kubernetes/admin.conf"));
    let kubeconfig_host = root.path(&kubeconfig_logical);
    let text = std::fs::read_to_string(&kubeconfig_host).map_err(|e| {
        anyhow!(
            "failed to load admin kubeconfig: open {}: {e}",
            kubeconfig_logical.display()
        )
    })?;
    let kc = parse_kubeconfig(&text, kubeconfig_host.parent()).map_err(|e| {
        anyhow!(
            "failed to load admin kubeconfig {}: {e:#}",
            kubeconfig_logical.display()
        )
    })?;
    let ca_pem = kc.ca_pem.clone().ok_or_else(|| {
        anyhow!(
            "the kubeconfig {} holds no certificate authority",
            kubeconfig_logical.display()
        )
    })?;
    let stored = StoredToken::new(&token, Some(ttl), usages, groups, o.description.clone());

    if o.dry_run {
        eprintln!(
            "[dryrun] Would perform action CREATE on resource \"secrets\" in API group \"core/v1\""
        );
    } else {
        let client = kc.http_client(&ca_pem, Duration::from_secs(10))?;
        let secret = stored.secret_json();
        let url = format!("{}/api/v1/namespaces/kube-system/secrets", kc.server_url());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let resp = loop {
            match client.post(&url).json(&secret).send().await {
                Ok(r) => break r,
                Err(e) if is_connect_error(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    let mut msg = e.to_string();
                    let mut cur = std::error::Error::source(&e);
                    while let Some(c) = cur {
                        msg.push_str(&format!(": {c}"));
                        cur = c.source();
                    }
                    bail!("failed to create or update bootstrap token with name bootstrap-token-{}: Post {url:?}: {msg}", token.id());
                }
            }
        };
        let code = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if !code.is_success() {
            bail!(
                "failed to create or update bootstrap token with name bootstrap-token-{}: {}",
                token.id(),
                status_message(&body)
            );
        }
    }

    if o.print_join_command {
        let der = drover_common::pki::first_cert_der(&ca_pem).map_err(|e| anyhow!("{e}"))?;
        let pin = CaPin::from_cert_der(&der).map_err(|e| anyhow!("{e}"))?;
        let endpoint = kc
            .server
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let mut line =
            format!("kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {pin}");
        if let Some(k) = &o.certificate_key {
            line.push_str(&format!(" --control-plane --certificate-key {k}"));
        }
        println!("{line} ");
    } else {
        println!("{token}");
    }
    Ok(())
}
