//! A drill cluster's inventory, on the coordinator's directive
//! (`TakeInventory`): what the restored control plane holds, read through
//! its API server (the namespaces it lists, which proves it answers with
//! the restored data) and through its etcd member (every key under
//! `/registry/`, counted by resource, keys only), then reported to the
//! coordinator before the directive's result.

use drover_common::api::Inventory;
use drover_common::wire::InventoryReport;

use crate::api::{ApiError, CoordinatorClient};
use crate::etcd::{Etcd, EtcdError};
use crate::kube::{Kube, KubeError};

/// Why the inventory was not taken.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("the API server does not answer with the restored data: {0}")]
    Api(#[from] KubeError),
    #[error("etcd cannot be counted: {0}")]
    Etcd(#[from] EtcdError),
    #[error("cannot report the inventory to the coordinator: {0}")]
    Coordinator(#[from] ApiError),
}

/// Reads the inventory through the API server at `api` and the etcd member
/// at `endpoint`.
pub async fn take(
    kube: &mut Kube,
    etcd: &mut Etcd,
    api: &str,
    endpoint: &str,
) -> Result<Inventory, InventoryError> {
    let namespaces = kube.namespaces(api).await?;
    let count = etcd.count_objects(endpoint).await?;
    Ok(Inventory {
        namespaces,
        objects: count.objects,
        total: count.total,
        revision: count.revision,
    })
}

/// Takes the inventory for directive `id` and reports it; what was found.
pub async fn take_and_report(
    coordinator: &CoordinatorClient,
    kube: &mut Kube,
    etcd: &mut Etcd,
    api: &str,
    endpoint: &str,
    id: String,
) -> Result<String, InventoryError> {
    let inventory = take(kube, etcd, api, endpoint).await?;
    let summary = inventory.summary();
    coordinator
        .inventory(&InventoryReport { id, inventory })
        .await?;
    Ok(format!("inventory taken and reported: {summary}"))
}
