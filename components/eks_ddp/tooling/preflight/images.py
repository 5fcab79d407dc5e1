"""Preflight: every ECR image the stack names exists by its digest, before anything bills.

A digest its repository does not hold (a typo, an image pushed to another account or region, one a lifecycle
policy expired) leaves the pods in ErrImagePull/ImagePullBackOff while the GPU nodes the autoscaler started for
them bill, and an awaited stage Job hangs ``pulumi up``. So preflight asks ECR (``ecr:DescribeImages`` with the
image's digest, in the image's own registry and region) for ``image.prebuilt`` and every
``runs[i].workload.image``, and fails naming that key when the repository or the digest is not there
(``RepositoryNotFoundException``, ``ImageNotFoundException``: the ECR API reference's errors of DescribeImages).

A denied or unreachable call is a warning, as in every preflight check: another account's repository answers
only if its repository policy allows this principal ``ecr:DescribeImages`` (the nodes need ``ecr:BatchGetImage``
and ``ecr:GetDownloadUrlForLayer`` there too). Images outside ECR are not looked up: there is no API to ask, and
they are pinned by digest like every image (the stack config refuses any other reference).

IAM actions (read-only): ecr:DescribeImages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from eks_ddp.infra.scan_gate import scan_target

if TYPE_CHECKING:
    from eks_ddp.config import StackConfig

NOT_THERE = ("RepositoryNotFoundException", "ImageNotFoundException")


def named_images(cfg: StackConfig) -> list[tuple[str, str]]:
    """(stack key, image) for every image the stack names: ``image.prebuilt`` and each run's own image."""
    out = [("image.prebuilt", cfg.image.prebuilt)] if cfg.image.prebuilt else []
    out += [(f"{cfg.run_key(i)}.workload.image", r.workload.image)
            for i, r in enumerate(cfg.runs) if r.workload.custom and r.workload.image]
    return out


def check_images(c: Any, ecr_for: Callable[[str], Any]) -> None:
    """Fail (through the checker ``c``) for each named ECR image whose repository or digest does not exist.
    ``ecr_for(region)`` gives an ECR client of that region."""
    for key, ref in named_images(c.cfg):
        t = scan_target(ref)
        if t is None:
            continue
        where = f"repository {t['repo']} of account {t['account']} in {t['region']}"

        def describe(t: dict[str, str] = t) -> str | None:
            try:
                ecr_for(t["region"]).describe_images(registryId=t["account"], repositoryName=t["repo"],
                                                     imageIds=[{"imageDigest": t["digest"]}])
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                if code in NOT_THERE:
                    return code
                raise
            return None

        missing = c.attempt("ecr", "DescribeImages", f"that {key} exists ({where})", describe)
        if missing == "RepositoryNotFoundException":
            c.fail(f"{key}: got {ref!r}, but {where} does not exist (or is not shared with this account); "
                   "expected an image in an existing repository: check the account, region and repository name")
        elif missing == "ImageNotFoundException":
            c.fail(f"{key}: got {ref!r}, but {where} holds no image with digest {t['digest']}; expected a pushed "
                   f"image's digest: aws ecr describe-images --registry-id {t['account']} --repository-name "
                   f"{t['repo']} --region {t['region']}")
