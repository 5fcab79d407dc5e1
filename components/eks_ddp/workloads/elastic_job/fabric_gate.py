"""The fabric-check gate of :class:`~.elastic_job.ElasticJob`: the training pods' first phase, in the cluster.

Part of ElasticJob, kept in a module of its own; the pods are built by components/eks_ddp/workloads/elastic_job/pods.py.
Each training pod first runs an init container ``fabric-check``, shaped like the trainer (the same image, all GPUs,
the EFA devices, the same NCCL/EFA environment and mounts): ``python -m eks_ddp_runtime.fabric_check`` under the
training agent's launcher flags (the shared builder, eks_ddp_runtime.launch_command), over the nodes the run was admitted with
(``--nnodes=<minNodes>:<nodes>``, its own rendezvous id ``<Job UID>-fabric``), no restarts. The check fails on
missing EFA devices, a non-EFA transport, or a bus bandwidth below the catalog's floor (the whole job's, or a pair
of neighbouring nodes', naming the slow node); its exit code :data:`~eks_ddp_runtime.exitcodes.FABRIC_FAILED` fails
the training Job through its pod failure policy before any training starts.

Because the check is part of the training Job, it is one Workload in the queue: ``pulumi up`` never waits for it
(the training Job is not awaited), the run keeps its place while it waits for quota, and a second run over quota is
created and waits like any run. A pod that starts after the check passed (a replacement, a node that came late)
finds the marker rank 0 wrote and checks only its own node (its EFA devices): its bandwidth needs a peer, and every
peer is training (docs/efa.md).

The marker is keyed to the admission, not only to the Job: a Kueue eviction and readmission keeps the Job's UID but
puts the run on new nodes, which must be measured again. Under the queue it is
``<run dir>/.fabric-passed-<Job UID>-<request>``, ``<request>`` the pod's
``autoscaling.x-k8s.io/consume-provisioning-request`` annotation (through the downward API into
:data:`ADMISSION_ENV`): Kueue makes a new ProvisioningRequest per admission attempt, named
``<workload>-<check>-<attempt>`` (kubernetes-sigs/kueue pkg/controller/admissionchecks/provisioning/controller.go
``ProvisioningRequestName``), and writes its name into the pod template. A queued pod without the annotation (a
queue without the provisioning check) runs the full check. Outside the queue nothing readmits a Job, and the marker
is ``<run dir>/.fabric-passed-<Job UID>``.
"""

from __future__ import annotations

import shlex

import pulumi

from eks_ddp.core import catalog
from eks_ddp.workloads.elastic_job.info import JobInfo
from eks_ddp.workloads.elastic_job.pods import InitContainer
from eks_ddp_runtime.contract import NODE_NAME_ENV
from eks_ddp_runtime.launch_command import AgentOptions, FabricCheckOptions, cluster_timeouts, fabric_check_command

CONTAINER = "fabric-check"
"""The init container's name (the pod failure policy's ``containerName``)."""


ADMISSION_ENV = "FABRIC_ADMISSION"
"""The gate's copy of the pod's ``autoscaling.x-k8s.io/consume-provisioning-request`` annotation ("" when absent)."""
ADMISSION_FIELD = "metadata.annotations['autoscaling.x-k8s.io/consume-provisioning-request']"


def pass_marker(job: JobInfo) -> str:
    """The file the check's rank 0 creates when it passed (``$(JOB_UID)``, ``$(FABRIC_ADMISSION)``: the kubelet
    expands them): keyed to the admission under the queue (module docstring)."""
    key = f"$(JOB_UID)-$({ADMISSION_ENV})" if job.spec.queue is not None else "$(JOB_UID)"
    return f"{job.run_dir}/.fabric-passed-{key}"


def fabric_check_options(job: JobInfo, *, node_only: bool = False) -> FabricCheckOptions:
    place = job.spec.placement
    return FabricCheckOptions(run_dir=job.run_dir, require_efa=place.efa, instance_type=job.instance.name,
                              min_busbw_gbs=catalog.fabric_floor_gbs(job.instance.name) if place.efa else None,
                              pass_marker=None if node_only else pass_marker(job), node_only=node_only)


def fabric_check_command_of(job: JobInfo, endpoint: str) -> list[str]:
    """The check's agent command: the training agent's flags (one builder), the run's admitted nodes, its own
    rendezvous id, no restarts."""
    a = job.spec
    agent = AgentOptions(
        min_nodes=a.size.min_nodes, max_nodes=a.size.nodes, nproc_per_node=job.instance.gpus,
        rdzv_backend=a.rendezvous.backend, rdzv_endpoint=endpoint, rdzv_id="$(JOB_UID)-fabric",
        local_addr="$(POD_IP)", max_restarts=0, timeouts=cluster_timeouts(a.size.nodes))
    return fabric_check_command(agent, fabric_check_options(job))


def gate_command(job: JobInfo, endpoint: str) -> list[str]:
    """``sh -c``: the node-only check once the job's check passed, else the job's check."""
    node = ["python", "-m", "eks_ddp_runtime.fabric_check", *fabric_check_options(job, node_only=True).args()]
    admitted = f'[ -n "${ADMISSION_ENV}" ] && ' if job.spec.queue is not None else ""
    script = (f"if {admitted}[ -e {shlex.quote(pass_marker(job))} ]; then exec {shlex.join(node)}; fi; "
              f"exec {shlex.join(fabric_check_command_of(job, endpoint))}")
    return ["sh", "-c", script]


def fabric_gate(job: JobInfo, endpoint: pulumi.Input[str]) -> InitContainer:
    """The training pods' init container that runs the check (module docstring)."""
    return InitContainer(name=CONTAINER,
                         command=pulumi.Output.from_input(endpoint).apply(lambda e: gate_command(job, e)),
                         field_env={NODE_NAME_ENV: "spec.nodeName",
                                    **({ADMISSION_ENV: ADMISSION_FIELD} if job.spec.queue is not None else {})})
