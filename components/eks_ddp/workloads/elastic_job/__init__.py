"""ElasticJob: a workload's data stage, then an elastic torchrun training job (plus the bundled trainer's extras).

``pulumi up`` creates, in order:

1. the workload's data stage, which Pulumi *awaits*, so training never starts on a missing or half-written
   dataset: the CIFAR-10 download for ``Cifar10Data`` (stages.py), the S3 copy for ``S3Data``
   (data_stage.py), nothing without data;
2. the training Job: an Indexed Job with one ``eks_ddp_runtime.launch`` agent per node (``--nnodes=min:max``)
   running the workload's module or script, which Pulumi does *not* await (``pulumi.com/skipAwait``); follow it
   with the ``follow_command`` output. With ``fabric_check`` its pods first run the fabric check, an init container
   (fabric_gate.py), in the cluster: nothing of it is awaited by Pulumi;
3. with ``workload.evaluate`` (the bundled trainer), a suspended CronJob that re-runs the test-set evaluation
   on demand (the ``evaluate_command`` output).

With ``queue`` (``RunQueue.queued(priority)``) the training Job (its fabric check included) is created suspended in a
Kueue LocalQueue and starts when Kueue admits it (pods.py ``queued_job`` says what Kueue then owns).

Its inputs are a few typed parts (args.py: Placement, Size, PerRunClaims | WholeVolume, EtcdStore | C10d,
Results); the builders take the values computed from them once (info.py ``JobInfo``), and it builds Kubernetes
objects only: images, roles and policies come from ``eks_ddp.infra``. Every pod is built by pods.py (the image by digest as uid 1000, read-only root filesystem, the shared volume,
no service-account token) and has a NetworkPolicy. Only the training pods, which upload the results, run as
the ServiceAccount with the uploader role (``<name>-trainer``); the S3 stage as ``<name>-stage`` (read-only on
its prefix); everything else as ``<name>-worker``, which has no IAM role, so the pod-identity webhook (which
mutates by ServiceAccount name, whatever ``automountServiceAccountToken`` says) gives them no AWS credentials.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core.workload import (
    FATAL_CODES_ENV,
    FATAL_EXIT_CODES,
    Cifar10Data,
    Egress,
    S3Data,
    Workload,
    compile_cache_env,
)
from eks_ddp.workloads.elastic_job.args import (  # noqa: F401 (API)
    DEFAULT_FAULT_BUDGET,
    C10d,
    ElasticJobArgs,
    EtcdStore,
    PerRunClaims,
    Placement,
    Queued,
    Results,
    Size,
    WholeVolume,
)
from eks_ddp.workloads.elastic_job.checks import claim_run_dir, validate
from eks_ddp.workloads.elastic_job.data_stage import create_s3_stage
from eks_ddp.workloads.elastic_job.fabric_gate import CONTAINER as FABRIC_CONTAINER
from eks_ddp.workloads.elastic_job.fabric_gate import fabric_gate
from eks_ddp.workloads.elastic_job.image_check import create_image_check
from eks_ddp.workloads.elastic_job.info import FIELD_ENV, JobInfo, job_info
from eks_ddp.workloads.elastic_job.pods import (  # noqa: F401 (TRAINER_UID, GPUDIRECT_RDMA_FAMILIES, NCCL_NET_PLUGIN: API)
    C10D_PORT,
    EFA_RESOURCE,
    EGRESS_EXCEPT,
    GPU_RESOURCE,
    GPUDIRECT_RDMA_FAMILIES,
    JOB_IMMUTABLE_FIELDS,
    NCCL_NET_PLUGIN,
    PART_OF,
    QUEUE_REPLACE,
    TRAINER_LABELS,
    TRAINER_UID,
    meta,
    nccl_env,
    one_per_node,
    pod_resources,
    queued_job,
    resources,
)
from eks_ddp.workloads.elastic_job.stages import (  # noqa: F401 (EVAL_RUN_DIR_ENV: API)
    EVAL_RUN_DIR_ENV,
    EVALUATE_LABELS,
    PREPARE_LABELS,
    create_evaluate_cronjob,
    create_prepare_job,
)
from eks_ddp.workloads.namespace import dns_egress
from eks_ddp_runtime.contract import LOGS_SUBDIR, RESULTS_KMS_KEY_ENV, RESULTS_URL_ENV, USAGE
from eks_ddp_runtime.exitcodes import FABRIC_FAILED
from eks_ddp_runtime.launch_command import (
    AGENT_ENV,
    SHARED_ROOT,
    AgentOptions,
    cluster_timeouts,
    module_command,
    script_command,
)

TRAINER_FATAL_EXIT_CODES = FATAL_EXIT_CODES
"""The bundled trainer's fatal codes (config error, divergence, unreadable input): ``eks_ddp_runtime.contract.FATAL``.
A workload's own: ``Workload.fatal_exit_codes``."""
EGRESS_ANNOTATION = "eks-ddp/egress"
"""The training Job's annotation listing ``workload.egress`` (JSON): what components/eks_ddp/tooling/contracts/network.py checks the
rendered NetworkPolicy against."""
USAGE_EXIT_CODE = USAGE
"""argparse's usage error: the agent's own command line is wrong."""
# Exit codes no retry can fix (the workload's ``bug_exit_codes``; the bundled trainer's: the usage error and
# TRAINER_FATAL_EXIT_CODES) fail the Job through the pod failure policy. A missing or non-executable binary is a
# container StartError, not an exit code 126/127, and a worker's own exit reaches the pod only through the
# launcher, which passes these codes on.

