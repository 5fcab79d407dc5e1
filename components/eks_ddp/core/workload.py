"""What an ElasticJob trains: a Python module or script in an image, its arguments, environment and data.

Pure data (no resources, no Pulumi calls): :class:`~.elastic_job.ElasticJob` turns a :class:`Workload` into
the agent command ``python -m eks_ddp_runtime.launch <torchrun flags> (-m MODULE | SCRIPT) args...`` and the
pods around it. Every worker of any workload gets ``EKS_DDP_RUN_DIR`` (``/shared/runs/<run_id>``) and
``EKS_DDP_DATA_DIR`` (the dataset, read-only); ``$(EKS_DDP_RUN_DIR)`` and ``$(EKS_DDP_DATA_DIR)`` in ``args``
are replaced by those paths, as the kubelet would expand them.

:func:`cifar10_workload` is the bundled CIFAR-10 trainer, what the stack's ``job:`` runs.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from eks_ddp.core import rules
from eks_ddp_runtime.contract import (  # noqa: F401 (API) the runtime's contract, defined once (stdlib only)
    AGENT_LOST,
    DATA_DIR_ENV,
    DATA_VERIFY_ENV,
    FATAL_CODES_ENV,
    RUN_DIR_ENV,
    SUPERSEDED,
)
from eks_ddp_runtime.contract import FATAL as FATAL_EXIT_CODES
from eks_ddp_runtime.launch_command import DATA_DIR_REF, RUN_DIR_REF, TRAIN_MODULE
from eks_ddp_trainer.config import ModelName, TrainerConfig


@dataclass(frozen=True, kw_only=True)
class S3Data:
    """A dataset staged once from S3 onto the shared volume (``/shared/data/<name>``), read-only for workers."""

    uri: str
    """The S3 prefix copied, ``s3://bucket/prefix/`` (ending with '/'); every object under it is staged."""
    name: str
    """The dataset's directory under /shared/data (a DNS label, e.g. ``imagenet``)."""
    sha256: str | None = None
    """The pin: the SHA-256 of the manifest the stage writes (it logs it); the stage and every training pod then
    refuse a data set whose manifest differs. None: verified against the manifest alone (catches corruption and
    a change to some files, not a rewrite of the data set together with its manifest)."""

    def __post_init__(self) -> None:
        rules.require(rules.s3_prefix("data.uri", self.uri), rules.dns_label("data.name", self.name),
                      rules.manifest_sha256("data.sha256", self.sha256))

    @property
    def verify(self) -> str:
        """The ``EKS_DDP_DATA_VERIFY`` value of the stage and the training pods."""
        return "manifest" if self.sha256 is None else f"sha256:{self.sha256}"

    @property
    def bucket(self) -> str:
        return self.uri.removeprefix("s3://").split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The key prefix inside the bucket ('' for the whole bucket, else ending with '/')."""
        return self.uri.removeprefix("s3://").split("/", 1)[1]


@dataclass(frozen=True, kw_only=True)
class Cifar10Data:
    """The official CIFAR-10 files, downloaded and checksum-verified into /shared/data by the prepare Job."""


INTERNET_EXCEPT = ("169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
"""Never part of "the internet": link-local (instance metadata, the node's credentials) and every private range a
VPC or its pods can use (the API server's private endpoint, other pods, EFS, anything peered)."""
METADATA_ADDRESS = ipaddress.ip_address("169.254.169.254")


@dataclass(frozen=True, kw_only=True)
class Egress:
    """A destination outside the cluster that a workload's training pods open connections to: the addresses of
    ``cidr`` less ``except_``, on ``ports``. Rendered as one egress rule of the training pods' NetworkPolicy; the
    network contract checks that exactly this is allowed.

    ``Egress.internet(443)`` (YAML ``https``, or ``internet:PORTS``) is every public address: ``0.0.0.0/0`` less
    ``INTERNET_EXCEPT``. A CIDR may not include the instance metadata service (169.254.169.254): its answers are the
    node's credentials."""

    cidr: str
    """An IPv4 network (``10.20.0.0/16``, ``0.0.0.0/0`` with ``except_``)."""
    ports: tuple[int, ...]
    """Destination ports (1-65535), at least one: an egress rule never opens every port."""
    except_: tuple[str, ...] = ()
    """Networks inside ``cidr`` left out."""
    protocol: Literal["TCP", "UDP"] = "TCP"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ports", tuple(self.ports))
        object.__setattr__(self, "except_", tuple(self.except_))
        rules.require(egress_problems("egress", self))

    @classmethod
    def internet(cls, *ports: int) -> Egress:
        """Every public address (not private, not link-local) on ``ports`` (default 443: HTTPS)."""
        return cls(cidr="0.0.0.0/0", except_=INTERNET_EXCEPT, ports=ports or (443,))

    @classmethod
    def parse(cls, key: str, text: Any) -> Egress:
        """The stack file's form: ``https``, ``internet:PORT[,PORT...]`` or ``CIDR:PORT[,PORT...][/udp]``."""
        expected = "'https', 'internet:PORTS' or 'CIDR:PORTS' (e.g. '10.20.0.0/16:5432', 'internet:443,8443')"
        if not isinstance(text, str):
            raise ValueError(f"{key}: got {text!r}; expected {expected}")
        if text == "https":
            return cls.internet(443)
        where, sep, rest = text.rpartition(":")
        protocol: Literal["TCP", "UDP"] = "TCP"
        if rest.lower().endswith("/udp"):
            rest, protocol = rest[:-4], "UDP"
        try:
            ports = tuple(int(p) for p in rest.split(","))
        except ValueError:
            ports = ()
        if not sep or not ports:
            raise ValueError(f"{key}: got {text!r}; expected {expected}")
        try:
            if where == "internet":
                return cls(cidr="0.0.0.0/0", except_=INTERNET_EXCEPT, ports=ports, protocol=protocol)
            return cls(cidr=where, ports=ports, protocol=protocol)
        except ValueError as err:
            text = str(err).replace("egress", key, 1)
            if "instance metadata service" in text:  # the stack form has no except_: name its own way out
                text = (f"{key}.cidr: got {where!r}, which includes the instance metadata service (169.254.169.254: "
                        f"the node's credentials); expected a narrower CIDR, or 'internet:{rest}' for public "
                        "addresses (it leaves out every private and link-local range)")
            raise ValueError(text) from None

    def record(self) -> dict[str, Any]:
        """The declaration as the training Job's ``eks-ddp/egress`` annotation lists it."""
        return {"cidr": self.cidr, "except": list(self.except_), "ports": list(self.ports), "protocol": self.protocol}


def egress_problems(key: str, e: Any) -> list[str]:
    if not isinstance(e, Egress):
        return [f"{key}: got {e!r}; expected Egress(cidr=..., ports=...) or Egress.internet(443)"]
    p: list[str] = []
    try:
        net = ipaddress.ip_network(e.cidr)
        if net.version != 4:
            raise ValueError(e.cidr)
    except ValueError:
        return [f"{key}.cidr: got {e.cidr!r}; expected an IPv4 network such as 10.20.0.0/16 (no host bits)"]
    excepts = []
    for x in e.except_:
        try:
            sub = ipaddress.ip_network(x)
            if sub.version != 4 or not sub.subnet_of(net):
                raise ValueError(x)
            excepts.append(sub)
        except ValueError:
            p.append(f"{key}.except_: got {x!r}; expected IPv4 networks inside {e.cidr}")
    if METADATA_ADDRESS in net and not any(METADATA_ADDRESS in x for x in excepts):
        p.append(f"{key}.cidr: got {e.cidr!r}, which includes the instance metadata service (169.254.169.254: the "
                 "node's credentials); expected a narrower CIDR, or 169.254.0.0/16 in except_ (Egress.internet(...) "
                 "leaves out every private and link-local range)")
    if not e.ports or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65535 for x in e.ports):
        p.append(f"{key}.ports: got {e.ports!r}; expected one or more ports between 1 and 65535")
    if e.protocol not in ("TCP", "UDP"):
        p.append(f"{key}.protocol: got {e.protocol!r}; expected 'TCP' or 'UDP'")
    return p


def iam_statement_problems(key: str, statements: Any) -> list[str]:
    """IAM policy statements a workload's training pods get: each an object with Effect, Action and Resource."""
    if isinstance(statements, (str, bytes, Mapping)) or not isinstance(statements, (tuple, list)):
        return [f"{key}: got {statements!r}; expected a list of IAM statements ({{Effect, Action, Resource}})"]
    p: list[str] = []
    for i, st in enumerate(statements):
        k = f"{key}[{i}]"
        if not isinstance(st, Mapping):
            p.append(f"{k}: got {st!r}; expected an object with Effect, Action and Resource")
            continue
        if unknown := sorted(set(st) - {"Sid", "Effect", "Action", "Resource", "Condition"}):
            p.append(f"{k}: got keys {unknown}; expected Sid, Effect, Action, Resource and Condition (no "
                     "NotAction/NotResource/Principal: they grant more than they name)")
        if st.get("Effect") not in ("Allow", "Deny"):
            p.append(f"{k}.Effect: got {st.get('Effect')!r}; expected 'Allow' or 'Deny'")
        for part, pattern in (("Action", r"^[a-z0-9-]+:[A-Za-z0-9*]+$"), ("Resource", r"^(\*|arn:\S+)$")):
            v = st.get(part)
            values = [v] if isinstance(v, str) else v if isinstance(v, (list, tuple)) else None
            if not values or not all(isinstance(x, str) and re.match(pattern, x) for x in values):
                p.append(f"{k}.{part}: got {v!r}; expected " + (
                    "actions like 's3:GetObject' (a service prefix, never a bare '*')" if part == "Action"
                    else "ARNs (or '*' where the action takes no resource)"))
        try:
            json.dumps(dict(st))
        except (TypeError, ValueError):
            p.append(f"{k}: got {st!r}; expected plain JSON values")
    return p


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A training entrypoint the elastic runtime launches on every node."""

    name: str
    """Short name (a DNS label), shown in labels and messages."""
    module: str | None = None
    """Python module run like ``python -m`` (e.g. ``mypkg.train``); exactly one of module and script."""
    script: str | None = None
    """Script in the image (e.g. ``/app/train.py``); exactly one of module and script."""
    args: tuple[str, ...] = ()
    """Arguments after the module or script; ``$(EKS_DDP_RUN_DIR)``/``$(EKS_DDP_DATA_DIR)`` become the paths."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra environment of every worker (not ``EKS_DDP_*``, which the job sets)."""
    image: Any = None
    """Image of the training pods (``repo@sha256:digest``, with eks-ddp-runtime installed; a ``str`` or a Pulumi
    ``Input[str]``: typed ``Any`` because this pure module imports no Pulumi); None: the stack's."""
    data: S3Data | Cifar10Data | None = None
    """The dataset staged before training; None: no data stage."""
    evaluate: bool = False
    """Add the on-demand test-set evaluation CronJob (the bundled trainer only)."""
    fatal_exit_codes: tuple[int, ...] = FATAL_EXIT_CODES
    """Worker exit codes no retry can fix: the Job fails at once on them."""
    egress: tuple[Egress, ...] = ()
    """Where the training pods connect outside the cluster (an experiment tracker, a package index, a database):
    each becomes an egress rule of their NetworkPolicy, and nothing else opens. Without it they reach only DNS,
    their peers, the rendezvous store, and HTTPS to public addresses when they have an AWS role (S3, STS)."""
    iam_statements: tuple[Mapping[str, Any], ...] = ()
    """IAM policy statements (``{"Effect", "Action", "Resource"[, "Condition"]}``) the training pods need: attached
    to their IRSA role by ``eks_ddp.workload_policy`` (``Results.role_arn``: the one role their ServiceAccount can
    carry), next to the results upload's own permissions. Empty: the pods have that role's permissions only."""

    def __post_init__(self) -> None:
        p: list[str | None | list[str]] = [rules.dns_label("name", self.name)]
        if (self.module is None) == (self.script is None):
            got = f"module {self.module!r} and script {self.script!r}" if self.module else "neither module nor script"
            p.append(f"module/script: got {got}; expected exactly one of module (python -m NAME) or script (a file "
                     "in the image)")
        if self.module is not None:
            p.append(rules.python_module("module", self.module))
        if self.script is not None:
            p.append(rules.script_path("script", self.script))
        if isinstance(self.args, (str, bytes)) or not all(isinstance(x, str) for x in self.args):
            p.append(f"args: got {self.args!r}; expected a tuple of strings")
        if not isinstance(self.env, Mapping):
            p.append(f"env: got {self.env!r}; expected a mapping of variable names to strings")
        else:
            p.append(rules.env_names("env", self.env))
            p += [f"env.{k}: got {v!r}; expected a string" for k, v in self.env.items() if not isinstance(v, str)]
        if self.image is not None and not rules.is_output(self.image):
            p.append(rules.image_by_digest("image", self.image))
        if self.data is not None and not isinstance(self.data, (S3Data, Cifar10Data)):
            p.append(f"data: got {self.data!r}; expected S3Data(uri=..., name=...), Cifar10Data() or None")
        if not self.fatal_exit_codes or not all(
                isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in self.fatal_exit_codes):
            p.append(f"fatal_exit_codes: got {self.fatal_exit_codes!r}; expected exit codes between 1 and 255")
        elif reserved := sorted(set(self.fatal_exit_codes) & {AGENT_LOST, SUPERSEDED}):
            # The Job fails on a fatal code, which would end the live world too: these say only that this pod's
            # world is over (its agent is gone, or another store's world replaced it), and a retried pod rejoins.
            p.append(f"fatal_exit_codes: got {self.fatal_exit_codes!r}; {reserved} are the runtime's own retryable "
                     f"codes ({AGENT_LOST} agent lost, {SUPERSEDED} world replaced elsewhere); expected other codes "
                     "between 1 and 255")
        if isinstance(self.egress, (str, bytes, Egress)) or not isinstance(self.egress, (tuple, list)):
            p.append(f"egress: got {self.egress!r}; expected a tuple of Egress (e.g. (Egress.internet(443),))")
        else:
            p += [q for i, e in enumerate(self.egress) for q in egress_problems(f"egress[{i}]", e)]
        p += iam_statement_problems("iam_statements", self.iam_statements)
        rules.require(*p)
        object.__setattr__(self, "egress", tuple(self.egress))
        object.__setattr__(self, "iam_statements", tuple(MappingProxyType(dict(st)) for st in self.iam_statements))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def entrypoint(self) -> list[str]:
        """What follows the torchrun flags: ``-m MODULE`` or ``SCRIPT``."""
        return ["-m", self.module] if self.module is not None else [str(self.script)]

    def rendered_args(self, *, run_dir: str, data_dir: str) -> list[str]:
        """``args`` with ``$(EKS_DDP_RUN_DIR)`` and ``$(EKS_DDP_DATA_DIR)`` replaced by this run's paths."""
        return [a.replace(RUN_DIR_REF, run_dir).replace(DATA_DIR_REF, data_dir) for a in self.args]


def dataset_name(uri: str) -> str:
    """A dataset directory name for an S3 prefix: its last folder (else the bucket), as a DNS label."""
    rules.require(rules.s3_prefix("data.uri", uri))
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    last = prefix.rstrip("/").rsplit("/", 1)[-1] or bucket
    label = re.sub(r"[^a-z0-9-]+", "-", last.lower()).strip("-")[:63].strip("-")
    return label or "data"


TRAINER_TORCH_VERSION = "2.14.1"
"""The torch the stack's trainer image is built with (docker/Dockerfile ``ARG TORCH_VERSION``; a test keeps them
equal): the compile cache's key."""
COMPILE_CACHE_SUBDIR = "compile-cache"


def compile_cache_env(w: Workload, run_dir: str) -> dict[str, str]:
    """Where the bundled trainer's ``--compile`` keeps Inductor's and Triton's caches on the cluster: the run's
    directory on the shared volume, keyed by torch version and model (``<run dir>/compile-cache/torch-<version>/
    <model>``), so a restarted pod or a replacement node loads the compiled kernels instead of compiling while the
    world waits. Empty (the pod-local ``/tmp`` defaults stay) for a workload that does not compile with the stack's
    image: a user's image sets its own in ``workload.env`` (docs/own-workloads.md)."""
    if w.module != TRAIN_MODULE or w.image is not None or "--compile" not in w.args:
        return {}
    default = TrainerConfig.__dataclass_fields__["model"].default
    model = next((a.split("=", 1)[1] for a in w.args if a.startswith("--model=")), default)
    root = f"{run_dir}/{COMPILE_CACHE_SUBDIR}/torch-{TRAINER_TORCH_VERSION}/{model}"
    return {"TORCHINDUCTOR_CACHE_DIR": root, "TRITON_CACHE_DIR": f"{root}/triton"}


def cifar10_workload(*, epochs: int = 10, global_batch_size: int = 1024, model: ModelName = "airnet",
                     learning_rate: float | None = None, compile: bool = False) -> Workload:
    """The bundled CIFAR-10 trainer (``-m eks_ddp_trainer.train``) with exactly the flags the stack has always run
    (TrainerConfig), on the verified CIFAR-10 files, with the evaluation CronJob."""
    rules.require(rules.whole("epochs", epochs), rules.global_batch("global_batch_size", global_batch_size),
                  rules.model("model", model), rules.learning_rate("learning_rate", learning_rate),
                  None if isinstance(compile, bool) else f"compile: got {compile!r}; expected true or false")
    trainer = TrainerConfig(data_dir=DATA_DIR_REF, run_dir=RUN_DIR_REF, epochs=epochs,
                            global_batch_size=global_batch_size, model=model, lr=learning_rate, compile=compile)
    return Workload(name="cifar10", module=TRAIN_MODULE, args=tuple(trainer.flags()), data=Cifar10Data(),
                    evaluate=True)

