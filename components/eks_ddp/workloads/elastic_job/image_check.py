"""The image check of :class:`~.elastic_job.ElasticJob`: a workload's own image, checked on a system node first.

The launcher refuses a torch outside its range (training/runtime/eks_ddp_runtime/compat.py) when the training pod
starts, which is on a GPU node the autoscaler brought up for it, after that node pulled the image. For a workload
that brings its own image the library cannot know its torch (no registry is read while planning), so a small Job
on the system nodes, which are always up, runs ``python -m eks_ddp_runtime.image_check`` in that image with the
training pod's working directory and environment (training/runtime/eks_ddp_runtime/image_check.py: the torch range,
the launcher loading, the module or script being there). Pulumi awaits it and the training Job depends on it: a bad
image fails ``pulumi up`` with the check's line (``kubectl logs job/<name>-image-check``) before any GPU node is
asked for. The bundled trainer's image is built here with the pinned torch and gets no check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.workloads.elastic_job.pods import JOB_IMMUTABLE_FIELDS, PART_OF

if TYPE_CHECKING:
    from eks_ddp.workloads.elastic_job.info import JobInfo

IMAGE_CHECK_LABELS = {"app.kubernetes.io/name": "eks-ddp-image-check", **PART_OF}
IMAGE_CHECK_MODULE = "eks_ddp_runtime.image_check"
IMAGE_CHECK_FAILS = [1, 2]
"""The check's exit codes that fail its Job at once: 2, a finding (the line says which); 1, Python's own for an
image without the runtime ("No module named eks_ddp_runtime")."""


def image_check_command(job: JobInfo) -> list[str]:
    """``python -m eks_ddp_runtime.image_check --module M`` (or ``--script S``): the workload's entrypoint."""
    w = job.spec.workload
    which = ["--module", w.module] if w.module is not None else ["--script", str(w.script)]
    return ["python", "-m", IMAGE_CHECK_MODULE, *which]


def create_image_check(job: JobInfo, name: str, child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    """The check's Job (awaited) and its deny-all NetworkPolicy, when the workload has an image of its own and the
    job runs; returns what the training Job waits on (nothing otherwise)."""
    a = job.spec
    if a.workload.image is None or a.state != "run":
        return []
    net = k8s.networking.v1
    policy = net.NetworkPolicy(  # it needs no network: none in, none out
        f"{name}-image-check-netpol", metadata=job.meta(f"{name}-image-check", IMAGE_CHECK_LABELS),
        spec=net.NetworkPolicySpecArgs(
            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(IMAGE_CHECK_LABELS)),
            policy_types=["Ingress", "Egress"], ingress=[], egress=[]),
        opts=child)
    template = job.pods.pod(
        IMAGE_CHECK_LABELS, "image-check", image_check_command(job),
        k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "250m", "memory": "1Gi"},
                                             limits={"cpu": "1", "memory": "2Gi"}),
        env=dict(a.workload.env), on_gpu_nodes=False, image=job.agent_image)
    # A finding fails the Job (and so `pulumi up`) at once; a node lost under it does not count; one retry for
    # anything else (an OOM kill while torch imports on a busy node).
    policy_rules = k8s.batch.v1.PodFailurePolicyArgs(rules=[
        k8s.batch.v1.PodFailurePolicyRuleArgs(action="FailJob", on_exit_codes=(
            k8s.batch.v1.PodFailurePolicyOnExitCodesRequirementArgs(
                container_name="image-check", operator="In", values=IMAGE_CHECK_FAILS))),
        k8s.batch.v1.PodFailurePolicyRuleArgs(action="Ignore", on_pod_conditions=[
            k8s.batch.v1.PodFailurePolicyOnPodConditionsPatternArgs(type="DisruptionTarget", status="True")]),
    ])
    check = k8s.batch.v1.Job(
        f"{name}-image-check",
        # replaceUnready: a failed check (a bad image, since replaced) is re-run on the next `pulumi up`.
        metadata=job.meta(f"{name}-image-check", IMAGE_CHECK_LABELS, {"pulumi.com/replaceUnready": "true"}),
        # No TTL, as for the data stage: a Job the refresh finds gone would be created and awaited again.
        spec=k8s.batch.v1.JobSpecArgs(backoff_limit=1, active_deadline_seconds=1800, pod_failure_policy=policy_rules,
                                      template=template),
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=[policy], delete_before_replace=True, replace_on_changes=list(JOB_IMMUTABLE_FIELDS),
            custom_timeouts=pulumi.CustomTimeouts(create="30m", update="30m"))))
    return [check]
