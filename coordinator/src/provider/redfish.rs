//! A machine's BMC through Redfish (DMTF DSP0266): find its
//! `ComputerSystem`, read its power state, and reset it. What Drover asks
//! of a BMC is only that: a power cycle of a silent pool machine
//! (remediation) and power off or on of a free one (`drover bmc power`).
//!
//! The calls are the ones every Redfish service answers, as ironic's and
//! Metal3's Redfish drivers make them: `GET /redfish/v1/Systems` (its
//! `Members`), `GET` the system (`PowerState`, the `#ComputerSystem.Reset`
//! action's `target` and `ResetType@Redfish.AllowableValues`), and `POST`
//! the target with a `ResetType`. HTTP basic authentication, over HTTPS
//! only, trusting the Secret's `ca.crt` when it has one and this host's
//! CAs otherwise.

use std::time::Duration;

use serde::Deserialize;

/// How long one request to a BMC may take. BMCs are slow, but a reconcile
/// worker waits for the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// What a BMC's Secret gives: its credentials and, optionally, the CA of
/// its certificate.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("ca_pem", &self.ca_pem.as_ref().map(|c| c.len()))
            .finish()
    }
}

/// Why a BMC call failed. Each names the BMC and what to do.
#[derive(Debug, thiserror::Error)]
pub enum RedfishError {
    #[error("cannot build an HTTPS client for {url}: {why}")]
    Client { url: String, why: String },
    #[error("{url} did not answer: {why}")]
    Unreachable { url: String, why: String },
    #[error("{url} refused the credentials of Secret {secret} ({status}); check its username and password")]
    Unauthorized {
        url: String,
        secret: String,
        status: u16,
    },
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url} answered something that is not a Redfish {what}: {why}")]
    Malformed {
        url: String,
        what: &'static str,
        why: String,
    },
    #[error("{url} lists {count} systems ({ids}); set spec.bmc.system to one of them")]
    Ambiguous {
        url: String,
        count: usize,
        ids: String,
    },
    #[error("{url} has no system {system:?} (it lists: {ids})")]
    NoSuchSystem {
        url: String,
        system: String,
        ids: String,
    },
    #[error("{url} allows none of the resets {wanted} (it allows: {allowed})")]
    ResetNotAllowed {
        url: String,
        wanted: String,
        allowed: String,
    },
}

/// A power action Drover asks of a BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    /// Restart the machine whatever it is doing (on if it is off).
    Cycle,
    /// Turn it off: gracefully when the BMC offers that, else forced.
    Off,
    /// Turn it on.
    On,
}

impl PowerAction {
    /// The `ResetType`s that carry the action out, the preferred first,
    /// for a system whose power state is `state`.
    fn reset_types(self, state: &str) -> &'static [&'static str] {
        match (self, state) {
            (PowerAction::Cycle, "Off") | (PowerAction::On, _) => &["On", "ForceOn"],
            (PowerAction::Cycle, _) => &["ForceRestart", "PowerCycle"],
            (PowerAction::Off, _) => &["GracefulShutdown", "ForceOff"],
        }
    }
}

/// What a BMC did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerOutcome {
    /// The system's `@odata.id`.
    pub system: String,
    /// Its power state before.
    pub was: String,
    /// The `ResetType` sent (`None`: nothing needed doing).
    pub reset: Option<String>,
}

impl std::fmt::Display for PowerOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reset {
            Some(r) => write!(f, "{} {} (was {})", self.system, r, self.was),
            None => write!(f, "{} already {}", self.system, self.was),
        }
    }
}

/// One BMC, as a machine's `spec.bmc` and its Secret describe it.
pub struct Bmc {
    root: String,
    system: Option<String>,
    secret: String,
    credentials: Credentials,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Collection {
    #[serde(rename = "Members")]
    members: Vec<Link>,
}

#[derive(Deserialize)]
struct Link {
    #[serde(rename = "@odata.id")]
    id: String,
}

#[derive(Deserialize)]
struct System {
    #[serde(rename = "PowerState", default)]
    power_state: Option<String>,
    #[serde(rename = "Actions", default)]
    actions: Option<Actions>,
}

#[derive(Deserialize)]
struct Actions {
    #[serde(rename = "#ComputerSystem.Reset")]
    reset: Option<ResetAction>,
}

#[derive(Deserialize)]
struct ResetAction {
    target: String,
    #[serde(rename = "ResetType@Redfish.AllowableValues", default)]
    allowed: Option<Vec<String>>,
}

impl Bmc {
    /// A client of the BMC at `url` (`https://HOST[:PORT]`, checked by
    /// `BmcSpec::validate`), for `system` (or its only one), with the
    /// credentials of Secret `secret`.
    pub fn new(
        url: &str,
        system: Option<&str>,
        secret: &str,
        credentials: Credentials,
    ) -> Result<Self, RedfishError> {
        let root = url.trim_end_matches('/').to_owned();
        let client_error = |why: String| RedfishError::Client {
            url: root.clone(),
            why,
        };
        let http = match &credentials.ca_pem {
            Some(pem) => crate::tls::client_trusting(pem, REQUEST_TIMEOUT)
                .map_err(|e| client_error(format!("ca.crt of Secret {secret}: {e}")))?,
            None => {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| client_error(e.to_string()))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                reqwest::Client::builder()
                    .use_preconfigured_tls(tls)
                    .timeout(REQUEST_TIMEOUT)
                    .build()
                    .map_err(|e| client_error(e.to_string()))?
            }
        };
        Ok(Self {
            root,
            system: system.map(str::to_owned),
            secret: secret.to_owned(),
            credentials,
            http,
        })
    }

