//! The part of Kubernetes' `v1.Node` a template node carries, as protobuf
//! messages with the field numbers of k8s.io/api core/v1
//! `generated.proto` (Node, NodeSpec, Taint, NodeStatus, NodeCondition,
//! NodeSystemInfo) and apimachinery's `ObjectMeta` and `Quantity`: what
//! `v1.Node#Marshal()` writes, which the autoscaler unmarshals from
//! `nodeBytes`. Fields it leaves out are absent on the wire, which
//! proto2 decoding takes as unset.

use std::collections::BTreeMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<NodeSpec>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<NodeStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeSpec {
    #[prost(string, optional, tag = "3")]
    pub provider_id: Option<String>,
    #[prost(message, repeated, tag = "5")]
    pub taints: Vec<Taint>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Taint {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub effect: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeStatus {
    #[prost(btree_map = "string, message", tag = "1")]
    pub capacity: BTreeMap<String, Quantity>,
    #[prost(btree_map = "string, message", tag = "2")]
    pub allocatable: BTreeMap<String, Quantity>,
    #[prost(message, repeated, tag = "4")]
    pub conditions: Vec<NodeCondition>,
    #[prost(message, optional, tag = "7")]
    pub node_info: Option<NodeSystemInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeCondition {
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeSystemInfo {
    #[prost(string, optional, tag = "7")]
    pub kubelet_version: Option<String>,
    #[prost(string, optional, tag = "9")]
    pub operating_system: Option<String>,
    #[prost(string, optional, tag = "10")]
    pub architecture: Option<String>,
}

/// `resource.Quantity` travels as its canonical string.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Quantity {
    #[prost(string, optional, tag = "1")]
    pub string: Option<String>,
}

impl Quantity {
    pub fn of(text: impl Into<String>) -> Self {
        Self {
            string: Some(text.into()),
        }
    }
}