def trainer_service_account(name: str) -> str:
    """The ServiceAccount of ElasticJob ``name``'s training pods (``<name>-trainer``): known before the job exists,
    so a results bucket's upload role can trust it."""
    return f"{name}-trainer"


def rdzv_client_labels(name: str, run_id: str) -> list[dict[str, str]]:
    """Label sets of ElasticJob ``name``'s pods that use the rendezvous store (its training Job's, whose init
    container runs the fabric check too): known before the job exists, so a store of the run's own
    (EtcdRendezvousArgs ``client_labels``, ``more_client_labels``) admits exactly them."""
    return [{**TRAINER_LABELS, "app.kubernetes.io/instance": f"{name}-{run_id}"}]


class ElasticJob(pulumi.ComponentResource):
    """Data preparation Job → elastic training Job → evaluation CronJob, with their NetworkPolicies."""

    job_name: str
    follow_command: pulumi.Output[str]
    """``kubectl logs -f`` over every agent of the training Job."""
    logs_location: pulumi.Output[dict]
    """The kept logs' folder and claim (``logs`` in the stack's ``runs`` output)."""
    evaluate_command: pulumi.Output[str] | None
    """``kubectl create job --from=cronjob/...``: re-runs the evaluation (None without ``workload.evaluate``). A shell line (it names the Job
    after ``$(date +%s)``): ``eval "$(pulumi stack output evaluateCommand)"``."""

    def __init__(self, name: str, args: ElasticJobArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:elastic_job:ElasticJob", name, None, opts)
        self.args = a = args
        """The job's inputs (read-only)."""
        validate(name, args)
        claim_run_dir(name, args)
        child = pulumi.ResourceOptions(parent=self)
        irsa = {"eks.amazonaws.com/role-arn": a.results.role_arn} if a.results is not None else None
        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta(trainer_service_account(name), a.namespace,
                                                                     PART_OF, irsa),
                                        automount_service_account_token=False, opts=child)
        # No role annotation: pods that never upload get no web-identity token and no AWS_ROLE_ARN.
        worker = k8s.core.v1.ServiceAccount(f"{name}-worker-sa", metadata=meta(f"{name}-worker", a.namespace, PART_OF),
                                            automount_service_account_token=False, opts=child)
        self.info = info = job_info(name, args, trainer_sa=sa.metadata.name, worker_sa=worker.metadata.name)
        """The computed values every builder takes (info.py)."""
        self.job_name = info.job_name
        self.instance = info.instance
        """The GPU instance type the job runs on, from the catalog."""
        self.run_dir = info.run_dir
        """The run's directory in every pod (checkpoints, model, metrics): the workers' EKS_DDP_RUN_DIR."""
        self.service_account_name = trainer_service_account(name)
        """The training pods' ServiceAccount: the one ``ResultsBucketArgs.service_account`` must name."""
        self.image = info.agent_image
        """The training (and fabric-check) pods' image: the workload's, else the stack's."""

        create_network_policies(info, child)
        data = a.workload.data
        # The CIFAR-10 download only for the bundled data set; a workload without data trains on what it brings.
        prepare = [create_prepare_job(info, name, child)] if isinstance(data, Cifar10Data) else \
            [create_s3_stage(info, name, child)] if isinstance(data, S3Data) else []
        prepare += create_image_check(info, name, child)  # a workload's own image, on a system node (image_check.py)
        endpoint: pulumi.Input[str]
        if isinstance(a.rendezvous, C10d):
            # The FQDN: kubelet writes it into the pod's /etc/hosts, so index 0 recognises itself as the
            # store's host without DNS (a short name can hit a cached NXDOMAIN from before the pod existed).
            endpoint = pulumi.Output.all(create_headless_service(info, child), a.namespace).apply(
                lambda v: f"{info.job_name}-0.{v[0]}.{v[1]}.svc.cluster.local:{C10D_PORT}")
        else:
            endpoint = a.rendezvous.endpoint
        if a.state == "run":
            create_train_job(info, endpoint, prepare, child)
        if a.workload.evaluate:
            create_evaluate_cronjob(info, name, child)

        ns = pulumi.Output.from_input(a.namespace)
        self.follow_command = ns.apply(
            lambda n: f"kubectl -n {n} logs -f --prefix --max-log-requests={a.size.nodes + 1} "
                      f"-l app.kubernetes.io/instance={info.job_name}")
        # The kept logs (eks_ddp_runtime/runlogs.py) on the claim holding the run's directory, and what a reader pod
        # needs to mount it (the eks-ddp command, components/eks_ddp/tooling/runs/kubectl.py): the image has a shell.
        claim, mount = (a.storage.run, info.run_dir) if isinstance(a.storage, PerRunClaims) else \
            (a.storage.claim, SHARED_ROOT)
        self.logs_location = pulumi.Output.all(ns, claim, info.pods.image, a.placement.system_node_selector).apply(
            lambda v: {
                "dir": f"{info.run_dir}/{LOGS_SUBDIR}", "claim": v[1], "mountPath": mount, "namespace": v[0],
                "job": info.job_name, "image": v[2], "nodeSelector": dict(v[3] or {}),
                "files": "<pod>/agent.log, <pod>/rank-<global rank>.log, <pod>/failures.jsonl, <pod>/exit.json",
                "read": f"eks-ddp status {a.run_id}; eks-ddp logs {a.run_id} [--rank N] [--follow]"})
        """Where the run's kept logs are (``<run dir>/logs`` on ``claim``) and what reading them off the volume needs,
        once the pods are gone (``eks-ddp logs``)."""
        self.evaluate_command = ns.apply(
            lambda n: f"kubectl -n {n} create job --from=cronjob/{info.evaluate_name} "
                      f"{info.evaluate_name}-$(date +%s)") if a.workload.evaluate else None
        self.register_outputs({"job_name": self.job_name, "follow_command": self.follow_command,
                               "evaluate_command": self.evaluate_command})

    def train_command(self, endpoint: str) -> list[str]:
        """The agent's command line, from the one shared builder (training/runtime/eks_ddp_runtime/launch_command.py)."""
        return train_command(self.info, endpoint)

    def commands(self, results_url: pulumi.Input[str], *, region: str, profile: str | None, state_key: str
                 ) -> pulumi.Output[dict]:
        """Shell lines for this run: follow its log, its Job's status, cancel it (``state_key``: the stack key
        that makes the cancel final), fetch its results; where its logs are kept after the pods are gone
        (``eks-ddp status|logs|cancel|fetch <runId>`` reads this entry of the stack's ``runs`` output)."""
        flag, job, run_id = f" --profile {profile}" if profile else "", self.job_name, self.args.run_id
        # Stops the pods at once (no `up` needed); the key makes it final: the next `up` removes the Job. Checkpoints
        # stay. Unqueued: suspend (the program never sets spec.suspend, so no `up` resumes it). Queued: Kueue
        # unsuspends a suspended Job whose Workload is admitted (jobframework/reconciler.go, "Job admitted,
        # unsuspending"), so the Job is deleted; its Workload, owned by the Job, goes with it.
        stop = "delete job {job} --ignore-not-found" if self.args.queue is not None else \
            "patch job {job} --type=merge -p '{{\"spec\":{{\"suspend\":true}}}}'"
        return pulumi.Output.all(self.follow_command, self.args.namespace, results_url, self.logs_location).apply(
            lambda v: {
                "follow": v[0],
                "logs": v[3],
                "status": f"kubectl -n {v[1]} get job {job} -o wide",
                "cancel": f"kubectl -n {v[1]} {stop.format(job=job)} && pulumi config set --path '{state_key}' "
                          "cancelled",
                "fetchResults": f"eks-ddp-fetch-results {v[2]} --region {region} --out results/{run_id}{flag}",
            })


