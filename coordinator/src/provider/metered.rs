//! A provider whose every call is counted in the metrics
//! (`drover_provider_calls_total`, `drover_provider_errors_total` by error
//! class): the reconciler, the sweeper and registration all reach the
//! providers through it.

use std::future::Future;

use drover_common::api::{Cluster, Machine};

use super::{
    Check, CloudErrorClass, CreateHost, Created, EndpointLoadBalancer, Fut, InstanceCheckError,
    Managed, Provider, ProviderError, ProviderMachine,
};

/// `inner`, its calls counted under provider `name`.
pub struct Metered<P> {
    pub name: &'static str,
    pub inner: P,
}

impl<P> Metered<P> {
    /// `call`, counted as `operation` when it ends.
    fn metered<'a, T: 'a>(
        &'a self,
        operation: &'static str,
        call: impl Future<Output = Result<T, ProviderError>> + Send + 'a,
    ) -> Fut<'a, T>
    where
        P: Sync,
    {
        Box::pin(async move {
            let r = call.await;
            crate::metrics::global().provider_call(
                self.name,
                operation,
                r.as_ref().err().map(|e| e.class().label()),
            );
            r
        })
    }
}

impl<P: Provider> Provider for Metered<P> {
    fn create<'a>(&'a self, host: &'a dyn CreateHost) -> Fut<'a, Created> {
        self.metered("create", self.inner.create(host))
    }

    fn destroy<'a>(&'a self, cluster: &'a Cluster, machine: &'a Machine) -> Fut<'a, ()> {
        self.metered("destroy", self.inner.destroy(cluster, machine))
    }

    fn delete_cluster_resources<'a>(&'a self, cluster: &'a Cluster) -> Fut<'a, ()> {
        self.metered(
            "delete_cluster_resources",
            self.inner.delete_cluster_resources(cluster),
        )
    }

    fn ensure_endpoint<'a>(
        &'a self,
        cluster: &'a Cluster,
    ) -> Fut<'a, Option<EndpointLoadBalancer>> {
        self.metered("ensure_endpoint", self.inner.ensure_endpoint(cluster))
    }

    fn set_endpoint_backends<'a>(
        &'a self,
        cluster: &'a Cluster,
        config: &'a drover_common::wire::LoadBalancerConfig,
    ) -> Fut<'a, ()> {
        self.metered(
            "set_endpoint_backends",
            self.inner.set_endpoint_backends(cluster, config),
        )
    }

    fn list(&self) -> Fut<'_, Vec<ProviderMachine>> {
        self.metered("list", self.inner.list())
    }

    fn endpoint_states(&self) -> Fut<'_, Vec<(String, super::InstanceState)>> {
        self.metered("endpoint_states", self.inner.endpoint_states())
    }

    fn managed(&self) -> Fut<'_, Vec<Managed>> {
        self.metered("managed", self.inner.managed())
    }

    fn remove_orphan<'a>(&'a self, orphan: &'a Managed) -> Fut<'a, Option<String>> {
        self.metered("remove_orphan", self.inner.remove_orphan(orphan))
    }

    fn verify_instance<'a>(&'a self, machine: &'a Machine, reported: Option<&'a str>) -> Check<'a> {
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
