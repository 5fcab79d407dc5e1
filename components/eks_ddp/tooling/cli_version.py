"""The minimum Pulumi CLI eks-ddp needs, checked where a ``pulumi`` binary is on PATH (preflight, ``make plan``).

The control-plane log group is adopted with the ``import`` resource option on a re-``up`` after ``destroy``
(components/eks_ddp/infra/cluster.py). Older engines refuse an import whose inputs differ from the read state ("inputs to import
do not match the existing resource"), and the provider never reads back ``skip_destroy``, so there the re-``up``
fails. The engine's import-then-update (pulumi/pulumi#19339, the behaviour the import guide documents since
2026-03, pulumi/docs#18114) imports and then updates. The first CLI release with it on by default was not pinned
down here, so the minimum is the release of the Python SDK eks-ddp pins (pyproject.toml), the one it is tested with.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable

MIN_PULUMI_CLI = (3, 272, 0)
"""Oldest Pulumi CLI eks-ddp supports: the release of its pinned ``pulumi`` SDK (pyproject.toml)."""
MIN_PULUMI_CLI_TEXT = ".".join(map(str, MIN_PULUMI_CLI))


def parse(text: str) -> tuple[int, int, int] | None:
    """``v3.272.0`` (``pulumi version``'s output) -> (3, 272, 0); None when it is not a version."""
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def problem(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """Why the ``pulumi`` on PATH is too old, or None (also when there is none, or it does not answer)."""
    path = which("pulumi")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = parse(out)
    if found is None or found >= MIN_PULUMI_CLI:
        return None
    return (f"Pulumi CLI {'.'.join(map(str, found))} ({path}) is older than {MIN_PULUMI_CLI_TEXT}, the oldest eks-ddp "
            "supports: on it the re-`up` after a destroy fails adopting the kept log group. Upgrade: "
            "https://www.pulumi.com/docs/install/ (e.g. curl -fsSL https://get.pulumi.com | sh)")
