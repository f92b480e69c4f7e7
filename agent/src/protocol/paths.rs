//! The paths of the machine API.

pub const REGISTER_PATH: &str = "/v1/machine/register";
pub const HEARTBEAT_PATH: &str = "/v1/machine/heartbeat";
pub const CONFIG_PATH: &str = "/v1/machine/config";
pub const CERTIFICATE_PATH: &str = "/v1/machine/certificate";
