"""The rendezvous store's size from the fleet (eks_ddp.core.rendezvous_store): the model's figures against the real
state encoder, and a p4de stack of 128 nodes planned with a store the model says holds."""

from __future__ import annotations

import pytest

from eks_ddp.core import rendezvous_store as model
from eks_ddp.core.rendezvous_store import core_bytes, reform_bytes, store_size


def _core_of(n: int) -> int:
    """The core's real size with ``n`` nodes (pod addresses of a /16), by the agents' own encoder."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    from eks_ddp_runtime.rendezvous import state as rdzv_state
    from eks_ddp_runtime.rendezvous.etcd_backend import EPOCH

    s = _RendezvousState()
    s.round, s.complete = 123456, True
    for i in range(n):
        node = _NodeDesc(f"10.123.{i // 250}.{i % 250 + 1}", 1_000_000 + i, 0)
        s.participants[node] = i
        s.last_heartbeats[node] = EPOCH
    return len(rdzv_state.to_json(s))


@pytest.mark.parametrize("n", [1, 16, 128, 1000])
def test_the_models_core_size_covers_the_encoders_within_20_percent(n):
    real = _core_of(n)
    assert real <= core_bytes(n) <= 1.2 * real + model.CORE_BASE_BYTES, (n, real, core_bytes(n))


def test_the_quota_holds_the_models_history_with_room_for_fragmentation():
    for n in (1, 2, 8, 64, 128, 256, 512):
        s = store_size(n)
        assert s.holds, s
        assert s.history_bytes == model.REFORMS_PER_WINDOW * reform_bytes(n)
        assert s.quota_bytes >= model.FRAGMENTATION * s.history_bytes, s
        assert s.quota_bytes >= model.MIN_QUOTA_BYTES and s.quota_bytes <= model.MAX_QUOTA_BYTES
        # the raft log held in memory (snapshot-count + catch-up entries of the largest entry) fits the limit
        raft = (s.snapshot_count + model.CATCH_UP_ENTRIES) * (core_bytes(n) + model.REVISION_OVERHEAD)
        assert raft + (model.BASE_MEMORY_MIB << 20) <= s.memory_limit_mib << 20, s
        assert s.cpu_request_m * model.REQUESTS_PER_CORE_S / 1000 >= s.requests_per_s, s
    # A re-form's history is O(N) (claims): 1,000 agents keep the smallest quota; where one store stops is its CPU
    # (5 requests per agent per second, at most 4 cores), past 1,600 agents.
    assert store_size(1000).holds and store_size(1000).quota_bytes == model.MIN_QUOTA_BYTES
    assert store_size(1600).holds and not store_size(1700).holds and store_size(1700).requests_per_s > 2 * model.REQUESTS_PER_CORE_S


def test_small_fleets_keep_the_smallest_store():
    s = store_size(2)
    assert (s.quota_bytes, s.cpu_request_m, s.memory_request_mib, s.memory_limit_mib) == (256 << 20, 100, 128, 512)
    assert s.compaction_retention == "5m"
    scaled = s.scaled(256)  # the soak's store: hours of a run in minutes
    assert (scaled.quota_bytes, scaled.compaction_retention) == (1 << 20, "1s")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "128", None])
def test_a_size_needs_a_count_of_agents(bad):
    with pytest.raises(ValueError, match="agents: got"):
        store_size(bad)


def test_a_p4de_stack_of_128_nodes_plans_a_store_the_model_says_holds():
    from tests.support.util import run, stack_config

    config = stack_config("p4de")
    config["eks-ddp:nodeGroups"][0]["maxSize"] = 128
    config["eks-ddp:job"].update(nodes=128, minNodes=120)
    result = run(config, stack="p4de")
    sts = result.one("kubernetes:apps/v1:StatefulSet", "rendezvous-etcd").inputs
    container = sts["spec"]["template"]["spec"]["containers"][0]
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    size = store_size(128)
    assert size.holds
    assert int(flags["quota-backend-bytes"]) == size.quota_bytes >= model.FRAGMENTATION * size.history_bytes
    assert (flags["auto-compaction-mode"], flags["auto-compaction-retention"]) == ("periodic", "5m")
    assert int(flags["snapshot-count"]) == size.snapshot_count
    assert container["resources"] == {"requests": {"cpu": "400m", "memory": "128Mi"},
                                      "limits": {"cpu": "1", "memory": "512Mi"}}
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert volume["emptyDir"]["sizeLimit"] == "1024Mi"
    # The Job's agents: --nnodes 120:128 and the fleet's last call (a lost node's stragglers join its round).
    job = result.one("kubernetes:batch/v1:Job", "training-train").inputs
    agent = job["spec"]["template"]["spec"]["containers"][0]
    line = " ".join(agent.get("command", []) + agent.get("args", []))
    assert "--nnodes=120:128" in line and "last_call_timeout=3," in line, line


def test_the_last_call_grows_with_the_fleet_and_two_nodes_keep_the_measured_timing():
    from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, cluster_timeouts

    assert cluster_timeouts(2) == cluster_timeouts(8) == CLUSTER_TIMEOUTS  # bench/recovery.py's figures
    assert [cluster_timeouts(n).last_call for n in (1, 8, 9, 32, 33, 128, 1000)] == [1, 1, 2, 2, 3, 3, 3]
    assert {cluster_timeouts(n).keep_alive_interval * cluster_timeouts(n).keep_alive_max_attempt
            for n in (2, 128)} == {4}
    with pytest.raises(ValueError, match="nodes: got 0"):
        cluster_timeouts(0)
