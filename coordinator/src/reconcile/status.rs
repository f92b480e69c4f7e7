//! What a background loop reports about itself on `/v1/status`.

/// What the reconcile loop reports about itself.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoopStatus {
    /// The loop's name, such as `cluster-reconciler`.
    pub name: String,
    /// Passes completed since the coordinator started.
    pub runs: u64,
    /// How long the last pass took.
    pub last_run_millis: u64,
    /// What went wrong in the last pass, each naming its object.
    pub last_errors: Vec<String>,
}
