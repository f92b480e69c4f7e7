//! Types and formats shared by the Drover coordinator and agent.
//!
//! Only types from this crate cross the wire between the two binaries. The
//! crate holds no IO: everything here is pure and unit-tested, so the
//! coordinator and the agent agree on formats by construction. The one
//! system call, in `process`, raises the open-file limit at start; the one
//! exception, `tcp_proxy` (behind the `tcp-proxy` feature), is the TCP
//! load balancer both binaries run for control-plane endpoints; `tls_verify`
//! (behind the `tls` feature) is the rustls server certificate verifier the
//! agent and the stand-in kubeadm build theirs on; `test_etcd` (behind the
//! `test-etcd` feature) is what the agent's and the coordinator's tests
//! share to run a throwaway etcd.

/// Implements the OpenAPI schema, `Serialize` and `Deserialize` of a type
/// that travels as a string: its `Display` form, parsed back with `FromStr`.
/// Defined before the modules so that they may use it by name.
macro_rules! string_type_serde {
    ($ty:ty, pattern: $pattern:expr, description: $description:expr, example: $example:expr $(,)?) => {
        impl utoipa::PartialSchema for $ty {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some($pattern))
                    .description(Some($description))
                    .examples([$example])
                    .into()
            }
        }

        impl utoipa::ToSchema for $ty {}

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

// Leaves: shared primitives that import nothing of this crate.
pub mod caps;
#[cfg(feature = "cli-docs")]
pub mod cli_docs;
pub mod fsutil;
pub mod jws;
pub mod names;
pub mod pem;
pub mod process;
pub(crate) mod serde_skip;
pub mod snapshot;
#[cfg(feature = "tcp-proxy")]
pub mod tcp_proxy;
#[cfg(feature = "test-etcd")]
pub mod test_etcd;
#[cfg(feature = "tls")]
pub mod tls_verify;
pub mod token;
pub mod units;
// Certificates and their pins.
pub mod pin;
pub mod pki;
// The objects, then the machine protocol (which may use the objects, never
// the reverse), then what the admin API and the config bundle add on top.
pub mod api;
pub mod bundle;
pub mod kubeadm;
pub mod objects;
pub mod wire;

// The paths these modules had before the objects and the protocol were
// split (issue 13), kept so the coordinator and the agent need not change.
pub use objects::aws;
pub use wire::ticket;

/// The API group and version of every Drover object.
pub const API_VERSION: &str = "drover.dev/v1alpha1";

/// The response header of a list page (`GET /v1/clusters?limit=N`) that
/// carries the `continue` token of the next page; absent on the last page.
pub const CONTINUE_HEADER: &str = "drover-continue";

/// Current time as a UTC `OffsetDateTime`, in one place so tests can reason about it.
pub fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// Why a text is not a YAML stream: the parser's message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotYaml(pub String);

/// The documents of a YAML stream that are not empty, each with its place
/// in the stream (0 for the first).
pub fn yaml_documents(text: &str) -> Result<Vec<(usize, serde_json::Value)>, NotYaml> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| NotYaml(e.to_string()))?;
    Ok(docs
        .into_iter()
        .enumerate()
        .filter(|(_, doc)| !doc.is_null())
        .collect())
}
