"""The bundled CIFAR-10 trainer's own stages of :class:`~.elastic_job.ElasticJob` (``cifar10_workload()``).

1. a Job running ``python -m eks_ddp_trainer.prepare_data`` (idempotent, checksum-verified) that Pulumi *awaits*, so
   training never starts on a missing or half-written dataset (only with ``Cifar10Data``);
2. a suspended CronJob that re-runs the test-set evaluation of the run on demand (only with ``evaluate``)::

       kubectl -n <namespace> create job --from=cronjob/<name>-evaluate <name>-evaluate-$(date +%s)

   It asks for a GPU, so with a queue its Job template carries the run's queue name and priority class and
   ``suspend: true``: ``kubectl create job --from=cronjob`` copies the template's labels and spec (kubectl
   ``pkg/cmd/create/create_job.go`` ``createJobFromCronJob``), and Kueue admits the Job like any run, through the
   quota and the ProvisioningRequest check; without the label Kueue would ignore it
   (``manageJobsWithoutQueueName: false``) and it would take a GPU node the queue counts as free.

Both run the stack's image (the bundled trainer's) as ``<name>-worker``, which has no IAM role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.workloads.elastic_job.pods import DATA_DIR, GPU_RESOURCE, PART_OF, pod_resources, queued_job, resources
from eks_ddp_runtime.contract import CIFAR10_PIN as DATA_PIN  # the loaders accept only the official CIFAR-10 files
from eks_ddp_runtime.contract import DATA_PIN_ENV

if TYPE_CHECKING:
    from eks_ddp.workloads.elastic_job.info import JobInfo

PREPARE_LABELS = {"app.kubernetes.io/name": "eks-ddp-prepare-data", **PART_OF}
EVALUATE_LABELS = {"app.kubernetes.io/name": "eks-ddp-evaluate", **PART_OF}
EVAL_RUN_DIR_ENV = "RUN_DIR"
"""The evaluation pod's run directory (default: this stack's run); override it per Job to evaluate another run
(only with ``WholeVolume``: with ``PerRunClaims`` the pod mounts this run's directory alone)."""


def create_prepare_job(job: JobInfo, name: str, child: pulumi.ResourceOptions) -> k8s.batch.v1.Job:
    template = job.pods.pod(
        PREPARE_LABELS, "prepare-data", ["python", "-m", "eks_ddp_trainer.prepare_data", f"--data-dir={DATA_DIR}"],
        k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": "500m", "memory": "1Gi"},
                                             limits={"cpu": "1", "memory": "2Gi"}), restart_policy="OnFailure",
        on_gpu_nodes=False, writes_data=True)
    # On the system nodes, never the GPU nodes: GPU groups idle at zero nodes and only the cluster
    # autoscaler brings them up, for pods that ask for GPUs. A prep pod pinned to them would stay
    # Pending and `pulumi up` (which awaits this Job) would hang until the Job's deadline.
    return k8s.batch.v1.Job(
        f"{name}-prepare-data",
        # replaceUnready: a prep Job that failed (download host down, deadline passed) is replaced on the next
        # `pulumi up` instead of being awaited again and failing it at once.
        metadata=job.meta(job.prepare_name, PREPARE_LABELS, {"pulumi.com/replaceUnready": "true"}),
        # No TTL: a Job gone from the cluster is dropped from state by the refresh before every `up`, and the next
        # `up` would create and await it again; a Complete Job holds no pods.
        spec=k8s.batch.v1.JobSpecArgs(backoff_limit=3, active_deadline_seconds=1800, template=template),
        # Awaited (no skipAwait): the training Job depends on it, so it starts only on a verified dataset.
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            delete_before_replace=True,
            custom_timeouts=pulumi.CustomTimeouts(create=job.spec.data_prep_timeout,
                                                  update=job.spec.data_prep_timeout))))


def create_evaluate_cronjob(job: JobInfo, name: str, child: pulumi.ResourceOptions) -> None:
    it = job.instance
    cpu = min(4, pod_resources(it)[0])
    # $(RUN_DIR) is expanded by the kubelet from the pod's env: this run by default; another run's directory
    # by setting RUN_DIR on the Job created from the CronJob (docs/getting-started.md "Evaluation").
    template = job.pods.pod(
        EVALUATE_LABELS, "evaluate",
        ["python", "-m", "eks_ddp_trainer.evaluate", f"--data-dir={DATA_DIR}", f"--run-dir=$({EVAL_RUN_DIR_ENV})"],
        resources(str(cpu), f"{min(16, it.memory_gib // 2)}Gi", {GPU_RESOURCE: 1}),
        env={EVAL_RUN_DIR_ENV: job.run_dir, DATA_PIN_ENV: DATA_PIN})
    queued = job.spec.queue is not None
    queue_labels, _, _ = queued_job(job.spec.queue, 1, 1)  # one pod, admitted whole
    k8s.batch.v1.CronJob(
        f"{name}-evaluate",
        metadata=job.meta(job.evaluate_name, EVALUATE_LABELS),
        spec=k8s.batch.v1.CronJobSpecArgs(
            # Suspended: never fires on its own; the schedule is required by the API only.
            suspend=True, schedule="0 0 1 1 *", concurrency_policy="Forbid",
            successful_jobs_history_limit=1, failed_jobs_history_limit=1,
            job_template=k8s.batch.v1.JobTemplateSpecArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(labels={**EVALUATE_LABELS, **queue_labels}),
                spec=k8s.batch.v1.JobSpecArgs(
                    suspend=True if queued else None, backoff_limit=1, active_deadline_seconds=3600, ttl_seconds_after_finished=24 * 3600,
                    template=template))),
        opts=child)
