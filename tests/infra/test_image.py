"""TrainerImage under mocks: a locked-down ECR repository, a digest-pinned build, pull-only node access."""

from __future__ import annotations

import json
import re
import shutil
from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc

from eks_ddp.infra.image import (
    CACHE_TAG,
    PULL_ACTIONS,
    TrainerImage,
    TrainerImageArgs,
    ecr_repository_arn,
    image_tag,
)
from eks_ddp.tooling.mocks import ACCOUNT, run_program
from tests.support.util import ROOT, run, set_path, stack_config

REPO = "aws:ecr/repository:Repository"
LIFECYCLE = "aws:ecr/lifecyclePolicy:LifecyclePolicy"
IMAGE = "docker-build:index:Image"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
JOB = "kubernetes:batch/v1:Job"
COMPONENT = "eks-ddp:image:TrainerImage"
DIGEST_REF = re.compile(r"^[^\s@:]+(:\d+)?/[^\s@:]+@sha256:[0-9a-f]{64}$")
PREBUILT = f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/team/trainer@sha256:{'ab' * 32}"


def build(**kw: Any):
    """Run a program holding one TrainerImage; returns (result, exported image ref)."""
    args = TrainerImageArgs(**{"node_role_name": "eks-ddp-dev-node-role", **kw})

    def program() -> None:
        img = TrainerImage("trainer-image", args)
        pulumi.export("imageRef", img.image_ref)

    result = run_program({"aws:region": "us-west-2"}, program=program)
    return result, result.outputs["imageRef"]


def unsecret(value: Any) -> Any:
    """Recorded inputs keep Pulumi's secret envelope; unwrap it."""
    if isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig:
        return value["value"]
    return value


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


def trainer_repo(result):
    repos = [r for r in result.of_type(REPO) if r.inputs.get("imageTagMutability") == "IMMUTABLE"]
    assert len(repos) == 1, [r.name for r in result.of_type(REPO)]
    return repos[0]


def statements(policy: str) -> list[dict]:
    doc = json.loads(policy)
    return doc["Statement"]


def as_list(x: Any) -> list:
    return x if isinstance(x, list) else [x]


@pytest.fixture(scope="module")
def built():
    return build()


@pytest.fixture(scope="module")
def built_cached():
    return build(registry_cache=True)


# --- repository ------------------------------------------------------------------------------------


def test_repository_is_immutable_scanned_and_kms_encrypted(built):
    result, _ = built
    repo = trainer_repo(result)
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert [c["encryptionType"] for c in repo.inputs["encryptionConfigurations"]] == ["KMS"]


def test_every_repository_is_kms_encrypted_and_only_the_cache_is_mutable(built_cached):
    result, _ = built_cached
    for r in result.of_type(REPO):
        assert [c["encryptionType"] for c in r.inputs["encryptionConfigurations"]] == ["KMS"], r.name
    mutable = [r for r in result.of_type(REPO) if r.inputs.get("imageTagMutability") != "IMMUTABLE"]
    image = result.one(IMAGE)
    cache_refs = {c["registry"]["ref"] for c in image.inputs["cacheTo"]}
    assert [r.outputs["repositoryUrl"] + f":{CACHE_TAG}" for r in mutable] == sorted(cache_refs), \
        "only the build-cache repository may have mutable tags (BuildKit re-tags the cache each build)"


def test_destroy_deletes_the_repository_with_its_images_by_default(built):
    # ECR refuses DeleteRepository on a repository holding images unless forced, and every earlier build
    # stays in it: an unforced, unretained repository would stop `pulumi destroy` (review M4).
    result, _ = built
    repo = trainer_repo(result)
    assert repo.inputs["forceDelete"] is True
    assert not repo.retain_on_delete
    for r in result.of_type(REPO):
        assert r.inputs["forceDelete"] is True or r.retain_on_delete, r.name


def test_retained_repository_is_kept_not_deleted():
    # "Kept" means kept: Pulumi leaves the repository and its expiry rule in AWS instead of failing to
    # delete a non-empty repository.
    result, _ = build(retain_repository=True)
    repo = trainer_repo(result)
    assert repo.retain_on_delete
    assert repo.inputs["forceDelete"] is False
    (policy,) = [p for p in result.of_type(LIFECYCLE) if p.inputs["repository"] == repo.outputs["name"]]
    assert policy.retain_on_delete


