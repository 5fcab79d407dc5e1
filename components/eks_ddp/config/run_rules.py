"""Rules across a stack's runs that decide what the program builds: each run's Job name and Workload, the image each
run needs, and the S3 data sets' staging folders. Plain functions of the typed config (no Pulumi)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eks_ddp.config.schema import RunConfig, StackConfig
from eks_ddp.core import rules
from eks_ddp.core.workload import Egress, S3Data, Workload, cifar10_workload, dataset_name

FIRST_JOB_NAME = "training"


def job_name_of(index: int, run: RunConfig) -> str:
    """The ElasticJob's name of ``runs[index]``: the first run keeps the name the one-run stack always had (its
    deployed Job is never replaced for a name); every further run is named after its runId."""
    return FIRST_JOB_NAME if index == 0 else f"{FIRST_JOB_NAME}-{run.run_id}"


def workload_of(run: RunConfig, images: Mapping[str, Any]) -> Workload:
    """The Workload a run's config names: the bundled trainer, or the user's module/script; ``images`` maps a
    ``workload.image`` to what the pods run (its scan-gated, pull-granted reference)."""
    w = run.workload
    if not w.custom:
        return cifar10_workload(epochs=run.epochs, global_batch_size=run.global_batch_size, model=run.model,
                                learning_rate=run.learning_rate, compile=run.compile)
    data = S3Data(uri=w.data.s3, name=dataset_name(w.data.s3), sha256=w.data.sha256) if w.data else None
    return Workload(name=run.run_id, image=images.get(w.image, w.image) if w.image else None, module=w.module,
                    script=w.script, args=w.args, env=w.env, data=data,
                    egress=tuple(Egress.parse("workload.egress", e) for e in w.egress),  # checked in config
                    iam_statements=w.iam_statements)


def uses_stack_image(run: RunConfig) -> bool:
    """The run's pods run the stack's image (the bundled trainer's, or ``image.prebuilt``)."""
    return not run.workload.custom or run.workload.image is None


def stack_image_used(cfg: StackConfig) -> bool:
    """A run needs the stack's image: without one, the stack builds no trainer image (and needs no Docker)."""
    return any(uses_stack_image(r) for r in cfg.runs)


def problems(cfg: StackConfig) -> list[str]:
    """One message per run whose script or module is in no image, and per S3 data set staged over another's."""
    p: list[str] = []
    for i, run in enumerate(cfg.runs):
        if run.workload.custom and run.workload.image is None and cfg.image.prebuilt is None:
            what = f"script {run.workload.script!r}" if run.workload.script else f"module {run.workload.module!r}"
            p.append(f"{cfg.run_key(i)}.workload.image: got none for {what}; expected your image by digest "
                     "(repo@sha256:<64 hex>) holding it: the stack's own image is the bundled CIFAR-10 trainer, "
                     "which does not (or set image.prebuilt to an image that does)")
    staged: dict[str, tuple[str, int]] = {}  # dataset directory -> (S3 prefix, run index)
    for i, run in enumerate(cfg.runs):
        uri = run.workload.s3_uri
        if not (run.workload.custom and uri) or rules.s3_prefix("data.s3", uri):
            continue
        first, j = staged.setdefault(dataset_name(uri), (uri, i))
        if first != uri:
            p.append(f"{cfg.run_key(i)}.workload.data.s3: got {uri!r}, which would stage into "
                     f"/shared/data/{dataset_name(uri)} like {cfg.run_key(j)}'s {first!r}; expected prefixes whose "
                     "last folders differ")
    return p
