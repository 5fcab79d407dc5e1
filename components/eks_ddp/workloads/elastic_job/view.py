"""What the stage builders (stages.py, data_stage.py, fabric_gate.py) read of an
:class:`~eks_ddp.workloads.elastic_job.ElasticJob`: a protocol, so they depend on this module, never back on the
component that calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pulumi
    import pulumi_kubernetes as k8s

    from eks_ddp.core.catalog import InstanceType
    from eks_ddp.workloads.elastic_job.args import ElasticJobArgs
    from eks_ddp.workloads.elastic_job.pods import PodFactory


class JobView(Protocol):
    """The public, read-only parts of an ElasticJob the stages use."""

    args: ElasticJobArgs
    instance: InstanceType
    job_name: str
    run_dir: str
    prepare_name: str
    evaluate_name: str
    image: pulumi.Input[str]
    pods: PodFactory

    def store_egress(self) -> k8s.networking.v1.NetworkPolicyEgressRuleArgs: ...
