//! The provider clients of one coordinator: the Docker engine connection,
//! the EC2 clients by region and the S3 clients of snapshot buckets, each
//! made by the provider layer on first use and kept for the coordinator's
//! life.

#[cfg(feature = "aws")]
use std::collections::{BTreeSet, HashMap};
#[cfg(feature = "aws")]
use std::sync::Mutex;

#[cfg(feature = "aws")]
use super::aws::AwsProvider;
use super::docker::{DockerEngine, DockerProvider};
use super::ProviderError;

/// The provider clients this coordinator has made, and the owner they label
/// what they create with.
///
/// Invariant: every client is built here, as `owner` (the managed-by value
/// of this installation, fixed at start), at most once per engine or
/// region, and never dropped while the coordinator runs: a region listed by
/// [`Providers::aws_regions`] stays listed, so the sweeper keeps looking
/// there after its last cluster is gone.
pub struct Providers {
    owner: String,
    /// The Docker provider, connected on first use.
    docker: tokio::sync::OnceCell<DockerProvider>,
    /// EC2 clients by region, made on first use.
    #[cfg(feature = "aws")]
    aws: Mutex<HashMap<String, AwsProvider>>,
    /// S3 clients by region and endpoint, made on first use.
    s3: super::s3::S3Clients,
}

impl Providers {
    /// No client yet; the ones made later label what they create `owner`.
    pub fn new(owner: String) -> Self {
        Self {
            owner,
            docker: Default::default(),
            #[cfg(feature = "aws")]
            aws: Default::default(),
            s3: Default::default(),
        }
    }

    /// The S3 calls of the snapshot code, through these clients.
    pub fn s3(&self) -> super::s3::S3Objects {
        super::s3::S3Objects {
            clients: self.s3.clone(),
        }
    }

    /// The Docker provider, connecting on first use.
    pub async fn docker(&self) -> Result<&DockerProvider, ProviderError> {
        self.docker
            .get_or_try_init(|| DockerProvider::connect(self.owner.clone()))
            .await
    }

    /// The Docker provider behind the [`super::Provider`] trait, over the
    /// same connection as [`Providers::docker`].
    pub fn docker_engine(&self) -> DockerEngine<'_> {
        DockerEngine::new(&self.docker, self.owner.clone())
    }

    /// Whether the Docker provider has been connected.
    pub fn docker_connected(&self) -> bool {
        self.docker.initialized()
    }

    /// The EC2 client of a region, made on first use.
    #[cfg(feature = "aws")]
    pub async fn aws(&self, region: &str) -> AwsProvider {
        if let Some(c) = self.aws.lock().expect("aws clients lock").get(region) {
            return c.clone();
        }
        let c = AwsProvider::connect(region, self.owner.clone()).await;
        self.aws
            .lock()
            .expect("aws clients lock")
            .entry(region.to_owned())
            .or_insert(c)
            .clone()
    }

    /// The regions this coordinator has made EC2 clients for.
    #[cfg(feature = "aws")]
    pub fn aws_regions(&self) -> BTreeSet<String> {
        self.aws
            .lock()
            .expect("aws clients lock")
            .keys()
            .cloned()
            .collect()
    }
}