def create_headless_service(info: JobInfo, child: pulumi.ResourceOptions) -> pulumi.Output[str]:
    """c10d: the Job's subdomain gives the pod of index 0 the stable name <job>-0.<service>."""
    svc = k8s.core.v1.Service(
        f"{info.name}-rdzv",
        metadata=info.meta(info.job_name, info.train_labels),
        spec=k8s.core.v1.ServiceSpecArgs(
            cluster_ip="None", publish_not_ready_addresses=True,
            selector={"app.kubernetes.io/instance": info.job_name},
            ports=[k8s.core.v1.ServicePortArgs(name="rdzv", port=C10D_PORT, target_port=C10D_PORT)]),
        opts=child)
    return svc.metadata.name


def train_command(info: JobInfo, endpoint: str) -> list[str]:
    """The agent's command line, from the one shared builder (training/runtime/eks_ddp_runtime/launch_command.py)."""
    a = info.spec
    agent = AgentOptions(
        min_nodes=a.size.min_nodes, max_nodes=a.size.nodes, nproc_per_node=info.instance.gpus,
        rdzv_backend=a.rendezvous.backend, rdzv_endpoint=endpoint,
        # $(VAR) is expanded by the kubelet: the Job's uid is unique per Job, stable across pod retries.
        rdzv_id="$(JOB_UID)", local_addr="$(POD_IP)",
        max_restarts=a.size.max_restarts, timeouts=cluster_timeouts(a.size.nodes))
    w = a.workload
    args = w.rendered_args(run_dir=info.run_dir, data_dir=info.data_dir)
    return module_command(agent, w.module, args) if w.module is not None else \
        script_command(agent, str(w.script), args)


