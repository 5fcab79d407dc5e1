"""What the builders of an :class:`~eks_ddp.workloads.elastic_job.ElasticJob` take: a :class:`JobInfo`, computed
once from the Args (names, paths, labels, the catalog's instance, the pods' shared pieces, the env the job owns).

Each builder (stages.py, data_stage.py, fabric_gate.py, the training Job in job.py) is a function of an info and
returns the objects it made, as kubeflow trainer's plugins do (``Build(ctx, info, trainJob)``); none reads the
component.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core import catalog
from eks_ddp.core.workload import DATA_DIR_ENV, DATA_VERIFY_ENV, RUN_DIR_ENV, Cifar10Data, S3Data
from eks_ddp.workloads.elastic_job.args import ElasticJobArgs, EtcdStore
from eks_ddp.workloads.elastic_job.pods import CACHE_ENV, DATA_DIR, TRAINER_LABELS, PodFactory, meta, nccl_env
from eks_ddp.workloads.etcd import etcd_client_egress, store_selector, store_service_of
from eks_ddp_runtime.contract import CIFAR10_PIN, DATA_PIN_ENV, RESULTS_KMS_KEY_ENV, RESULTS_URL_ENV
from eks_ddp_runtime.launch_command import AGENT_ENV, RUNS_SUBDIR, SHARED_ROOT

FIELD_ENV = {"POD_IP": "status.podIP", "JOB_UID": "metadata.labels['batch.kubernetes.io/controller-uid']"}
"""The agents' downward-API variables: ``--local-addr`` and ``--rdzv-id`` read them."""


def owned_env(it: catalog.InstanceType) -> set[str]:
    """The variables the job sets itself in an agent's pod: a workload may not set them."""
    return {*CACHE_ENV, *AGENT_ENV, *nccl_env(it, True), *FIELD_ENV, RESULTS_URL_ENV, RESULTS_KMS_KEY_ENV,
            DATA_PIN_ENV, DATA_VERIFY_ENV}


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """One run's computed values (read-only)."""

    name: str
    """The component's name: every resource name derives from it."""
    spec: ElasticJobArgs
    """The typed inputs."""
    job_name: str
    """``<name>-<run_id>``: the training Job, its pods' ``app.kubernetes.io/instance``."""
    run_dir: str
    """The run's directory in every pod (checkpoints, model, metrics): the workers' EKS_DDP_RUN_DIR."""
    data_dir: str
    """Where the workload's dataset is: /shared/data/<name> for S3 data, /shared/data otherwise."""
    instance: catalog.InstanceType
    agent_image: pulumi.Input[str]
    """The training, fabric-check and S3-stage pods' image (``workload.image``, else ``image``)."""
    pods: PodFactory
    """The pods' shared pieces (pods.py)."""

    @property
    def prepare_name(self) -> str:
        return f"{self.name}-prepare-data"

    @property
    def evaluate_name(self) -> str:
        return f"{self.name}-evaluate"

    @property
    def train_labels(self) -> dict[str, str]:
        return {**TRAINER_LABELS, "app.kubernetes.io/instance": self.job_name, "app.kubernetes.io/component": "train"}

    def meta(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, pulumi.Input[str]] | None = None
             ) -> k8s.meta.v1.ObjectMetaArgs:
        return meta(name, self.spec.namespace, labels, annotations)

    def workload_env(self) -> dict[str, str]:
        """What the job tells every worker of any workload (docs/own-workloads.md)."""
        data = self.spec.workload.data
        pin = {DATA_PIN_ENV: CIFAR10_PIN} if isinstance(data, Cifar10Data) else \
            {DATA_VERIFY_ENV: data.verify} if isinstance(data, S3Data) else {}
        return {**pin, RUN_DIR_ENV: self.run_dir, DATA_DIR_ENV: self.data_dir}

    def store_egress(self) -> k8s.networking.v1.NetworkPolicyEgressRuleArgs:
        """The agents' egress rule to the etcd store's client port, selecting the store Service's own selector."""
        store = self.spec.rendezvous
        assert isinstance(store, EtcdStore)
        selector: pulumi.Input[Mapping[str, str]] = dict(store.server_labels) if store.server_labels else \
            pulumi.Output.from_input(store.endpoint).apply(lambda e: store_selector(store_service_of(str(e))))
        return etcd_client_egress(selector)


def job_info(name: str, a: ElasticJobArgs, *, trainer_sa: pulumi.Input[str], worker_sa: pulumi.Input[str]) -> JobInfo:
    """The info of ElasticJob ``name``; refuses a workload env naming a variable the job owns."""
    it = a.placement.instance
    owned = owned_env(it)
    if clash := sorted(owned & set(a.workload.env)):
        raise ValueError(f"workload.env: got {', '.join(clash)}; expected names the job does not set itself "
                         f"(it sets {', '.join(sorted(owned))})")
    run_dir = f"{SHARED_ROOT}/{RUNS_SUBDIR}/{a.run_id}"
    data = a.workload.data
    return JobInfo(
        name=name, spec=a, job_name=f"{name}-{a.run_id}", run_dir=run_dir,
        data_dir=f"{DATA_DIR}/{data.name}" if isinstance(data, S3Data) else DATA_DIR, instance=it,
        agent_image=a.agent_image,
        pods=PodFactory(namespace=a.namespace, image=a.image if a.image is not None else a.agent_image,
                        placement=a.placement, storage=a.storage, run_dir=run_dir, rendezvous=a.rendezvous,
                        trainer_sa=trainer_sa, worker_sa=worker_sa))
