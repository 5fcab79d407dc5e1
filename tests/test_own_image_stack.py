"""A stack whose runs all bring their own image: no trainer image build (no Docker engine for `pulumi up`), and a
run whose script is in no image refused before anything is created."""

from __future__ import annotations

import pytest

from eks_ddp.config import ConfigError, load_stack_config
from tests.support.util import BYO_OTHER_ACCOUNT_IMAGE, BYO_OWN_ACCOUNT_IMAGE, byo_stack_config, run

BUILD = ("eks-ddp:image:TrainerImage", "docker-build:index:Image")


def own_images_only() -> dict:
    out = byo_stack_config()
    out["eks-ddp:runs"] = out["eks-ddp:runs"][1:]  # bert-1 and vit-1: their own images, no bundled trainer
    return out


def test_a_stack_of_own_images_builds_no_trainer_image():
    result = run(own_images_only())
    assert not [r for r in result.resources if r.type in BUILD]
    images = {j.inputs["spec"]["template"]["spec"]["containers"][0]["image"]
              for j in result.of_type("kubernetes:batch/v1:Job") if j.name.endswith("-train")}
    assert images == {BYO_OWN_ACCOUNT_IMAGE, BYO_OTHER_ACCOUNT_IMAGE}
    assert "imageRef" not in result.outputs
    # The runs' kept-logs reader runs an image with a shell: the run's own.
    assert result.outputs["runs"]["vit-1"]["logs"]["image"] == BYO_OTHER_ACCOUNT_IMAGE


def test_a_stack_with_a_bundled_trainer_run_still_builds_it(byo_result):
    # Negative control: one cifar10 run among own images needs the trainer image.
    assert {r.type for r in byo_result.resources} >= set(BUILD)


def _raw(runs: list[dict], prebuilt: str | None = None) -> dict:
    base = byo_stack_config()
    raw = {k: v for k, v in base.items() if k.startswith("eks-ddp:")}
    raw["eks-ddp:runs"] = runs
    if prebuilt:
        raw["eks-ddp:image"] = {"prebuilt": prebuilt}
    return raw


def test_a_script_without_an_image_is_refused_naming_the_key_and_the_fix():
    runs = [{"runId": "vit-1", "nodes": 1, "workload": {"script": "/app/train.py"}}]
    with pytest.raises(ConfigError) as info:
        load_stack_config(_raw(runs), region="us-west-2", placeholders_ok=True)
    assert "runs[0].workload.image: got none for script '/app/train.py'; expected your image by digest" in str(info.value)
    assert "image.prebuilt" in str(info.value)
    # With image.prebuilt (the user's image as the stack's) or its own image, it stands.
    load_stack_config(_raw(runs, prebuilt=BYO_OWN_ACCOUNT_IMAGE), region="us-west-2", placeholders_ok=True)
    runs[0]["workload"]["image"] = BYO_OWN_ACCOUNT_IMAGE
    load_stack_config(_raw(runs), region="us-west-2", placeholders_ok=True)


def test_two_data_sets_staged_into_one_folder_are_refused_by_the_config():
    data = [f"s3://{b}/sets/wiki/" for b in ("bucket-a", "bucket-b")]
    runs = [{"runId": f"r{i}", "nodes": 1, "workload": {"image": BYO_OWN_ACCOUNT_IMAGE, "module": "m.train",
                                                          "data": {"s3": uri}}} for i, uri in enumerate(data)]
    with pytest.raises(ConfigError, match=r"runs\[1\].workload.data.s3: got 's3://bucket-b/sets/wiki/', which would "
                                          r"stage into /shared/data/wiki like runs\[0\]'s"):
        load_stack_config(_raw(runs), region="us-west-2", placeholders_ok=True)


def test_the_autoscaler_follows_the_clusters_default_version():
    from eks_ddp import ClusterAutoscalerArgs, EksClusterArgs

    auto = ClusterAutoscalerArgs(cluster_name="c1", region="us-west-2", oidc_provider_arn="a", oidc_provider_url="u",
                                 node_selector={})
    cluster = EksClusterArgs(cluster_name="c1", vpc_id="v", public_subnet_ids=["s"], private_subnet_ids=["p"],
                             public_access_cidrs=["203.0.113.7/32"])
    assert auto.kubernetes_version == cluster.kubernetes_version
