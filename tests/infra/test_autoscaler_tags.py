"""The autoscaler image pins are the newest patch of their minor in a recorded list of kubernetes/autoscaler tags."""

from __future__ import annotations

import re

from eks_ddp.infra import autoscaler
from tests.support.util import ROOT

TAGS = ROOT / "tests" / "fixtures" / "autoscaler" / "tags.txt"


def newest_patches(text: str) -> dict[str, str]:
    """Minor -> newest ``v<minor>.<patch>`` among ``cluster-autoscaler-<version> <date>`` lines."""
    newest: dict[str, tuple[int, int, int]] = {}
    for line in text.splitlines():
        m = re.match(r"^cluster-autoscaler-(\d+)\.(\d+)\.(\d+)\s", line)
        if m:
            v = tuple(int(x) for x in m.groups())
            key = f"{v[0]}.{v[1]}"
            newest[key] = max(newest.get(key, v), v)
    return {k: "v" + ".".join(map(str, v)) for k, v in newest.items()}


def stale(pins: dict[str, str], text: str) -> dict[str, tuple[str, str]]:
    latest = newest_patches(text)
    return {minor: (tag, latest[minor]) for minor, tag in pins.items() if minor in latest and tag != latest[minor]}


def test_every_pin_is_the_newest_recorded_patch():
    # Review B12: v1.34.4, v1.35.1 and v1.36.0 stayed pinned after 1.34.5, 1.35.2 and 1.36.1 were tagged.
    text = TAGS.read_text()
    assert set(autoscaler.IMAGE_TAGS) <= set(newest_patches(text)), "record the tags of every supported minor"
    assert stale(autoscaler.IMAGE_TAGS, text) == {}


def test_a_pin_behind_the_recorded_tags_is_reported():
    old = {"1.34": "v1.34.4", "1.35": "v1.35.1", "1.36": "v1.36.0"}
    assert stale(old, TAGS.read_text()) == {"1.34": ("v1.34.4", "v1.34.5"), "1.35": ("v1.35.1", "v1.35.2"),
                                            "1.36": ("v1.36.0", "v1.36.1")}