@pytest.mark.parametrize("keep", [1, 7, 25])
def test_lifecycle_policy_keeps_the_newest_n_images(keep):
    result, _ = build(keep_images=keep)
    repo = trainer_repo(result)
    policies = [p for p in result.of_type(LIFECYCLE) if p.inputs["repository"] == repo.outputs["name"]]
    assert len(policies) == 1
    rules = json.loads(policies[0].inputs["policy"])["rules"]
    assert [r["selection"] for r in rules] == [
        {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep}]
    assert all(r["action"] == {"type": "expire"} for r in rules)


def test_children_are_parented_to_the_component(built):
    result, _ = built
    children = [r for r in result.resources if r.type != COMPONENT]
    assert children and all(r.parent_type == COMPONENT for r in children), \
        [(r.name, r.parent_type) for r in children]
    assert all(r.name.startswith("trainer-image-") for r in children)


# --- build ---------------------------------------------------------------------------------------------


def test_build_pushes_one_content_tag_for_linux_amd64(built):
    result, _ = built
    image = result.one(IMAGE)
    repo_url = trainer_repo(result).outputs["repositoryUrl"]
    assert image.inputs["push"] is True
    assert image.inputs["platforms"] == ["linux/amd64"]
    assert image.inputs["context"] == {"location": "."}
    assert image.inputs["dockerfile"] == {"location": "docker/Dockerfile"}
    assert image.inputs["tags"] == [f"{repo_url}:{image_tag(ROOT)}"]
    assert not any(t.endswith(":latest") for t in image.inputs["tags"])


def test_build_caches_in_the_registry_as_ecr_requires(built_cached):
    result, _ = built_cached
    image = result.one(IMAGE)
    (cache_to,) = image.inputs["cacheTo"]
    (cache_from,) = image.inputs["cacheFrom"]
    assert cache_to["registry"]["ref"] == cache_from["registry"]["ref"]
    assert cache_to["registry"]["ref"].endswith(f":{CACHE_TAG}")
    assert cache_to["registry"]["mode"] == "max"
    # ECR stores a registry cache only as an OCI image manifest.
    assert cache_to["registry"]["imageManifest"] is True and cache_to["registry"]["ociMediaTypes"] is True
    assert cache_to["registry"]["ref"].rsplit(":", 1)[0] != trainer_repo(result).outputs["repositoryUrl"]


def test_no_registry_cache_is_trusted_unless_asked_for(built, built_cached):
    """Security review S14: a mutable cache repository whose layers the build trusts is opt-in, and scanned."""
    result, _ = built
    assert [r.inputs["imageTagMutability"] for r in result.of_type(REPO)] == ["IMMUTABLE"]
    image = result.one(IMAGE)
    assert not image.inputs.get("cacheFrom") and not image.inputs.get("cacheTo")
    cached, _ = built_cached
    for repo in cached.of_type(REPO):
        assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}, repo.name


def test_registry_credentials_come_from_ecr_and_are_secret(built):
    result, _ = built
    image = result.one(IMAGE)
    registries = image.inputs["registries"]
    assert is_secret(registries) or all(is_secret(r.get("password")) for r in registries)
    (registry,) = unsecret(registries)
    assert registry["address"] == trainer_repo(result).outputs["repositoryUrl"].split("/")[0]
    assert registry["username"] == "AWS" and unsecret(registry["password"]) == "mock-token"
    assert any(tok == "aws:ecr/getAuthorizationToken:getAuthorizationToken" for tok, _ in result.calls)


def test_image_ref_is_the_build_digest(built):
    result, ref = built
    image = result.one(IMAGE)
    repo_url = trainer_repo(result).outputs["repositoryUrl"]
    assert ref == f"{repo_url}@{image.outputs['digest']}"
    assert DIGEST_REF.match(ref), ref


