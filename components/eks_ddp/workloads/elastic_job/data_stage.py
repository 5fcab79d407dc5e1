"""The S3 data stage of :class:`~.elastic_job.ElasticJob` for a workload with :class:`~.workload.S3Data`.

A Job on the system nodes runs ``python -m eks_ddp_runtime.stage_s3 s3://bucket/prefix/ /shared/data/<name>``
in the workload's image (boto3 must be in it): every object copied once and verified, then the data set's
manifest written once; a rerun re-verifies every file against it (and the pin, ``EKS_DDP_DATA_VERIFY``) and
downloads nothing (training/runtime/eks_ddp_runtime/stage_s3.py, dataset.py). Pulumi awaits it; the training Job depends on it, so training never starts on a
half-staged dataset. Its pods run as a ServiceAccount of their own whose IAM role (IRSA,
:func:`eks_ddp.infra.iam.data_stage_role`) may list exactly that prefix and read objects under it, nothing else; they reach only
DNS and HTTPS outside the VPC's private ranges (S3, STS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core.workload import DATA_VERIFY_ENV, S3Data
from eks_ddp.infra.iam import stage_service_account
from eks_ddp.workloads.elastic_job.pods import DATA_DIR, EGRESS_EXCEPT, PART_OF
from eks_ddp.workloads.namespace import dns_egress

if TYPE_CHECKING:
    from eks_ddp.workloads.elastic_job.info import JobInfo

STAGE_LABELS = {"app.kubernetes.io/name": "eks-ddp-stage-data", **PART_OF}
STAGE_MODULE = "eks_ddp_runtime.stage_s3"


def create_s3_stage(job: JobInfo, name: str, child: pulumi.ResourceOptions) -> k8s.batch.v1.Job:
    """The stage's ServiceAccount, NetworkPolicy and Job (awaited); returns the Job the training Job waits on."""
    a = job.spec
    data, role_arn = a.workload.data, a.data_role_arn
    assert isinstance(data, S3Data) and role_arn is not None  # ElasticJobArgs requires the role with S3 data
    sa = k8s.core.v1.ServiceAccount(
        f"{name}-stage-sa", metadata=job.meta(stage_service_account(name), PART_OF,
                                                   {"eks.amazonaws.com/role-arn": role_arn}),
        automount_service_account_token=False, opts=child)
    net = k8s.networking.v1
    https = net.NetworkPolicyEgressRuleArgs(
        to=[net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr="0.0.0.0/0", except_=list(EGRESS_EXCEPT)))],
        ports=[net.NetworkPolicyPortArgs(port=443, protocol="TCP")])
    net.NetworkPolicy(
        f"{name}-stage-data-netpol", metadata=job.meta(f"{name}-stage-data", STAGE_LABELS),
        spec=net.NetworkPolicySpecArgs(
            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(STAGE_LABELS)),
            policy_types=["Ingress", "Egress"], ingress=[], egress=[dns_egress(), https]),
        opts=child)
    template = job.pods.pod(
        STAGE_LABELS, "stage-data", ["python", "-m", STAGE_MODULE, data.uri, f"{DATA_DIR}/{data.name}"],
        k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "500m", "memory": "1Gi"},
                                             limits={"cpu": "2", "memory": "4Gi"}),
        env={DATA_VERIFY_ENV: data.verify}, on_gpu_nodes=False, writes_data=True, image=job.agent_image,
        service_account=sa.metadata.name)
    # Exit codes 3 (boto3 missing, a bad URI) and 5 (a corrupt object, an escaping key) fail the Job, and so
    # `pulumi up`, at once; anything else (network, throttling) is retried in a new pod.
    fatal = k8s.batch.v1.PodFailurePolicyArgs(rules=[
        k8s.batch.v1.PodFailurePolicyRuleArgs(action="FailJob", on_exit_codes=(
            k8s.batch.v1.PodFailurePolicyOnExitCodesRequirementArgs(
                container_name="stage-data", operator="In", values=[2, 3, 5]))),
        k8s.batch.v1.PodFailurePolicyRuleArgs(action="Ignore", on_pod_conditions=[
            k8s.batch.v1.PodFailurePolicyOnPodConditionsPatternArgs(type="DisruptionTarget", status="True")]),
    ])
    # No TTL, as for the CIFAR-10 download (cifar10_stages.py): the refresh would forget a removed Job and the next
    # `up` would stage (and await) the data set again.
    return k8s.batch.v1.Job(
        f"{name}-stage-data",
        metadata=job.meta(f"{name}-stage-data", STAGE_LABELS, {"pulumi.com/replaceUnready": "true"}),
        spec=k8s.batch.v1.JobSpecArgs(backoff_limit=3, active_deadline_seconds=6 * 3600, pod_failure_policy=fatal,
                                      template=template),
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            delete_before_replace=True,
            custom_timeouts=pulumi.CustomTimeouts(create="6h", update="6h"))))