def create_train_job(info: JobInfo, endpoint: pulumi.Input[str], after: list[pulumi.Resource],
                     child: pulumi.ResourceOptions) -> k8s.batch.v1.Job:
    """The Indexed training Job, one agent per node (first the fabric check, with ``fabric_check``), created after
    ``after`` (the data stage)."""
    a, it, name = info.spec, info.instance, info.name
    efa, size = a.placement.efa, a.size
    c10d = isinstance(a.rendezvous, C10d)
    cpu, memory, shm = pod_resources(it)
    devices = {GPU_RESOURCE: it.gpus, **({EFA_RESOURCE: it.efa_interfaces} if efa else {})}
    # EFA needs an unlimited RLIMIT_MEMLOCK to register memory; a non-root container cannot raise it
    # (and 'restricted' forbids IPC_LOCK), so it comes from the node's container runtime.
    # The compile cache on the run's volume (outlives the pod), under what the workload sets itself.
    env = {**compile_cache_env(a.workload, info.run_dir), **a.workload.env, **AGENT_ENV, **nccl_env(it, efa),
           **info.workload_env()}
    # The launcher stops at once on the codes the pod failure policy fails the Job on (no restarts spent).
    env[FATAL_CODES_ENV] = ",".join(map(str, bug_exit_codes(a.workload)))
    if a.results is not None:
        env[RESULTS_URL_ENV] = a.results.url  # type: ignore[assignment]  # an Output is a valid value
        if a.results.kms_key_arn is not None:
            env[RESULTS_KMS_KEY_ENV] = a.results.kms_key_arn  # type: ignore[assignment]
    template = info.pods.pod(
        info.train_labels, "trainer", pulumi.Output.from_input(endpoint).apply(lambda e: train_command(info, e)),
        resources(str(cpu), f"{memory}Gi", devices), env=env, field_env=FIELD_ENV, shm_gib=shm,
        grace_seconds=60, affinity=one_per_node(info.job_name), subdomain=info.job_name if c10d else None,
        uploads=True, rdzv_tls=True, image=info.agent_image,
        ports=[k8s.core.v1.ContainerPortArgs(name="rdzv", container_port=C10D_PORT)] if c10d else None,
        init=fabric_gate(info, endpoint) if a.fabric_check else None)

    # Failure handling (restartPolicy Never: a failed pod is replaced by a new pod of the same index, which
    # joins the running job at its next rendezvous round; the launcher never closes the rendezvous on a
    # transient failure, so the replacement can join):
    # - a pod lost with its node, drained, evicted or preempted gets the DisruptionTarget condition:
    #   Ignore, i.e. replace it without counting; the survivors keep training with >= min_nodes;
    # - exit codes no retry can fix (the workload's bug_exit_codes) fail the whole Job at once;
    # - any other pod failure (an OOM kill, the launcher giving up) counts against backoffLimit, the
    #   run's fault budget. One budget for the run, not backoffLimitPerIndex: the Job controller checks
    #   failed indexes before the success policy, so an index that spent its budget would turn a
    #   finished run into Failed (FailedIndexes) however the other agents ended.
    # podReplacementPolicy Failed: a replacement starts only once the old pod is gone, so two agents of
    # one index never compete for a rendezvous slot.
    # - the fabric check's verdict (its init container exits FABRIC_FAILED) fails the Job before training starts.
    failure_policy = k8s.batch.v1.PodFailurePolicyArgs(rules=[
        *([k8s.batch.v1.PodFailurePolicyRuleArgs(action="FailJob", on_exit_codes=(
            k8s.batch.v1.PodFailurePolicyOnExitCodesRequirementArgs(
                container_name=FABRIC_CONTAINER, operator="In", values=[FABRIC_FAILED])))] if a.fabric_check else []),
        k8s.batch.v1.PodFailurePolicyRuleArgs(action="FailJob", on_exit_codes=(
            k8s.batch.v1.PodFailurePolicyOnExitCodesRequirementArgs(
                container_name="trainer", operator="In", values=bug_exit_codes(a.workload)))),
        k8s.batch.v1.PodFailurePolicyRuleArgs(action="Ignore", on_pod_conditions=[
            k8s.batch.v1.PodFailurePolicyOnPodConditionsPatternArgs(type="DisruptionTarget", status="True")]),
    ])
    # Success: the first agent to exit 0 means training is done (an agent exits 0 only after its worker
    # group finished, and the trainer's last barrier follows rank 0's final writes). The controller then
    # stops the lingering pods, a replacement still Pending included, and the Job is Complete; once
    # SuccessCriteriaMet is set no later pod failure is evaluated.
    success_policy = k8s.batch.v1.SuccessPolicyArgs(rules=[k8s.batch.v1.SuccessPolicyRuleArgs(succeeded_count=1)])
    deadline = None if size.active_deadline_hours is None else int(size.active_deadline_hours * 3600)
    annotations = {
        # Not awaited: `pulumi up` returns once the Job exists; training runs for as long as it needs.
        "pulumi.com/skipAwait": "true",
        # A spec change replaces the Job under the same name (delete, then create). With the default
        # foreground deletion the old Job lingers until its pods are gone and the create fails with 409
        # "object is being deleted"; background deletion removes the Job at once (Jobs carry no finalizer)
        # and the garbage collector removes its pods.
        "pulumi.com/deletionPropagationPolicy": "background",
    }
    if a.workload.egress:  # what the workload declared, beside the rules rendered from it (the network contract)
        annotations[EGRESS_ANNOTATION] = json.dumps([e.record() for e in a.workload.egress])
    queue_labels, queue_annotations, kueue_owns = queued_job(a.queue, size.nodes, size.min_nodes)
    return k8s.batch.v1.Job(
        f"{name}-train",
        metadata=info.meta(info.job_name, {**info.train_labels, **queue_labels}, {**annotations, **queue_annotations}),
        spec=k8s.batch.v1.JobSpecArgs(
            suspend=True if a.queue is not None else None,
            completion_mode="Indexed", completions=size.nodes, parallelism=size.nodes,
            backoff_limit=size.fault_budget, success_policy=success_policy, active_deadline_seconds=deadline,
            pod_failure_policy=failure_policy, pod_replacement_policy="Failed",
            ttl_seconds_after_finished=size.ttl_seconds_after_finished, template=template),
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=after, delete_before_replace=True,
            # Queued: spec.suspend (and with partial admission spec.parallelism) are Kueue's (queued_job). Never
            # ignored unqueued: Pulumi carries an ignored input's old value into a replacement (the engine's
            # processIgnoreChanges), which would leave a Job that left the queue suspended for good.
            ignore_changes=kueue_owns, replace_on_changes=[*JOB_IMMUTABLE_FIELDS, QUEUE_REPLACE])))


