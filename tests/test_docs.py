"""The README matches the code: config reference, make targets, example stack keys."""

from __future__ import annotations

import re

import yaml

from components.config import TOP_LEVEL_KEYS, reference_table
from tests.util import ROOT


def test_readme_config_reference_is_the_schema():
    readme = (ROOT / "README.md").read_text()
    assert reference_table() in readme, "regenerate the table: python -m components.config"


def test_readme_make_targets_exist():
    readme = (ROOT / "README.md").read_text()
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    for target in set(re.findall(r"`make ([a-z-]+)", readme)):
        assert target in targets, f"README mentions `make {target}` but the Makefile has no such target"


def test_dev_stack_sets_every_top_level_key():
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    missing = [k for k in TOP_LEVEL_KEYS if f"eks-ddp:{k}" not in doc]
    assert not missing, f"Pulumi.dev.yaml should show every key, with a comment; missing {missing}"


def test_dev_stack_comments_every_key():
    for line in (ROOT / "Pulumi.dev.yaml").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped in ("config:",) or stripped.endswith(":"):
            continue
        if stripped.startswith("- ") and ":" not in stripped:
            continue  # list items are commented on the key line above or inline
        assert "#" in line, f"uncommented key in Pulumi.dev.yaml: {line!r}"
