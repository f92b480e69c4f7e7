//! A machine's BMC as the coordinator reaches it: its `spec.bmc` and the
//! Secret with its credentials, opened only here, for the one call.
//! Power cycles (remediation), power off and on (`drover bmc power`) and
//! the check when an admin sets a BMC all come through [`connect`].

use drover_common::api::{BmcSpec, BMC_CA_KEY, BMC_PASSWORD_KEY, BMC_USERNAME_KEY};

use crate::provider::redfish::{Bmc, Credentials, RedfishError};
use crate::store::{Store, StoreError};

/// Why a machine's BMC cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    #[error("machine {0} has no BMC; set one with `drover bmc set {0} --url ... --credentials-secret ...`")]
    None(String),
    #[error("Secret {secret} (the BMC's credentials) does not exist; apply it with keys {BMC_USERNAME_KEY} and {BMC_PASSWORD_KEY}")]
    MissingSecret { secret: String },
    #[error("Secret {secret} (the BMC's credentials) has no key {key} (it has: {keys})")]
    MissingKey {
        secret: String,
        key: &'static str,
        keys: String,
    },
    #[error("key {key} of Secret {secret} is not UTF-8 text")]
    NotText { secret: String, key: &'static str },
    #[error(transparent)]
    Redfish(#[from] RedfishError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The credentials Secret `name` holds, checked: `username` and
/// `password` as text, `ca.crt` when present.
pub fn credentials(store: &Store, name: &str) -> Result<Credentials, BmcError> {
    let (secret, _) =
        super::user_secrets::get(store, name)?.ok_or_else(|| BmcError::MissingSecret {
            secret: name.to_owned(),
        })?;
    let mut values = secret.values()?;
    let keys = values.keys().cloned().collect::<Vec<_>>().join(", ");
    let mut text = |key: &'static str| -> Result<String, BmcError> {
        let value = values.remove(key).ok_or_else(|| BmcError::MissingKey {
            secret: name.to_owned(),
            key,
            keys: keys.clone(),
        })?;
        String::from_utf8(value).map_err(|_| BmcError::NotText {
            secret: name.to_owned(),
            key,
        })
    };
    let username = text(BMC_USERNAME_KEY)?;
    let password = text(BMC_PASSWORD_KEY)?;
    Ok(Credentials {
        username,
        password,
        ca_pem: values.remove(BMC_CA_KEY),
    })
}

/// A client of the BMC `spec` names, its credentials read from the store.
pub fn connect(store: &Store, spec: &BmcSpec) -> Result<Bmc, BmcError> {
    let credentials = credentials(store, &spec.credentials_secret)?;
    Ok(Bmc::new(
        &spec.url,
        spec.system.as_deref(),
        &spec.credentials_secret,
        credentials,
    )?)
}
