//! What the coordinator writes into a docker cluster's load-balancer
//! container (`drover-agent load-balancer` reads it): the control-plane
//! backends and the cluster CA to probe their `/readyz` with.

use serde::{Deserialize, Serialize};

/// Where the file goes inside the load-balancer container.
pub const LOAD_BALANCER_CONFIG_PATH: &str = "/etc/drover/load-balancer.json";

/// The load balancer's backends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerConfig {
    /// The cluster CA (PEM) the API servers' certificates chain to.
    pub ca_pem: String,
    /// The API servers as `ip:port`, in the order new connections try them.
    pub backends: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_round_trips_and_refuses_unknown_fields() {
        let c = LoadBalancerConfig {
            ca_pem: "pem".into(),
            backends: vec!["10.0.0.2:6443".into()],
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#"{"caPem":"pem","backends":["10.0.0.2:6443"]}"#);
        assert_eq!(
            serde_json::from_str::<LoadBalancerConfig>(&json).unwrap(),
            c
        );
        let err =
            serde_json::from_str::<LoadBalancerConfig>(r#"{"caPem":"","backend":[]}"#).unwrap_err();
        assert!(err.to_string().contains("backend"), "{err}");
    }
}
