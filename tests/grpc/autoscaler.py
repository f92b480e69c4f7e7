"""The calls the cluster-autoscaler makes to an externalgrpc cloud
provider, made with Python's grpcio from tests/grpc/externalgrpc.proto:
a client no one here wrote the transport of, for Drover's tests.

    autoscaler.py CLOUD_CONFIG METHOD [JSON_REQUEST]

Reads the cloud-config as the autoscaler does (address, cert, key,
cacert, grpc_timeout; externalgrpc_cloud_provider.go), dials with mutual
TLS and the server name set to the address' host, calls METHOD with the
request given as proto3 JSON under grpc_timeout as the call's deadline,
and prints one JSON line: {"code": ..., "message": ..., "response": ...,
"seconds": ...}. Exits 0 whatever the call's code; 2 on bad usage.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.environ["DROVER_GRPC_GEN"])

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402

import externalgrpc_pb2 as pb  # noqa: E402
import externalgrpc_pb2_grpc as rpc  # noqa: E402
import k8s_node_pb2 as k8s  # noqa: E402


def read_config(path):
    config = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition(":")
            value = value.strip()
            if value.startswith('"'):
                value = json.loads(value)
            config[key.strip()] = value
    return config


def seconds(duration):
    # metav1.Duration strings as the cloud-config holds them: "5s", "1.5s", "100ms".
    if duration.endswith("ms"):
        return float(duration[:-2]) / 1000
    if duration.endswith("s"):
        return float(duration[:-1])
    raise SystemExit(f"grpc_timeout {duration!r} is not a duration")


REQUEST_TYPES = {
    "NodeGroups": pb.NodeGroupsRequest,
    "NodeGroupForNode": pb.NodeGroupForNodeRequest,
    "PricingNodePrice": pb.PricingNodePriceRequest,
    "PricingPodPrice": pb.PricingPodPriceRequest,
    "GPULabel": pb.GPULabelRequest,
    "GetAvailableGPUTypes": pb.GetAvailableGPUTypesRequest,
    "Cleanup": pb.CleanupRequest,
    "Refresh": pb.RefreshRequest,
    "NodeGroupTargetSize": pb.NodeGroupTargetSizeRequest,
    "NodeGroupIncreaseSize": pb.NodeGroupIncreaseSizeRequest,
    "NodeGroupDeleteNodes": pb.NodeGroupDeleteNodesRequest,
    "NodeGroupDecreaseTargetSize": pb.NodeGroupDecreaseTargetSizeRequest,
    "NodeGroupNodes": pb.NodeGroupNodesRequest,
    "NodeGroupTemplateNodeInfo": pb.NodeGroupTemplateNodeInfoRequest,
    "NodeGroupGetOptions": pb.NodeGroupAutoscalingOptionsRequest,
}


def connect(config):
    """A stub dialled as the autoscaler dials (mutual TLS, the server name
    set to the address' host) and the per-call deadline, in seconds."""
    host = config["address"].rsplit(":", 1)[0].strip("[]")
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(config["cacert"], "rb").read(),
        private_key=open(config["key"], "rb").read(),
        certificate_chain=open(config["cert"], "rb").read(),
    )
    channel = grpc.secure_channel(
        config["address"], creds, options=[("grpc.ssl_target_name_override", host)]
    )
    return rpc.CloudProviderStub(channel), seconds(config.get("grpc_timeout", "5s"))


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    config = read_config(sys.argv[1])
    method = sys.argv[2]
    request_json = sys.argv[3] if len(sys.argv) == 4 else "{}"
    stub, timeout = connect(config)
    call = getattr(stub, method)
    request_type = REQUEST_TYPES[method]
    request = json_format.Parse(request_json, request_type())
    started = time.monotonic()
    out = {"code": "OK", "message": "", "response": None}
    try:
        response = call(request, timeout=timeout)
        out["response"] = json_format.MessageToDict(response)
        if method == "NodeGroupTemplateNodeInfo":
            # What the autoscaler does with nodeBytes: v1.Node#Unmarshal().
            node = k8s.Node()
            node.ParseFromString(response.nodeBytes)
            out["node"] = json_format.MessageToDict(node)
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["message"] = e.details()
    out["seconds"] = time.monotonic() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main()
