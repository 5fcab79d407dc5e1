"""TrainerImage: the trainer image in a private ECR repository, referenced by digest.

``pulumi up`` builds ``docker/Dockerfile`` with BuildKit (``pulumi_docker_build.Image``), pushes it to an
ECR repository with immutable tags, and exposes ``image_ref`` = ``<repository>@sha256:<digest>``: the jobs
run exactly the image that was built. A stack may instead name a prebuilt image (``repo@sha256:...``);
then nothing is built and no repository is created.

The image tag is a hash of the build inputs (``docker/`` and ``training/``) computed here, in plain Python,
while the program runs: immutable tags need a new tag for every content change, and a preview shows it.
The hash covers file **modes** as well as paths and contents, like pulumi-docker-build's own context hash:
that provider rebuilds and pushes whenever its hash changes (a chmod, a checkout with another umask), and
pushing an existing tag into an immutable repository fails even for an identical image, so every change the
provider sees must also be a new tag here. Directory modes are included too (more rebuilds, never a re-push).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from eks_ddp.core import rules
from eks_ddp.core.types import ScanSeverity
from eks_ddp.infra.scan_gate import ScanGate, scan_target

PROJECT_ROOT = Path(__file__).resolve().parents[3]

DOCKERFILE = "docker/Dockerfile"
"""The Dockerfile, relative to the build context (the repository root)."""
SOURCE_DIRS = ("docker", "training")
"""What the image is built from; everything else in the context is excluded by .dockerignore."""
PLATFORM = docker_build.Platform.LINUX_AMD64
"""Every GPU instance type in the catalog is x86_64."""
CACHE_TAG = "buildcache"
"""Tag of the BuildKit layer cache in the cache repository."""
TAG_PREFIX = "src-"
TAG_HASH_CHARS = 20

PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability")
"""What a node needs to pull one repository's images."""

_IMAGE_BY_DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
_ECR_IMAGE = re.compile(  # the IPv4 (and FIPS) registry host, or the dual-stack one (<id>.dkr-ecr.<region>.on.aws)
    r"^(?P<account>\d{12})\.(?:dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?P<cn>\.cn)?"
    r"|dkr-ecr\.(?P<dual>[a-z0-9-]+)\.on\.aws)/(?P<repo>[^@]+)@sha256:[0-9a-f]{64}$")
# Build outputs and editor files that .dockerignore keeps out of the context (and so out of the hash).
_IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints"}
_IGNORED_SUFFIXES = (".pyc", ".pyo", ".pyd", ".swp")
_IGNORED_NAMES = {".DS_Store"}


@dataclass(frozen=True, kw_only=True)
class TrainerImageArgs:
    """Arguments of :class:`TrainerImage`."""

    prebuilt: str | None = None
    """Use this image (``repo@sha256:<64 hex>``) instead of building one: no repository, no build."""
    keep_images: int = 10
    """Images the ECR lifecycle policy keeps (the newest); older ones are expired."""
    retain_repository: bool = False
    """Keep the repository and its images on ``pulumi destroy`` (Pulumi forgets them: delete by hand later).

    Otherwise ``pulumi destroy`` deletes the repository with its images: ECR refuses to delete a repository
    that holds images unless forced, and every earlier build stays in it (a new tag is an update), so an
    unforced delete would stop ``pulumi destroy`` half way."""
    node_role_name: pulumi.Input[str] | None = None
    """IAM role of the nodes that run the jobs: gets a pull-only policy on this image's repository."""
    kms_key_arn: pulumi.Input[str] | None = None
    """KMS key that encrypts the repositories; default: the AWS managed key for ECR (aws/ecr)."""
    context_dir: str = str(PROJECT_ROOT)
    """Build context. Default: this repository's root, holding ``docker/`` and ``training/``: the bundled trainer
    image builds from a checkout of the repository (the installed wheel ships no ``docker/``). For your own image:
    your build context, with ``dockerfile`` and ``source_paths``."""
    dockerfile: str = DOCKERFILE
    """The Dockerfile, relative to ``context_dir``."""
    source_paths: tuple[str, ...] = SOURCE_DIRS
    """Files and folders under ``context_dir`` the image is built from: the immutable tag is a hash of them, so a
    change anywhere the build reads must be in here (else the old image keeps running, or the push is refused)."""
    scan_fail_severity: str = "CRITICAL"
    """Fail ``pulumi up`` before any job gets the image if ECR's scan on push finds anything at or above this
    severity (CRITICAL, HIGH, MEDIUM, LOW, INFORMATIONAL), or ``disabled``. ``image_ref`` resolves only once the
    scan passed (:class:`eks_ddp.infra.scan_gate.ScanGate`); images outside ECR are not gated."""
    scan_setting: str = "TrainerImageArgs.scan_fail_severity"
    """What the scan gate's failures tell you to change: this field; the stack's program passes its stack key."""
    aws_profile: str | None = None
    """The stack's ``aws:profile``, for the scan gate's ECR calls (it runs in the program, with boto3)."""
    registry_cache: bool = False
    """Share BuildKit's layer cache through a second ECR repository (faster builds on a fresh machine or in CI).
    Off by default: that repository must be MUTABLE (BuildKit re-tags the cache on every build), and a build
    trusts the layers it finds there, so anyone allowed ``ecr:PutImage`` on it could plant layers in the next
    immutable, digest-pinned trainer image. Without it builds use only the local builder's cache."""