def test_tag_changes_with_the_sources_and_ignores_caches(tmp_path):
    for top in ("docker", "training"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    before = image_tag(tmp_path)
    (tmp_path / "training" / "__pycache__").mkdir()
    (tmp_path / "training" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "README.md").write_text("not in the build context")
    assert image_tag(tmp_path) == before
    with (tmp_path / "training" / "eks_ddp_trainer" / "__init__.py").open("a") as f:
        f.write("\n# changed\n")
    assert image_tag(tmp_path) != before
    assert image_tag(tmp_path).startswith("src-")


@pytest.mark.parametrize("target", ["training/eks_ddp_trainer/__init__.py", "docker/Dockerfile", "training"])
def test_tag_changes_with_a_mode_change(tmp_path, target):
    # pulumi-docker-build hashes file modes: a chmod or another umask makes it rebuild and push; the push
    # must go to a new tag, since an immutable repository refuses an existing one (review M3).
    for top in ("docker", "training"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / target
    path.chmod(0o755 if path.is_file() else 0o775)
    before = image_tag(tmp_path)
    path.chmod(0o644 if path.is_file() else 0o755)
    assert image_tag(tmp_path) != before
    path.chmod(0o755 if path.is_file() else 0o775)
    assert image_tag(tmp_path) == before


def test_context_without_dockerfile_is_rejected(tmp_path):
    (tmp_path / "training").mkdir()
    with pytest.raises(ValueError, match="TrainerImageArgs.context_dir"):
        image_tag(tmp_path)


def test_a_context_without_the_bundled_dockerfile_fails_at_construction_saying_where_it_builds(tmp_path):
    """Review U3: from the installed wheel (no docker/) TrainerImageArgs() failed only with "has no
    docker/Dockerfile". Now it fails where the component is built, saying the bundled image builds from a checkout
    and how to build one's own."""
    def program():
        TrainerImage("img", TrainerImageArgs(context_dir=str(tmp_path)))

    with pytest.raises(ValueError, match="builds from a checkout of the eks-ddp repository") as err:
        run_program({}, program=program)
    assert "dockerfile and source_paths" in str(err.value) and "prebuilt" in str(err.value)


def _own_context(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "Containerfile").write_text("FROM scratch\nCOPY src/ /src/\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('v1')\n")
    (tmp_path / "notes.md").write_text("not in the image\n")
    return TrainerImageArgs(context_dir=str(tmp_path), dockerfile="build/Containerfile",
                            source_paths=("build", "src"))


def test_a_users_own_context_and_dockerfile_build_with_a_tag_of_what_they_read(tmp_path):
    """Review U3: a user's own build context was hashed over docker/ and training/ only, so a code change kept the
    same immutable tag (the old image kept running, or the push was refused)."""
    args = _own_context(tmp_path)

    def program():
        TrainerImage("img", args)

    first = run_program({}, program=program).one(IMAGE)
    assert first.inputs["dockerfile"]["location"].endswith("build/Containerfile"), first.inputs["dockerfile"]
    (tmp_path / "notes.md").write_text("edited\n")  # outside source_paths: same image
    assert run_program({}, program=program).one(IMAGE).inputs["tags"] == first.inputs["tags"]
    (tmp_path / "src" / "train.py").write_text("print('v2')\n")  # the code the image runs: a new tag
    assert run_program({}, program=program).one(IMAGE).inputs["tags"] != first.inputs["tags"]


@pytest.mark.parametrize("paths", [(), ("../outside",), ("/abs",), "src", ("src",)])
def test_source_paths_must_be_relative_and_include_the_dockerfile(tmp_path, paths):
    args = _own_context(tmp_path)
    with pytest.raises(ValueError, match="TrainerImageArgs.source_paths"):
        def program():
            TrainerImage("img", TrainerImageArgs(context_dir=args.context_dir, dockerfile=args.dockerfile,
                                                 source_paths=paths))

        run_program({}, program=program)


# --- node access -------------------------------------------------------------------------------------


def test_node_policy_pulls_from_this_repository_only(built_cached):
    result, _ = built_cached
    (policy,) = result.of_type(ROLE_POLICY)
    assert policy.inputs["role"] == "eks-ddp-dev-node-role"
    repo_arn = trainer_repo(result).outputs["arn"]
    stmts = statements(policy.inputs["policy"])
    assert all(s["Effect"] == "Allow" for s in stmts)
    by_resource = {tuple(as_list(s["Resource"])): sorted(as_list(s["Action"])) for s in stmts}
    assert by_resource == {(repo_arn,): sorted(PULL_ACTIONS), ("*",): ["ecr:GetAuthorizationToken"]}
    cache_urls = [r.outputs["arn"] for r in result.of_type(REPO) if r.outputs["arn"] != repo_arn]
    assert cache_urls and not any(u in policy.inputs["policy"] for u in cache_urls)


def test_no_node_policy_without_a_node_role():
    result, _ = build(node_role_name=None)
    assert result.of_type(ROLE_POLICY) == []


# --- prebuilt -----------------------------------------------------------------------------------------


def test_prebuilt_ecr_image_builds_nothing_and_scopes_the_pull_policy():
    result, ref = build(prebuilt=PREBUILT)
    assert ref == PREBUILT
    assert result.of_type(REPO) == [] and result.of_type(IMAGE) == [] and result.of_type(LIFECYCLE) == []
    (policy,) = result.of_type(ROLE_POLICY)
    stmts = statements(policy.inputs["policy"])
    pull = [s for s in stmts if "ecr:BatchGetImage" in as_list(s["Action"])]
    assert [as_list(s["Resource"]) for s in pull] == [[f"arn:aws:ecr:us-west-2:{ACCOUNT}:repository/team/trainer"]]


def test_prebuilt_image_elsewhere_gets_no_ecr_policy():
    result, ref = build(prebuilt=f"ghcr.io/example/trainer@sha256:{'0' * 64}")
    assert ref.startswith("ghcr.io/")
    assert result.of_type(ROLE_POLICY) == [] and result.of_type(REPO) == []


@pytest.mark.parametrize(("ref", "arn"), [
    (f"{ACCOUNT}.dkr.ecr.eu-central-1.amazonaws.com/trainer@sha256:{'1' * 64}",
     f"arn:aws:ecr:eu-central-1:{ACCOUNT}:repository/trainer"),
    (f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/a/b:v1@sha256:{'2' * 64}",
     f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/a/b"),
    (f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn/trainer@sha256:{'3' * 64}",
     f"arn:aws-cn:ecr:cn-north-1:{ACCOUNT}:repository/trainer"),
    (f"docker.io/library/python@sha256:{'4' * 64}", None),
    (f"public.ecr.aws/x/trainer@sha256:{'5' * 64}", None),
])
def test_ecr_repository_arn_parses_the_reference(ref, arn):
    assert ecr_repository_arn(ref) == arn


@pytest.mark.parametrize(("kw", "field"), [
    ({"prebuilt": "trainer:latest"}, "prebuilt"),
    ({"prebuilt": f"trainer@sha256:{'A' * 64}"}, "prebuilt"),
    ({"keep_images": 0}, "keep_images"),
    ({"keep_images": True}, "keep_images"),
])
def test_invalid_args_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"TrainerImageArgs.{field}"):
        build(**kw)


# --- full program ---------------------------------------------------------------------------------------


def job_containers(result) -> list[dict]:
    out = []
    for job in result.of_type(JOB):
        pod = job.inputs["spec"]["template"]["spec"]
        out += [*pod.get("initContainers", []), *pod["containers"]]
    assert out, "the program registers no Job"
    return out


def test_jobs_run_the_built_image_by_digest(dev_result):
    image = dev_result.one(IMAGE)
    repo_url = trainer_repo(dev_result).outputs["repositoryUrl"]
    expected = f"{repo_url}@{image.outputs['digest']}"
    assert {c["image"] for c in job_containers(dev_result)} == {expected}
    assert dev_result.outputs["imageRef"] == expected


def test_program_grants_nodes_pulls_from_the_trainer_repository_only(dev_result):
    policies = [p for p in dev_result.of_type(ROLE_POLICY) if p.parent_type == COMPONENT]
    assert len(policies) == 1
    repo_arn = trainer_repo(dev_result).outputs["arn"]
    pull = [s for s in statements(policies[0].inputs["policy"]) if "ecr:BatchGetImage" in as_list(s["Action"])]
    assert [as_list(s["Resource"]) for s in pull] == [[repo_arn]]


def test_job_modules_exist_in_the_image(dev_result):
    """Every `-m <module>` a job container runs is a file the Dockerfile copies under /app: the trainer's
    ``training/eks_ddp_trainer/`` as ``eks_ddp_trainer``, the runtime's ``training/runtime/eks_ddp_runtime/`` as ``eks_ddp_runtime``."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    copied = {"eks_ddp_trainer.": "training/eks_ddp_trainer/", "eks_ddp_runtime.": "training/runtime/eks_ddp_runtime/"}
    assert "COPY training/eks_ddp_trainer/ /app/eks_ddp_trainer/" in dockerfile
    assert "COPY training/runtime/eks_ddp_runtime/ /app/eks_ddp_runtime/" in dockerfile
    seen = set()
    for c in job_containers(dev_result):
        argv = [*c.get("command", []), *c.get("args", [])]
        for i, tok in enumerate(argv[:-1]):
            if tok == "-m":
                module = argv[i + 1]
                prefix = next((p for p in copied if module.startswith(p)), None)
                assert prefix, f"{module}: not in a package the image copies ({', '.join(copied)})"
                path = copied[prefix] + module[len(prefix):].replace(".", "/") + ".py"
                assert (ROOT / path).is_file(), (module, path)
                seen.add(prefix)
    assert seen == set(copied), seen  # the launcher and the trainer both run


def test_prebuilt_stack_builds_nothing_and_jobs_use_it():
    cfg = set_path(stack_config("dev"), "eks-ddp:image", {"prebuilt": PREBUILT})
    result = run(cfg)
    assert result.of_type(REPO) == [] and result.of_type(IMAGE) == []
    assert {c["image"] for c in job_containers(result)} == {PREBUILT}
    assert result.outputs["imageRef"] == PREBUILT
