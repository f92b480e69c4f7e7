//! A provider whose every call is counted in the metrics
//! (`drover_provider_calls_total`, `drover_provider_errors_total` by error
//! class): the reconciler, the sweeper and registration all reach the
//! providers through it.

use drover_common::api::{Cluster, Machine};
use futures_util::future::BoxFuture;

use super::{
    CloudErrorClass, CreateHost, Created, EndpointLoadBalancer, InstanceCheckError, Managed,
    Provider, ProviderError, ProviderMachine,
};

/// `inner`, its calls counted under provider `name`.
pub struct Metered<P> {
    pub name: &'static str,
    pub inner: P,
}

impl<P> Metered<P> {
    fn count<T>(
        &self,
        operation: &'static str,
        r: Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        crate::metrics::global().provider_call(
            self.name,
            operation,
            r.as_ref().err().map(|e| e.class().label()),
        );
        r
    }
}

impl<P: Provider> Provider for Metered<P> {
    fn create<'a>(
        &'a self,
        cluster: &'a Cluster,
        machine: &'a Machine,
        host: &'a dyn CreateHost,
    ) -> BoxFuture<'a, Result<Created, ProviderError>> {
        Box::pin(async move {
            let r = self.inner.create(cluster, machine, host).await;
            self.count("create", r)
        })
    }

    fn destroy<'a>(
        &'a self,
        cluster: &'a Cluster,
        machine: &'a Machine,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let r = self.inner.destroy(cluster, machine).await;
            self.count("destroy", r)
        })
    }

    fn delete_cluster_resources<'a>(
        &'a self,
        cluster: &'a Cluster,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let r = self.inner.delete_cluster_resources(cluster).await;
            self.count("delete_cluster_resources", r)
        })
    }

    fn ensure_endpoint<'a>(
        &'a self,
        cluster: &'a Cluster,
    ) -> BoxFuture<'a, Result<Option<EndpointLoadBalancer>, ProviderError>> {
        Box::pin(async move {
            let r = self.inner.ensure_endpoint(cluster).await;
            self.count("ensure_endpoint", r)
        })
    }

    fn set_endpoint_backends<'a>(
        &'a self,
        cluster: &'a Cluster,
        config: &'a drover_common::wire::LoadBalancerConfig,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let r = self.inner.set_endpoint_backends(cluster, config).await;
            self.count("set_endpoint_backends", r)
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ProviderMachine>, ProviderError>> {
        Box::pin(async move {
            let r = self.inner.list().await;
            self.count("list", r)
        })
    }

    fn endpoint_states(
        &self,
    ) -> BoxFuture<'_, Result<Vec<(String, super::InstanceState)>, ProviderError>> {
        Box::pin(async move {
            let r = self.inner.endpoint_states().await;
            self.count("endpoint_states", r)
        })
    }

    fn managed(&self) -> BoxFuture<'_, Result<Vec<Managed>, ProviderError>> {
        Box::pin(async move {
            let r = self.inner.managed().await;
            self.count("managed", r)
        })
    }

    fn remove_orphan<'a>(
        &'a self,
        orphan: &'a Managed,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async move {
            let r = self.inner.remove_orphan(orphan).await;
            self.count("remove_orphan", r)
        })
    }

    fn verify_instance<'a>(
        &'a self,
        machine: &'a Machine,
        reported: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), InstanceCheckError>> {
        Box::pin(async move {
            let r = self.inner.verify_instance(machine, reported).await;
            let class = match &r {
                Ok(()) => None,
                Err(InstanceCheckError::Refused(_)) => Some("refused"),
                Err(InstanceCheckError::Unavailable(_)) => Some(CloudErrorClass::Transient.label()),
            };
            crate::metrics::global().provider_call(self.name, "verify_instance", class);
            r
        })
    }
}