def source_files(context_dir: str | Path, dirs: tuple[str, ...] = SOURCE_DIRS) -> list[Path]:
    """The files under ``dirs`` (folders, or single files) that the build reads, relative to ``context_dir``."""
    root = Path(context_dir)
    out: list[Path] = []
    for top in dirs:
        if (root / top).is_file():
            out.append(Path(top))
            continue
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_DIRS)
            for name in filenames:
                if name in _IGNORED_NAMES or name.endswith(_IGNORED_SUFFIXES):
                    continue
                path = Path(dirpath) / name
                if path.is_file():
                    out.append(path.relative_to(root))
    return sorted(out, key=lambda p: p.as_posix())


def source_hash(context_dir: str | Path, dirs: tuple[str, ...] = SOURCE_DIRS, dockerfile: str = DOCKERFILE) -> str:
    """SHA-256 over the build inputs' relative paths, modes and contents, and their directories' modes.

    Changes whenever the image or pulumi-docker-build's context hash would (both see modes)."""
    root = Path(context_dir)
    files = source_files(root, dirs)
    if not any(p.as_posix() == Path(dockerfile).as_posix() for p in files):
        raise ValueError(missing_dockerfile(root, dockerfile, dirs))
    h = hashlib.sha256()
    parents = sorted({parent for rel in files for parent in rel.parents if parent != Path(".")},
                     key=lambda p: p.as_posix())
    for rel in parents:
        h.update(b"d\0" + rel.as_posix().encode() + b"\0" + _mode(root / rel) + b"\0")
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(b"f\0" + rel.as_posix().encode() + b"\0" + _mode(root / rel) + b"\0"
                 + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def _mode(path: Path) -> bytes:
    """The permission string, as Go's ``fs.FileMode.String()`` (which docker-build hashes) spells it."""
    return stat.filemode(path.stat().st_mode).encode()


def missing_dockerfile(root: Path, dockerfile: str, dirs: tuple[str, ...]) -> str:
    if not (root / dockerfile).is_file():
        return (f"TrainerImageArgs.context_dir: {root} has no {dockerfile}. The bundled trainer image builds from a "
                "checkout of the eks-ddp repository (the installed package ships no docker/): set context_dir to "
                "the checkout, or give your own build context with dockerfile and source_paths, or use prebuilt")
    return (f"TrainerImageArgs.source_paths: got {list(dirs)}; expected them to include the Dockerfile "
            f"{dockerfile!r} (the image tag hashes what the build reads)")


def image_tag(context_dir: str | Path, dirs: tuple[str, ...] = SOURCE_DIRS, dockerfile: str = DOCKERFILE) -> str:
    """The immutable tag for the current sources, e.g. ``src-3f2a...``."""
    return TAG_PREFIX + source_hash(context_dir, dirs, dockerfile)[:TAG_HASH_CHARS]


def ecr_repository_arn(image_ref: str) -> str | None:
    """ARN of the ECR repository an image reference points into, or None for other registries. The partition
    comes from the registry's region (aws, aws-cn, aws-us-gov), as the repository's ARN names it."""
    m = _ECR_IMAGE.match(image_ref)
    if m is None:
        return None
    repo = re.sub(r":[^/:]+$", "", m["repo"])  # repo:tag@sha256:... -> the tag is not part of the name
    region = m["region"] or m["dual"]
    partition = "aws-cn" if m["cn"] else rules.partition(region)
    return f"arn:{partition}:ecr:{region}:{m['account']}:repository/{repo}"


def pull_policy(repository_arn: str, sid: str = "PullTrainerImage") -> str:
    """Node policy: pull from one repository; GetAuthorizationToken cannot be scoped to a resource."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": sid, "Effect": "Allow", "Action": list(PULL_ACTIONS),
             "Resource": repository_arn},
            {"Sid": "EcrLogin", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        ],
    })


def lifecycle_policy(keep_images: int) -> str:
    """Keep the newest ``keep_images`` images; the jobs only ever run the newest."""
    return json.dumps({"rules": [{
        "rulePriority": 1,
        "description": f"keep the newest {keep_images} trainer images",
        "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep_images},
        "action": {"type": "expire"},
    }]})


def cache_lifecycle_policy() -> str:
    """Each build re-tags the cache; the cache it replaced is untagged and goes after a day."""
    return json.dumps({"rules": [{
        "rulePriority": 1,
        "description": "expire replaced build caches",
        "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
                      "countNumber": 1},
        "action": {"type": "expire"},
    }]})


def _validate(args: TrainerImageArgs) -> None:
    if args.scan_fail_severity not in get_args(ScanSeverity):
        raise ValueError(f"TrainerImageArgs.scan_fail_severity: got {args.scan_fail_severity!r}; expected one of "
                         + ", ".join(get_args(ScanSeverity)))
    if args.prebuilt is not None and not _IMAGE_BY_DIGEST.match(args.prebuilt):
        raise ValueError(f"TrainerImageArgs.prebuilt: got {args.prebuilt!r}; expected an image pinned by digest, "
                         "e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:<64 hex>")
    if isinstance(args.keep_images, bool) or not isinstance(args.keep_images, int) or args.keep_images < 1:
        raise ValueError(f"TrainerImageArgs.keep_images: got {args.keep_images!r}; expected a whole number >= 1")
    if isinstance(args.source_paths, str) or not args.source_paths or not all(
            isinstance(p, str) and p and not Path(p).is_absolute() and ".." not in Path(p).parts
            for p in args.source_paths):
        raise ValueError(f"TrainerImageArgs.source_paths: got {args.source_paths!r}; expected a non-empty tuple of "
                         "paths relative to context_dir")
    if args.prebuilt is None and not (Path(args.context_dir) / args.dockerfile).is_file():
        raise ValueError(missing_dockerfile(Path(args.context_dir), args.dockerfile, tuple(args.source_paths)))


class TrainerImage(pulumi.ComponentResource):
    """The trainer image: built and pushed to ECR on ``pulumi up``, or a prebuilt reference."""

    image_ref: pulumi.Output[str]
    """``<repository>@sha256:<digest>``: what the jobs run."""
    repository_url: pulumi.Output[str] | None
    """The ECR repository's URL; None with a prebuilt image."""
    repository_arn: pulumi.Output[str] | None
    """The repository the nodes may pull from (ours, or a prebuilt image's ECR repository)."""

    def __init__(self, name: str, args: TrainerImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:image:TrainerImage", name, None, opts)
        _validate(args)
        self._name = name
        self._args = args
        self.repository = self.cache_repository = self.image = self.node_policy = None

        if args.prebuilt is not None:
            self.image_ref = pulumi.Output.from_input(args.prebuilt)
            self.repository_url = None
            arn = ecr_repository_arn(args.prebuilt)
            self.repository_arn = pulumi.Output.from_input(arn) if arn else None
        else:
            self.repository = self._create_repository()
            self.cache_repository = self._create_cache_repository() if args.registry_cache else None
            self.image = self._create_image(self.repository,
                                            image_tag(args.context_dir, tuple(args.source_paths), args.dockerfile))
            self.repository_url = self.repository.repository_url
            self.repository_arn = self.repository.arn
            # A pure digest reference: what runs can never change under a tag.
            self.image_ref = pulumi.Output.concat(self.repository.repository_url, "@", self.image.digest)

        if args.node_role_name is not None and self.repository_arn is not None:
            self.node_policy = aws.iam.RolePolicy(
                f"{name}-node-pull",
                role=args.node_role_name,
                policy=self.repository_arn.apply(pull_policy),
                opts=pulumi.ResourceOptions(parent=self),
            )

        if args.scan_fail_severity != "disabled" and (args.prebuilt is None or scan_target(args.prebuilt)):
            gate = ScanGate(f"{name}-scan", image_ref=self.image_ref, fail_at=args.scan_fail_severity,
                            setting=args.scan_setting, profile=args.aws_profile,
                            opts=pulumi.ResourceOptions(parent=self))
            self.image_ref = gate.image_ref  # a data dependency: whatever runs the image waits for the gate

        self.register_outputs({
            "image_ref": self.image_ref,
            "repository_url": self.repository_url,
            "repository_arn": self.repository_arn,
        })

    def _encryption(self) -> list[aws.ecr.RepositoryEncryptionConfigurationArgs]:
        return [aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS", kms_key=self._args.kms_key_arn)]

    def _keep_opts(self) -> pulumi.ResourceOptions:
        # "Kept" means kept: destroy leaves the repository (and its expiry rule) in AWS and drops it from state.
        return pulumi.ResourceOptions(parent=self, retain_on_delete=self._args.retain_repository)

    def _create_repository(self) -> aws.ecr.Repository:
        repo = aws.ecr.Repository(
            f"{self._name}-repo",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=self._encryption(),
            force_delete=not self._args.retain_repository,
            tags={"app.kubernetes.io/part-of": "eks-ddp"},
            opts=self._keep_opts(),
        )
        aws.ecr.LifecyclePolicy(
            f"{self._name}-lifecycle",
            repository=repo.name,
            policy=lifecycle_policy(self._args.keep_images),
            opts=self._keep_opts(),
        )
        return repo

    def _create_cache_repository(self) -> aws.ecr.Repository:
        # BuildKit rewrites one cache tag on every build, which an IMMUTABLE repository refuses; so the
        # cache lives in its own repository that nodes cannot pull from and that holds nothing of value.
        cache = aws.ecr.Repository(
            f"{self._name}-cache",
            image_tag_mutability="MUTABLE",
            # Its layers end up in the trainer image: scanned like it.
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=self._encryption(),
            force_delete=True,
            tags={"app.kubernetes.io/part-of": "eks-ddp"},
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.ecr.LifecyclePolicy(
            f"{self._name}-cache-lifecycle",
            repository=cache.name,
            policy=cache_lifecycle_policy(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return cache

    def _create_image(self, repo: aws.ecr.Repository, tag: str) -> docker_build.Image:
        cache = self.cache_repository
        auth = aws.ecr.get_authorization_token_output(registry_id=repo.registry_id,
                                                      opts=pulumi.InvokeOutputOptions(parent=self))
        cache_from, cache_to = None, None
        if cache is not None:
            cache_ref = cache.repository_url.apply(lambda url: f"{url}:{CACHE_TAG}")
            cache_from = [docker_build.CacheFromArgs(registry=docker_build.CacheFromRegistryArgs(ref=cache_ref))]
            # ECR accepts a registry cache only as an OCI image manifest; a failed cache export must not
            # fail the deployment, it only makes the next build slower.
            cache_to = [docker_build.CacheToArgs(registry=docker_build.CacheToRegistryArgs(
                ref=cache_ref, mode=docker_build.CacheMode.MAX, image_manifest=True, oci_media_types=True,
                ignore_error=True))]
        context = Path(self._args.context_dir)
        # Relative paths keep the resource's inputs identical on every machine (the program runs from the
        # project directory), so a checkout elsewhere does not look like a change and trigger a rebuild.
        location = os.path.relpath(context, os.getcwd())
        return docker_build.Image(
            f"{self._name}-build",
            context=docker_build.BuildContextArgs(location=location),
            dockerfile=docker_build.DockerfileArgs(location=os.path.normpath(os.path.join(location, self._args.dockerfile))),
            platforms=[PLATFORM],
            push=True,
            tags=[repo.repository_url.apply(lambda url: f"{url}:{tag}")],
            labels={"org.opencontainers.image.version": tag},
            registries=[docker_build.RegistryArgs(
                address=repo.repository_url.apply(lambda url: url.split("/", 1)[0]),
                username=auth.user_name,
                password=pulumi.Output.secret(auth.password),
            )],
            cache_from=cache_from,
            cache_to=cache_to,
            # A multi-GB CUDA build on every preview is slow; the tag above already shows a content change.
            build_on_preview=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
