//! Why a field's value has the wrong form: a Kubernetes version, a CIDR, a
//! `host:port`, an AWS identifier. Validation turns each into a problem
//! detail under the field's path; the message names the value and the form
//! that is accepted.

use crate::names::NameError;

/// A value of the wrong form.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "must be v1.31.2 or the like (v, then SemVer: MAJOR.MINOR.PATCH, optionally a pre-release such as -rc.1 and a build such as +build.5, each of dot-separated identifiers of letters, digits and '-'): {why}, got {got:?}"
    )]
    KubernetesVersion { got: String, why: String },
    #[error(
        "must be v1.{oldest_minor}.0 or later: the kubeadm config API Drover renders (v1beta4, kubeadm 1.31) deploys no older control plane, got {got:?}"
    )]
    KubernetesTooOld { oldest_minor: u32, got: String },
    #[error("must be a CIDR such as 10.244.0.0/16, got {got:?}")]
    NotACidr { got: String },
    #[error("{got:?} is not an IP address")]
    NotAnIp { got: String },
    #[error("prefix length must be 0..={max}, got {got:?}")]
    PrefixLength { max: u8, got: String },
    #[error("must be host:port, got {got:?}")]
    NotHostPort { got: String },
    #[error("port must be 1..=65535, got {got:?}")]
    Port { got: String },
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("must be a region such as us-east-1, got {got:?}")]
    AwsRegion { got: String },
    #[error("must be an ID such as {prefix}-0abc12345def67890, got {got:?}")]
    AwsId { prefix: &'static str, got: String },
    #[error("must be an instance type such as m6i.large, got {got:?}")]
    AwsInstanceType { got: String },
    #[error(
        "must be an instance profile name or ARN (arn:aws:iam::123456789012:instance-profile/NAME), got {got:?}"
    )]
    AwsInstanceProfile { got: String },
}
