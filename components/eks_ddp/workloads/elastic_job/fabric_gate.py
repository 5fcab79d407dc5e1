"""The fabric-check gate of :class:`~.elastic_job.ElasticJob`: a Job Pulumi awaits before the training Job.

Part of ElasticJob, kept in a module of its own; both build their pods with components/eks_ddp/workloads/elastic_job/pods.py.
One agent per node of the job, shaped like a training pod (all GPUs, the EFA devices, the same NCCL/EFA
environment), runs ``python -m eks_ddp_runtime.fabric_check`` under the training agent's torchrun flags (the
shared builder in launch_command.py) with every node required and no restarts. The check fails on missing EFA
devices, a non-EFA transport or a bus bandwidth below the catalog's floor (the whole job's, or a pair of
neighbouring nodes', naming the slow node by its Kubernetes node name); a failed check fails the Job,
and so ``pulumi up``, before the training Job exists (it depends on this one).
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core import catalog
from eks_ddp.core.launch_command import (
    AGENT_ENV,
    AgentOptions,
    FabricCheckOptions,
    cluster_timeouts,
    fabric_check_command,
)
from eks_ddp.workloads.elastic_job.args import C10d
from eks_ddp.workloads.elastic_job.info import FIELD_ENV, JobInfo
from eks_ddp.workloads.elastic_job.pods import (
    C10D_PORT,
    EFA_RESOURCE,
    GPU_RESOURCE,
    JOB_IMMUTABLE_FIELDS,
    QUEUE_REPLACE,
    TRAINER_LABELS,
    nccl_env,
    one_per_node,
    pod_resources,
    queued_job,
    resources,
)
from eks_ddp.workloads.namespace import dns_egress
from eks_ddp_runtime.contract import NODE_NAME_ENV


def fabric_check_name(job: JobInfo) -> str:
    """The gate Job's name (also its pods' ``app.kubernetes.io/instance``)."""
    return f"{job.job_name}-fabric"


def fabric_check_command_of(job: JobInfo, endpoint: str) -> list[str]:
    """The check's agent command: the training agent's flags (one builder), every node required, no restarts."""
    a, place = job.spec, job.spec.placement
    agent = AgentOptions(
        min_nodes=a.size.nodes, max_nodes=a.size.nodes, nproc_per_node=job.instance.gpus,
        rdzv_backend=a.rendezvous.backend,
        rdzv_endpoint=endpoint, rdzv_id="$(JOB_UID)", local_addr="$(POD_IP)", max_restarts=0,
        timeouts=cluster_timeouts(a.size.nodes))
    check = FabricCheckOptions(run_dir=job.run_dir, require_efa=place.efa, instance_type=job.instance.name,
                               min_busbw_gbs=catalog.fabric_floor_gbs(job.instance.name) if place.efa else None)
    return fabric_check_command(agent, check)


def create_fabric_check(job: JobInfo, name: str, child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    """An Indexed Job, one agent per node, that Pulumi awaits (plus its NetworkPolicy, and its rendezvous
    Service with c10d); returns what the training Job waits on."""
    a, it, gate = job.spec, job.instance, fabric_check_name(job)
    efa, nodes = a.placement.efa, a.size.nodes
    if len(f"{gate}-{nodes}") > 63:
        raise ValueError(f"run_id: got {a.run_id!r}; '{gate}-<index>' exceeds 63 characters (the fabric "
                         "check's pod names): use a shorter run_id, or fabric_check=False")
    c10d = isinstance(a.rendezvous, C10d)
    labels = {**TRAINER_LABELS, "app.kubernetes.io/instance": gate, "app.kubernetes.io/component": "fabric-check"}
    made: list[pulumi.Resource] = []
    endpoint: pulumi.Input[str] = "" if isinstance(a.rendezvous, C10d) else a.rendezvous.endpoint
    if c10d:
        svc = k8s.core.v1.Service(
            f"{name}-fabric-rdzv", metadata=job.meta(gate, labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None", publish_not_ready_addresses=True,
                selector={"app.kubernetes.io/instance": gate},
                ports=[k8s.core.v1.ServicePortArgs(name="rdzv", port=C10D_PORT, target_port=C10D_PORT)]),
            opts=child)
        # The FQDN, as for the training Job: index 0 finds itself in /etc/hosts without DNS.
        endpoint = pulumi.Output.all(svc.metadata.name, a.namespace).apply(
            lambda v: f"{gate}-0.{v[0]}.{v[1]}.svc.cluster.local:{C10D_PORT}")
        made.append(svc)
    net = k8s.networking.v1
    peers = [net.NetworkPolicyPeerArgs(pod_selector=k8s.meta.v1.LabelSelectorArgs(
        match_labels={"app.kubernetes.io/instance": gate}))]
    tcp = [net.NetworkPolicyPortArgs(protocol="TCP")]  # any TCP port, as the training pods' peers
    egress = [dns_egress(), net.NetworkPolicyEgressRuleArgs(to=peers, ports=tcp)]
    if not c10d:
        egress.append(job.store_egress())
    made.append(net.NetworkPolicy(
        f"{name}-fabric-netpol", metadata=job.meta(gate, labels),
        spec=net.NetworkPolicySpecArgs(
            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={"app.kubernetes.io/instance": gate}),
            policy_types=["Ingress", "Egress"], ingress=[net.NetworkPolicyIngressRuleArgs(from_=peers, ports=tcp)],
            egress=egress),
        opts=child))
    cpu, memory, shm = pod_resources(it)
    devices = {GPU_RESOURCE: it.gpus, **({EFA_RESOURCE: it.efa_interfaces} if efa else {})}
    affinity = one_per_node(gate)
    template = job.pods.pod(
        labels, "fabric-check", pulumi.Output.from_input(endpoint).apply(lambda e: fabric_check_command_of(job, e)),
        resources(str(cpu), f"{memory}Gi", devices), env={**AGENT_ENV, **nccl_env(it, efa)},
        # The node's name, by which the check names a slow node (eks_ddp_runtime.contract NODE_NAME_ENV).
        field_env={**FIELD_ENV, NODE_NAME_ENV: "spec.nodeName"},
        shm_gib=shm, affinity=affinity, subdomain=gate if c10d else None, rdzv_tls=True,
        image=job.agent_image,
        ports=[k8s.core.v1.ContainerPortArgs(name="rdzv", container_port=C10D_PORT)] if c10d else None)
    # No retries: a failed check is a finding (fabric.json says which), not a flake. A node lost under
    # the check (DisruptionTarget) is not counted. replaceUnready: the next `pulumi up` re-runs a failed
    # check instead of failing on the old Job.
    # Through the run's queue too (it holds every GPU node of the run), admitted whole: no partial admission.
    queue_labels, _, kueue_owns = queued_job(a.queue, nodes, nodes)
    gate_job = k8s.batch.v1.Job(
        f"{name}-fabric-check",
        metadata=job.meta(gate, {**labels, **queue_labels}, {"pulumi.com/replaceUnready": "true"}),
        spec=k8s.batch.v1.JobSpecArgs(
            suspend=True if a.queue is not None else None, completion_mode="Indexed", completions=nodes, parallelism=nodes, backoff_limit=0,
            active_deadline_seconds=1800, pod_replacement_policy="Failed",
            pod_failure_policy=k8s.batch.v1.PodFailurePolicyArgs(rules=[
                k8s.batch.v1.PodFailurePolicyRuleArgs(action="Ignore", on_pod_conditions=[
                    k8s.batch.v1.PodFailurePolicyOnPodConditionsPatternArgs(type="DisruptionTarget",
                                                                            status="True")])]),
            template=template),
        # Awaited (no skipAwait) until Complete; the training Job depends on it.
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=made, delete_before_replace=True, ignore_changes=kueue_owns,
            replace_on_changes=[*JOB_IMMUTABLE_FIELDS, QUEUE_REPLACE],
            custom_timeouts=pulumi.CustomTimeouts(create=a.fabric_check_timeout,
                                                  update=a.fabric_check_timeout))))
    return [gate_job]

