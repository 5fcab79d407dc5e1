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


def test_pod_requests_as_component_helpers_count_them_in_either_unit():
    """One reading of a pod's requests serves the autoscaler model (floats) and the queue contract (Kueue's integer
    units): containers summed, at least the largest init container, plus the pod's overhead."""
    from eks_ddp.tooling.contracts.queue import resource_value

    spec = {"containers": [{"resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}},
                           {"resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
            "overhead": {"memory": "128Mi"}}
    assert scheduling.pod_requests(spec) == {"cpu": 2.0, "memory": 2 * 2**30 + 128 * 2**20}
    assert scheduling.pod_requests(spec, resource_value) == {"cpu": 2000, "memory": 2 * 2**30 + 128 * 2**20}


def test_selector_requirements_that_cannot_match_match_nothing():
    """k8s labels.Requirement: Gt/Lt need an integer label value; an unknown operator builds no selector."""
    labels = {"n": "five"}
    assert not scheduling.expression_matches({"key": "n", "operator": "Gt", "values": ["4"]}, labels)
    assert not scheduling.expression_matches({"key": "n", "operator": "Near", "values": ["x"]}, labels)
    assert scheduling.expression_matches({"key": "n", "operator": "In", "values": ["five"]}, labels)
