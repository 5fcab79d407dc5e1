"""The inputs of :class:`~eks_ddp.workloads.elastic_job.ElasticJob` and each field's own checks, run once, where
the Args are built (a bad value fails there, naming the field)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pulumi

from eks_ddp.core import rules
from eks_ddp.core.torchrun import DEFAULT_MAX_RESTARTS
from eks_ddp.core.types import RdzvBackend, RunState
from eks_ddp.core.workload import Workload, cifar10_workload
from eks_ddp.infra.workload_image import SCAN_SEVERITIES

if TYPE_CHECKING:
    from eks_ddp.infra.gpu_nodegroup import GpuNodeGroup

DEFAULT_FAULT_BUDGET = 20
"""Pod failures a run absorbs by default: spot capacity can take a node many times in one run."""


@dataclass(frozen=True, kw_only=True)
class ElasticJobArgs:
    """Inputs of :class:`ElasticJob`."""

    namespace: pulumi.Input[str]
    """Namespace of every object (Pod Security 'restricted')."""
    image: pulumi.Input[str]
    """The stack's image by digest (``repo@sha256:...``): the bundled trainer's; a ``workload.image`` replaces it in
    the training, fabric-check and S3-stage pods."""
    pvc_name: pulumi.Input[str] | None = None
    """A ReadWriteMany claim of the whole shared volume, mounted at /shared in every pod. Prefer
    ``data_claim`` + ``run_claim`` (what the stack uses): then no pod sees another run's directory."""
    data_claim: pulumi.Input[str] | None = None
    """The dataset's claim (EfsStore.data_claim_name), mounted at /shared/data: read-write in the data stage,
    read-only in every other pod."""
    data_read_only_claim: pulumi.Input[str] | None = None
    """The dataset's read-only claim (EfsStore.data_read_only_claim_name), with ``data_claim``: every pod but the
    data stage mounts it instead, so EFS itself refuses their writes to the dataset."""
    run_claim: pulumi.Input[str] | None = None
    """This run's claim (EfsStore.run_claim_name), mounted at /shared/runs/<run_id> in the training, fabric-check
    and evaluation pods; the data stage does not mount it."""
    instance_type: str
    """GPU instance type of the job's node group: drives --nproc-per-node, GPU/EFA/CPU/memory sizing."""
    efa: bool = False
    """The node group attaches EFA interfaces: request them and configure NCCL for libfabric."""
    node_selector: pulumi.Input[Mapping[str, str]] | None = None
    """Labels of the job's GPU node group."""
    system_node_selector: pulumi.Input[Mapping[str, str]] | None = None
    """Labels of the CPU system nodes. Data preparation runs there: it needs no GPU, and a GPU group scaled
    to zero would leave it Pending (and ``pulumi up``, which awaits it, hanging). None: no nodeSelector; the
    pod still never lands on a GPU node, since it does not tolerate their taint."""
    node_group: GpuNodeGroup | None = None
    """The job's GPU node group: ``nodes`` may not exceed its ``max_size``. Unset: the group of this program that
    ``node_selector`` selects (its ``node_labels``), when there is one."""
    nodes: int = 2
    """torchrun agents (one pod per node): the max of --nnodes."""
    min_nodes: int = 1
    """Fewest agents training continues with: the min of --nnodes."""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """torchrun --max-restarts: the fault budget per agent (each crash or lost node costs one restart)."""
    run_id: str = "run-1"
    """Run name: the run directory is /shared/runs/<run_id>; part of the Job's name."""
    rdzv_backend: RdzvBackend = "etcd-v2"
    """'etcd-v2' (needs rdzv_endpoint) or 'c10d' (the agent of index 0 hosts the store)."""
    rdzv_endpoint: pulumi.Input[str] | None = None
    """etcd client endpoint host:port (EtcdRendezvous.endpoint); None with c10d."""
    rdzv_tls_secret: pulumi.Input[str] | None = None
    """Secret with the rendezvous client certificate (tls.crt, tls.key, ca.crt; EtcdRendezvous.client_tls_secret),
    mounted read-only into the agents' pods; required with etcd-v2, whose store demands a client certificate."""
    rdzv_server_labels: Mapping[str, str] | None = None
    """The store Service's selector (same namespace): the training and fabric-check pods' egress rule to the client
    port selects exactly these labels, which admits the Service's ClusterIP on EKS (``etcd_client_egress``). None:
    the selector of the EtcdRendezvous whose ``endpoint`` is ``rdzv_endpoint`` (``EtcdRendezvous.server_selector``);
    set it for a store of your own."""
    workload: Workload = field(default_factory=cifar10_workload)
    """What the agents run (components/eks_ddp/core/workload.py): a module or script, its args, env, image and data; default:
    the bundled CIFAR-10 trainer (``cifar10_workload()``)."""
    data_role_arn: pulumi.Input[str] | None = None
    """With ``S3Data``: the IAM role (IRSA) the S3 data stage's ServiceAccount ``<name>-stage`` assumes
    (components/eks_ddp/infra/iam.py ``data_stage_role``: list and read that prefix only); required then."""
    results_role_arn: pulumi.Input[str] | None = None
    """IAM role (IRSA) the trainer's service account assumes to upload results (components/eks_ddp/infra/results.py)."""
    results_url: pulumi.Input[str] | None = None
    """``s3://<bucket>/runs/<run_id>/``: rank 0 uploads the run's results there at the end (HTTPS egress opened)."""
    results_kms_key_arn: pulumi.Input[str] | None = None
    """The results bucket's KMS key (ResultsBucket.kms_key_arn): the uploader writes every object under it."""
    fault_budget: int = DEFAULT_FAULT_BUDGET
    """Pod failures the whole run may have before the Job fails (the Job's backoffLimit). Pods lost with
    their node, drained, evicted or preempted never count; exit codes in ``BUG_EXIT_CODES`` fail at once."""
    active_deadline_hours: float | None = 48
    """Hours the training Job may stay active, Pending time included, before Kubernetes stops it
    (DeadlineExceeded); None: no limit. Bounds a job whose pods wait for GPU capacity that never comes."""
    ttl_seconds_after_finished: int | None = None
    """Seconds a finished training Job (and its pod logs) is kept; None (the default): kept until the run is removed.
    A Complete Job holds no pods. Once a Job is gone, ``pulumi up --refresh`` (every ``up`` of this project's
    ``Pulumi.yaml``) creates it again, and the new Job resumes the run; its launcher ends at once in a run
    directory that holds the final marker of the same command (eks_ddp_runtime/launch.py)."""
    state: RunState = "run"
    """'run', or 'cancelled': no training Job (nor fabric check) is rendered, so a cancelled run stays cancelled
    whatever later ``up``s refresh or replace; checkpoints stay, and 'run' again resumes from them."""
    data_prep_timeout: str = "40m"
    """How long ``pulumi up`` waits for data preparation (fresh nodes pull a multi-GB image first); longer
    than the Job's own 30-minute deadline, so a stuck download surfaces as the Job's failure."""
    fabric_check: bool = False
    """Run ``eks_ddp_runtime.fabric_check`` on every node of the job first, in a Job Pulumi awaits: the training Job
    is created only after it passed (EFA transport when ``efa``, the catalog's bandwidth floor)."""
    fabric_check_timeout: str = "40m"
    """How long ``pulumi up`` waits for the fabric check (nodes may be launching and pulling the image)."""
    node_role_name: pulumi.Input[str] | None = None
    """IAM role of the nodes the job runs on (``EksCluster.node_role_name``). With it, a ``workload.image`` in ECR
    (given as a string) gets a pull-only grant on exactly its repository (components/eks_ddp/infra/workload_image.py), so
    you never rebuild the repository ARN yourself. None: the node role must already be allowed to pull it
    (an ``EksCluster``'s role is not: it pulls only what it was granted)."""
    image_scan_fail_severity: str = "CRITICAL"
    """A ``workload.image`` in ECR (given as a string) passes the ECR scan gate before any pod gets it: findings at
    or above this severity fail ``pulumi up``; ``disabled`` runs it unscanned. An Output image is taken as it is
    (gate it with :class:`eks_ddp.infra.workload_image.WorkloadImage`)."""
    aws_profile: str | None = None
    """The AWS profile the scan gate reads ECR with (it runs in the program, with boto3)."""

    def __post_init__(self) -> None:
        check_rules(self)  # a bad value fails where the Args are built, naming the field


def check_rules(a: ElasticJobArgs) -> None:
    # The stack config's rules, under the Python field names (components/eks_ddp/core/rules.py holds each one once).
    rules.require(
        rules.whole("nodes", a.nodes), rules.whole("min_nodes", a.min_nodes),
        rules.whole("max_restarts", a.max_restarts, 0),
        None if isinstance(a.workload, Workload) else
        f"workload: got {a.workload!r}; expected a Workload (components/eks_ddp/core/workload.py), e.g. cifar10_workload()",
        rules.namespace("namespace", a.namespace) if isinstance(a.namespace, str) else None,
        rules.image_by_digest("image", a.image) if isinstance(a.image, str) else None,
        None if a.image_scan_fail_severity in SCAN_SEVERITIES else
        f"image_scan_fail_severity: got {a.image_scan_fail_severity!r}; expected one of {', '.join(SCAN_SEVERITIES)}",
    )