def create_network_policies(info: JobInfo, child: pulumi.ResourceOptions) -> None:
    """The training pods' NetworkPolicy, and the bundled trainer's prepare and evaluate pods'."""
    a, name = info.spec, info.name
    net = k8s.networking.v1
    dns = dns_egress()
    peers = [net.NetworkPolicyPeerArgs(pod_selector=k8s.meta.v1.LabelSelectorArgs(
        match_labels={"app.kubernetes.io/instance": info.job_name}))]
    # Agents talk to each other on any TCP port (torch's TCPStore, gloo, NCCL's bootstrap and sockets pick
    # ports at run time); EFA traffic bypasses the IP stack. Out of the namespace they reach only DNS and etcd.
    tcp = [net.NetworkPolicyPortArgs(protocol="TCP")]
    train_egress = [dns, net.NetworkPolicyEgressRuleArgs(to=peers, ports=tcp)]
    if isinstance(a.rendezvous, EtcdStore):
        train_egress.append(info.store_egress())
    # Data preparation downloads CIFAR-10 over HTTPS (through the NAT gateway); the trainers reach S3 and STS
    # over HTTPS. TLS only (no port 80: nothing leaves in cleartext), never the instance metadata service,
    # nor the VPC's own ranges beyond what other rules admit.
    internet = egress_rule(Egress.internet(443))
    # HTTPS to public addresses for the results upload (S3) and the role's credentials (STS); then the same
    # declared by the workload adds nothing.
    aws_https = [Egress.internet(443)] if a.results is not None else []
    train_egress += [egress_rule(e) for e in (*aws_https, *(e for e in a.workload.egress if e not in aws_https))]
    data = a.workload.data
    for suffix, labels, ingress, egress in (
        ("train", {"app.kubernetes.io/instance": info.job_name},
         [net.NetworkPolicyIngressRuleArgs(from_=peers, ports=tcp)], train_egress),
        # The bundled trainer's own pods: only when it runs them.
        *([("prepare-data", PREPARE_LABELS, [], [dns, internet])] if isinstance(data, Cifar10Data) else []),
        *([("evaluate", EVALUATE_LABELS, [], [dns])] if a.workload.evaluate else []),
    ):
        net.NetworkPolicy(
            f"{name}-{suffix}-netpol",
            metadata=info.meta(f"{name}-{suffix}", labels),
            spec=net.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(labels)),
                policy_types=["Ingress", "Egress"], ingress=ingress, egress=egress),
            opts=child)


def egress_rule(e: Egress) -> k8s.networking.v1.NetworkPolicyEgressRuleArgs:
    """A declared destination as one egress rule: its addresses (an ipBlock) on its ports."""
    net = k8s.networking.v1
    return net.NetworkPolicyEgressRuleArgs(
        to=[net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=e.cidr, except_=list(e.except_) or None))],
        ports=[net.NetworkPolicyPortArgs(port=p, protocol=e.protocol) for p in e.ports])


def bug_exit_codes(w: Workload) -> list[int]:
    """The exit codes that fail the Job at once: argparse's usage error, the runtime's FATAL codes (the launcher
    exits with them whatever the workload; 5 is also its verdict on S3 data that fails its manifest or pin) and the
    workload's own."""
    return sorted({USAGE_EXIT_CODE, *TRAINER_FATAL_EXIT_CODES, *w.fatal_exit_codes})
