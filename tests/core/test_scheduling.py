"""The autoscaler's pod-to-node decision as a pure function (components/eks_ddp/core/scheduling.py): required node
affinity, tolerations and requests against a template node. The decision on the stacks' rendered pods is
tests/infra/test_autoscaler.py's."""

from __future__ import annotations

from eks_ddp.core import scheduling


def test_required_node_affinity_and_toleration_rules():
    node = scheduling.TemplateNode(labels={"a": "1", "n": "5"}, taints=(("k", "v", "NoSchedule"),),
                                   allocatable={"cpu": 2, "memory": 2**30})
    tol = [{"key": "k", "operator": "Equal", "value": "v"}]

    def spec(*exprs, tolerations=tol):
        return {"tolerations": tolerations, "containers": [{"resources": {"requests": {"cpu": "500m"}}}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}}}}
    assert scheduling.would_scale_up(spec({"key": "a", "operator": "In", "values": ["1"]}), node)
    assert not scheduling.would_scale_up(spec({"key": "a", "operator": "NotIn", "values": ["1"]}), node)
    assert scheduling.would_scale_up(spec({"key": "n", "operator": "Gt", "values": ["4"]}), node)
    assert not scheduling.would_scale_up(spec({"key": "b", "operator": "Exists"}), node)
    assert not scheduling.would_scale_up(spec(tolerations=[{"key": "k", "operator": "Equal", "value": "x"}]), node)
    assert scheduling.would_scale_up(spec(tolerations=[{"operator": "Exists"}]), node)
