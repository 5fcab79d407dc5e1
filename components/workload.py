"""What an ElasticJob trains: a Python module or script in an image, its arguments, environment and data.

Pure data (no resources, no Pulumi calls): :class:`~.elastic_job.ElasticJob` turns a :class:`Workload` into
the agent command ``python -m eks_ddp_runtime.launch <torchrun flags> (-m MODULE | SCRIPT) args...`` and the
pods around it. Every worker of any workload gets ``EKS_DDP_RUN_DIR`` (``/shared/runs/<run_id>``) and
``EKS_DDP_DATA_DIR`` (the dataset, read-only); ``$(EKS_DDP_RUN_DIR)`` and ``$(EKS_DDP_DATA_DIR)`` in ``args``
are replaced by those paths, as the kubelet would expand them.

:func:`cifar10_workload` is the bundled CIFAR-10 trainer, what the stack's ``job:`` runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from . import rules
from .torchrun import TRAIN_MODULE, TrainerOptions

if TYPE_CHECKING:
    import pulumi

RUN_DIR_ENV = "EKS_DDP_RUN_DIR"
"""The run's directory (``/shared/runs/<run_id>``): checkpoints go there; resume from the newest one."""
DATA_DIR_ENV = "EKS_DDP_DATA_DIR"
"""The dataset's directory, read-only (``/shared/data``, or ``/shared/data/<name>`` for :class:`S3Data`)."""
RUN_DIR_REF = f"$({RUN_DIR_ENV})"
DATA_DIR_REF = f"$({DATA_DIR_ENV})"
FATAL_EXIT_CODES = (3, 4, 5)
"""The runtime's FATAL exit codes (eks_ddp_runtime.exitcodes.FATAL: config error, divergence, bad input): no
retry, the Job fails. tests/test_workload.py keeps the two equal (the library never imports the runtime)."""
FATAL_CODES_ENV = "EKS_DDP_FATAL_EXIT_CODES"
"""How the Job tells the launcher its fatal worker exit codes (eks_ddp_runtime.exitcodes.FATAL_CODES_ENV)."""


@dataclass(frozen=True, kw_only=True)
class S3Data:
    """A dataset staged once from S3 onto the shared volume (``/shared/data/<name>``), read-only for workers."""

    uri: str
    """The S3 prefix copied, ``s3://bucket/prefix/`` (ending with '/'); every object under it is staged."""
    name: str
    """The dataset's directory under /shared/data (a DNS label, e.g. ``imagenet``)."""

    def __post_init__(self) -> None:
        rules.require(rules.s3_prefix("data.uri", self.uri), rules.dns_label("data.name", self.name))

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
    image: pulumi.Input[str] | None = None
    """Image of the training pods (``repo@sha256:digest``, with eks-ddp-runtime installed); None: the stack's."""
    data: S3Data | Cifar10Data | None = None
    """The dataset staged before training; None: no data stage."""
    evaluate: bool = False
    """Add the on-demand test-set evaluation CronJob (the bundled trainer only)."""
    fatal_exit_codes: tuple[int, ...] = FATAL_EXIT_CODES
    """Worker exit codes no retry can fix: the Job fails at once on them."""

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
        rules.require(*p)
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


def cifar10_workload(*, epochs: int = 10, global_batch_size: int = 1024, model: str = "airnet",
                     learning_rate: float | None = None, compile: bool = False) -> Workload:
    """The bundled CIFAR-10 trainer (``-m training.train``) with exactly the flags the stack has always run
    (TrainerOptions), on the verified CIFAR-10 files, with the evaluation CronJob."""
    rules.require(rules.whole("epochs", epochs), rules.global_batch("global_batch_size", global_batch_size),
                  rules.model("model", model), rules.learning_rate("learning_rate", learning_rate),
                  None if isinstance(compile, bool) else f"compile: got {compile!r}; expected true or false")
    trainer = TrainerOptions(data_dir=DATA_DIR_REF, run_dir=RUN_DIR_REF, epochs=epochs,
                             global_batch_size=global_batch_size, model=model, learning_rate=learning_rate,
                             compile=compile)
    return Workload(name="cifar10", module=TRAIN_MODULE, args=tuple(trainer.args()), data=Cifar10Data(),
                    evaluate=True)

