"""One scale-up and one scale-down cycle of an autoscaled pool, driven the
way the cluster-autoscaler drives an externalgrpc provider, timed:

    autoscale.py CLOUD_CONFIG DELTA DELETE_BATCH TIMEOUT_S

Finds the cluster's one node group (NodeGroups), asks for DELTA more
nodes (NodeGroupIncreaseSize, timed against the config's grpc_timeout),
then polls NodeGroupNodes every 0.5 s, as the autoscaler's clusterstate
does each loop, until DELTA instances are running. Then takes
DELETE_BATCH running nodes out (NodeGroupDeleteNodes, the autoscaler's
bulk delete of empty nodes) and checks that the next NodeGroupNodes shows
each of them deleting (simulated machines cannot drain a Node, so their
removal itself is not timed here; tests/tests/docker.rs times nothing but
sees it happen). Prints one JSON
object of the figures; exits 1 when an instance reports an error or the
nodes do not arrive within TIMEOUT_S or a deleted one is not deleting. Uses tests/grpc/autoscaler.py's
connection, so it dials exactly as the tests' client does. A benchmark:
it prints times, it asserts none.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "grpc"))

import autoscaler  # noqa: E402

pb = autoscaler.pb
RUNNING = pb.InstanceStatus.instanceRunning
DELETING = pb.InstanceStatus.instanceDeleting


def timed(call, request, timeout):
    started = time.monotonic()
    response = call(request, timeout=timeout)
    return response, time.monotonic() - started


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    config = autoscaler.read_config(sys.argv[1])
    delta, batch, limit = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    stub, timeout = autoscaler.connect(config)
    groups = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=timeout).nodeGroups
    if len(groups) != 1:
        raise SystemExit(f"expected one autoscaled node group, the coordinator answered {len(groups)}")
    group = groups[0].id
    _, template_s = timed(stub.NodeGroupTemplateNodeInfo, pb.NodeGroupTemplateNodeInfoRequest(id=group), timeout)

    out = {"group": group, "delta": delta, "template_seconds": template_s}
    started = time.monotonic()
    _, out["increase_seconds"] = timed(
        stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=group, delta=delta), timeout
    )
    slowest_poll = 0.0
    first = None
    running = []
    while True:
        response, took = timed(stub.NodeGroupNodes, pb.NodeGroupNodesRequest(id=group), timeout)
        slowest_poll = max(slowest_poll, took)
        errors = [i for i in response.instances if i.status.HasField("errorInfo")]
        if errors:
            e = errors[0]
            raise SystemExit(
                f"instance {e.id} reports {e.status.errorInfo.errorCode}: {e.status.errorInfo.errorMessage}"
            )
        running = [i.id for i in response.instances if i.status.instanceState == RUNNING]
        now = time.monotonic() - started
        if running and first is None:
            first = now
        if len(running) >= delta:
            break
        if now > limit:
            raise SystemExit(f"{len(running)} of {delta} nodes running after {limit:.0f} s")
        print(f"bench: {len(running)} of {delta} nodes running", file=sys.stderr)
        time.sleep(0.5)
    out["first_running_seconds"] = first
    out["all_running_seconds"] = time.monotonic() - started
    out["instances"] = len(response.instances)
    out["slowest_nodes_call_seconds"] = slowest_poll

    gone = set(running[:batch])
    nodes = [pb.ExternalGrpcNode(providerID=i) for i in sorted(gone)]
    _, out["delete_seconds"] = timed(
        stub.NodeGroupDeleteNodes, pb.NodeGroupDeleteNodesRequest(id=group, nodes=nodes), timeout
    )
    # What the autoscaler's next look sees: each one deleting (or gone).
    response = stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group), timeout=timeout)
    staying = [
        i.id for i in response.instances if i.id in gone and i.status.instanceState != DELETING
    ]
    if staying:
        raise SystemExit(f"{len(staying)} of {batch} deleted nodes are not deleting: {staying[:3]}")
    out["deleted"] = batch
    print(json.dumps(out))


if __name__ == "__main__":
    main()
