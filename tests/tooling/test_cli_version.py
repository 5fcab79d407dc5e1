"""A12: the minimum Pulumi CLI is stated in the README checklist and checked on a real `pulumi version` process."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eks_ddp.tooling import cli_version
from tests.support.util import ROOT


def fake_pulumi(tmp_path: Path, answer: str) -> Path:
    """An executable `pulumi` that answers `pulumi version` like the real CLI."""
    exe = tmp_path / "pulumi"
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = version ] && echo '{answer}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.parametrize("answer,too_old", [("v3.100.0", True), ("v3.271.9", True), ("v3.272.0", False),
                                            ("v3.300.1", False), ("not a version", False)])
def test_old_pulumi_cli_is_refused(tmp_path, monkeypatch, answer, too_old):
    exe = fake_pulumi(tmp_path, answer)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    got = cli_version.problem()
    assert (got is not None) == too_old, got
    if too_old:
        assert answer.lstrip("v") in got and cli_version.MIN_PULUMI_CLI_TEXT in got and str(exe) in got


def test_no_pulumi_cli_is_not_a_problem():
    assert cli_version.problem(which=lambda _: None) is None


def test_readme_states_minimum_pulumi_cli():
    readme = (ROOT / "README.md").read_text()
    assert f"the Pulumi CLI {cli_version.MIN_PULUMI_CLI_TEXT} or newer" in readme
    pin = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"pulumi==' in line)
    assert cli_version.MIN_PULUMI_CLI_TEXT in pin  # the SDK eks-ddp is tested with


def test_preflight_refuses_an_old_cli(tmp_path, monkeypatch):
    from eks_ddp.config import load_stack_config
    from eks_ddp.tooling import preflight
    from tests.support.stub_quotas import StubQuotas
    from tests.support.util import stack_config

    fake_pulumi(tmp_path, "v3.100.0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    raw = stack_config("dev")
    cfg = load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")}, region=raw["aws:region"])
    monkeypatch.setattr(preflight.checker, "check", lambda *a, **k: preflight.Report())
    import pulumi

    with pytest.raises(pulumi.RunError, match="Pulumi CLI 3.100.0"):
        preflight.run_or_raise(cfg, ec2=object(), quotas=StubQuotas())