    /// The system's `@odata.id` and its power state.
    pub async fn power_state(&self) -> Result<(String, String), RedfishError> {
        let id = self.system_id().await?;
        let system = self.system(&id).await?;
        Ok((id, system.power_state.unwrap_or_else(|| "Unknown".into())))
    }

    /// Carries `action` out: reads the system, then sends the first
    /// `ResetType` for it that the BMC allows (nothing when the system is
    /// already off for `Off`, or on for `On`).
    pub async fn power(&self, action: PowerAction) -> Result<PowerOutcome, RedfishError> {
        let id = self.system_id().await?;
        let system = self.system(&id).await?;
        let was = system.power_state.unwrap_or_else(|| "Unknown".into());
        let settled = match action {
            PowerAction::Off => was == "Off",
            PowerAction::On => was == "On",
            PowerAction::Cycle => false,
        };
        if settled {
            return Ok(PowerOutcome {
                system: id,
                was,
                reset: None,
            });
        }
        let url = format!("{}{id}", self.root);
        let reset =
            system
                .actions
                .and_then(|a| a.reset)
                .ok_or_else(|| RedfishError::Malformed {
                    url: url.clone(),
                    what: "ComputerSystem with a #ComputerSystem.Reset action",
                    why: "no Actions.#ComputerSystem.Reset".into(),
                })?;
        let wanted = action.reset_types(&was);
        let chosen = match &reset.allowed {
            // Without a list, the standard's first choice.
            None => wanted[0],
            Some(allowed) => wanted
                .iter()
                .copied()
                .find(|w| allowed.iter().any(|a| a == w))
                .ok_or_else(|| RedfishError::ResetNotAllowed {
                    url: url.clone(),
                    wanted: wanted.join(", "),
                    allowed: allowed.join(", "),
                })?,
        };
        let target = self.absolute(&reset.target);
        let response = self
            .request(self.http.post(&target))
            .json(&serde_json::json!({ "ResetType": chosen }))
            .send()
            .await
            .map_err(|e| self.unreachable(&target, e))?;
        self.check(&target, response).await?;
        Ok(PowerOutcome {
            system: id,
            was,
            reset: Some(chosen.to_owned()),
        })
    }

    /// The system's `@odata.id`: the one named, checked against the
    /// collection, or the only member.
    async fn system_id(&self) -> Result<String, RedfishError> {
        let url = format!("{}/redfish/v1/Systems", self.root);
        let collection: Collection = self.get_json(&url, "Systems collection").await?;
        let ids: Vec<String> = collection.members.into_iter().map(|m| m.id).collect();
        let listed = || {
            ids.iter()
                .map(|i| i.rsplit('/').next().unwrap_or(i))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &self.system {
            Some(system) => ids
                .iter()
                .find(|i| i.trim_end_matches('/').rsplit('/').next() == Some(system.as_str()))
                .cloned()
                .ok_or_else(|| RedfishError::NoSuchSystem {
                    url: url.clone(),
                    system: system.clone(),
                    ids: listed(),
                }),
            None if ids.len() == 1 => Ok(ids[0].clone()),
            None => Err(RedfishError::Ambiguous {
                url: url.clone(),
                count: ids.len(),
                ids: listed(),
            }),
        }
    }

    async fn system(&self, id: &str) -> Result<System, RedfishError> {
        let url = self.absolute(id);
        self.get_json(&url, "ComputerSystem").await
    }

    fn absolute(&self, path: &str) -> String {
        if path.starts_with("https://") {
            path.to_owned()
        } else {
            format!("{}{path}", self.root)
        }
    }

    fn request(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        builder
            .basic_auth(&self.credentials.username, Some(&self.credentials.password))
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0")
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        what: &'static str,
    ) -> Result<T, RedfishError> {
        let response = self
            .request(self.http.get(url))
            .send()
            .await
            .map_err(|e| self.unreachable(url, e))?;
        let body = self.check(url, response).await?;
        serde_json::from_slice(&body).map_err(|e| RedfishError::Malformed {
            url: url.to_owned(),
            what,
            why: e.to_string(),
        })
    }

    async fn check(&self, url: &str, response: reqwest::Response) -> Result<Vec<u8>, RedfishError> {
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.unreachable(url, e))?;
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(RedfishError::Unauthorized {
                url: url.to_owned(),
                secret: self.secret.clone(),
                status: status.as_u16(),
            });
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(RedfishError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        Ok(body.to_vec())
    }

    fn unreachable(&self, url: &str, e: reqwest::Error) -> RedfishError {
        use std::error::Error;
        let mut why = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            why = format!("{why}: {s}");
            source = s.source();
        }
        RedfishError::Unreachable {
            url: url.to_owned(),
            why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_action_prefers_the_standard_reset() {
        assert_eq!(
            PowerAction::Cycle.reset_types("On"),
            ["ForceRestart", "PowerCycle"]
        );
        // A machine that is off is turned on, not restarted.
        assert_eq!(PowerAction::Cycle.reset_types("Off"), ["On", "ForceOn"]);
        assert_eq!(
            PowerAction::Off.reset_types("On"),
            ["GracefulShutdown", "ForceOff"]
        );
        assert_eq!(PowerAction::On.reset_types("Off"), ["On", "ForceOn"]);
    }

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials {
            username: "root".into(),
            password: "hunter2".into(),
            ca_pem: None,
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("root") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
