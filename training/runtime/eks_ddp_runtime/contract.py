"""The values the library (``eks_ddp``), the runtime and the bundled trainer share, defined once: exit codes,
environment variable names, the shared volume's paths. Standard library only and no imports at all, so the library
imports it without torch (import-linter: ``library-without-torch``) and every package reads the same numbers.
"""

# --- exit codes of a worker (and of the launcher, which passes them on) -------------------------------------------
CONFIG_ERROR = 3
"""A bad trainer flag or value (argparse errors included): the command line must be fixed."""
DIVERGED = 4
"""Training diverged: the loss or the weights became non-finite. Nothing non-finite was checkpointed."""
BAD_INPUT = 5
"""The data set or the checkpoints are unreadable (a named file is corrupt or missing)."""
FABRIC_FAILED = 6
"""The fabric check found the network unfit (no EFA, TCP transport, low bandwidth); the fabric check's only (it runs
as the training pods' init container, and this code fails their Job)."""
AGENT_LOST = 7
"""A worker found its agent (the launcher process that holds its lease) gone: nothing can renew the lease, so the
worker stops instead of waiting for ever. Not fatal: a new agent restarts the work."""
SUPERSEDED = 8
"""A worker found its world replaced by a newer world that another rendezvous store holds (two live stores over one
run directory: the fence files on the shared volume say so, its own store does not). The worker stops; its agent does
not restart it into its own store (that world would fence the live one out) and exits with this code. Not fatal: the
Job retries the pod, and a new pod reaches the store the Service names."""
FATAL = (CONFIG_ERROR, DIVERGED, BAD_INPUT)
"""The bundled trainer's codes no retry can fix: the pod failure policy fails the Job on them and the launcher does
not restart the workers."""
USAGE = 2
"""A usage error: argparse's exit status for a bad argument, and Python's for a script it cannot open."""

# --- environment a Job gives its pods --------------------------------------------------------------------------------
RUN_DIR_ENV = "EKS_DDP_RUN_DIR"
"""The run's directory (``/shared/runs/<run_id>``): checkpoints go there; resume from the newest one."""
DATA_DIR_ENV = "EKS_DDP_DATA_DIR"
"""The staged data set's directory (read-only in the training pods)."""
DATA_VERIFY_ENV = "EKS_DDP_DATA_VERIFY"
"""How the data stage and the workers check the data set (``S3Data.verify``)."""
DATA_PIN_ENV = "EKS_DDP_DATA_PIN"
"""The data set the bundled trainer's loaders accept."""
CIFAR10_PIN = "cifar-10"
"""The pin of the official CIFAR-10 files (their published checksums)."""
FABRIC_JSON = "fabric.json"
"""The fabric check's report in the run's directory (fabric_check.py ``Report``), which ``eks-ddp status`` reads."""
FABRIC_NODE_REPORT_PREFIX = "fabric-node-"
"""A late node's failed node-only check: ``<run dir>/fabric-node-<node>.json`` (fabric_check.py
``write_node_report``), which ``eks-ddp status`` lists."""
NODE_NAME_ENV = "NODE_NAME"
"""The fabric check pod's Kubernetes node (downward API ``spec.nodeName``): how fabric_check.py names a slow node."""
FATAL_CODES_ENV = "EKS_DDP_FATAL_EXIT_CODES"
"""A workload's own fatal worker exit codes, comma-separated: the launcher stops at once on these too."""
RESULTS_URL_ENV = "EKS_DDP_RESULTS_URL"
"""``s3://bucket/runs/<run_id>/``: where rank 0 uploads the run's results."""
RESULTS_KMS_KEY_ENV = "EKS_DDP_RESULTS_KMS_KEY"
"""The KMS key the results upload names (SSE-KMS), when the bucket uses one."""

# --- the shared volume ------------------------------------------------------------------------------------------------
SHARED_ROOT = "/shared"
"""Where every pod mounts the shared volume."""
DATA_SUBDIR = "data"
RUNS_SUBDIR = "runs"
LOGS_SUBDIR = "logs"
"""In a run's directory: what the launcher keeps of every agent and worker (runlogs.py), read by ``eks-ddp``."""
