//! S3 snapshot destinations in a build without the `aws` feature: every
//! call fails saying so (`provider/s3.rs` is the real one).

use std::path::Path;

use drover_common::api::S3Object;

pub use super::S3Error;

/// No S3 client is ever made in this build.
#[derive(Debug, Clone, Default)]
pub struct S3Clients;

/// The S3 calls the snapshot code makes; none works in this build.
pub struct S3Objects {
    pub clients: S3Clients,
}

impl S3Objects {
    fn absent(&self, action: &'static str, object: &S3Object) -> S3Error {
        S3Error {
            action,
            object: object.to_string(),
            detail: "this drover was built without the `aws` feature, which S3 snapshot destinations need; build it with default features".into(),
        }
    }

    pub fn presign_put(&self, object: &S3Object) -> Result<String, S3Error> {
        Err(self.absent("presign the upload of", object))
    }

    pub fn size(&self, object: &S3Object) -> Result<Option<u64>, S3Error> {
        Err(self.absent("look up", object))
    }

    pub fn fetch(&self, object: &S3Object, _path: &Path) -> Result<u64, S3Error> {
        Err(self.absent("download", object))
    }

    pub fn delete(&self, object: &S3Object) -> Result<(), S3Error> {
        Err(self.absent("delete", object))
    }
}
