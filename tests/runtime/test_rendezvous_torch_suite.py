"""torch's own rendezvous-backend test suite against the eks-etcd backend on a real etcd (v3, TLS as the Job uses it).

Vendored under tests/third_party/torch/ (source paths, commits and the license there): torch's
``RendezvousBackendTestMixin`` (rendezvous_backend_test.py) and the ``IntegrationTest`` of dynamic_rendezvous_test.py.
They run here three ways: the mixin against :class:`~eks_ddp_runtime.rendezvous.etcd_backend.EtcdV3Backend`; the integration
test with torch's stock ``DynamicRendezvousHandler`` (``create_handler``, as upstream) over that backend and
:class:`~eks_ddp_runtime.rendezvous.etcd_backend.EtcdV3Store`; and with the agents' own handler (``rendezvous._create``, the
``ElasticHandler`` the launcher builds from the Job's rdzv-conf). Every test of the suite runs; the differences are
deliberate and each is overridden here with a comment saying why:

1. The backend stores rendezvous states, not opaque bytes: ``set_state`` accepts only a pickled
   ``_RendezvousState`` (it writes checked JSON, rendezvous/state.py). The mixin's opaque states ``b"x"``, ``b"y"``,
   ``b"z"`` travel as states whose ``round`` carries their bytes (:class:`_OpaqueStates`); the test bodies are
   upstream's.
2. A corrupt state is not an error: ``get_state`` deletes it and answers "no state", so the agents re-form as after
   a store wipe instead of failing (``test_get_state_raises_error_if_backend_state_is_corrupt`` asserts that).
3. Two upstream tests fail on torch 2.14.1 with torch's own in-memory backend too (the control below):
   ``test_redundancy_transition_to_wait_list_then_join_rendezvous`` passes ``keep_alive_interval=timedelta(...)``,
   which 2.14.1's ``create_handler`` reads with ``get_as_int`` (``int(timedelta)``: TypeError); here it is passed
   as its seconds. ``test_share_tcp_store_from_backend`` builds ``Mock(spec=dist.PrefixStore)`` while
   ``dist.PrefixStore`` is patched (``InvalidSpecError: Cannot spec a Mock object``); here the spec is the real
   class, taken before the patch, and the body is otherwise upstream's.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import unittest
import uuid
from datetime import timedelta
from unittest.mock import Mock, PropertyMock, patch

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, _RendezvousState

from eks_ddp_local.etcd_server import start_etcd
from eks_ddp_runtime.rendezvous import handler as rendezvous
from eks_ddp_runtime.rendezvous.etcd_backend import EtcdV3Backend, EtcdV3Store, Retrier
from eks_ddp_runtime.rendezvous.etcd_client import EtcdV3Client
from tests.support.etcd_server import client_tls
from tests.third_party.torch import dynamic_rendezvous_integration as upstream
from tests.third_party.torch.rendezvous_backend import RendezvousBackendTestMixin

REAL_PREFIX_STORE = dist.PrefixStore


class _Etcd:
    """One real etcd per test class (each test uses its own keys)."""

    etcd = None
    _ctx = None

    @classmethod
    def setUpClass(cls) -> None:
        cls._tmp = tempfile.TemporaryDirectory(prefix="torch-suite-")
        cls._ctx = start_etcd(os.path.join(cls._tmp.name, "etcd"))
        cls.etcd = cls._ctx.__enter__()

    @classmethod
    def tearDownClass(cls) -> None:
        cls._ctx.__exit__(None, None, None)
        cls._tmp.cleanup()

    def conf(self) -> dict[str, str]:
        """The Job's rdzv-conf for this store (training/runtime/eks_ddp_runtime/launch_command.py: https and the three certificate files)."""
        tls = client_tls(self.etcd)
        return {"protocol": "https", "ca_cert": tls.ca_cert, "ssl_cert": tls.cert, "ssl_cert_key": tls.key,
                "read_timeout": "5", "store_retry_timeout": "5"}

    def params(self, run_id: str) -> RendezvousParameters:
        return RendezvousParameters(backend=rendezvous.BACKEND, endpoint=str(self.etcd), run_id=run_id, min_nodes=1,
                                    max_nodes=1, **self.conf())

    def client(self) -> EtcdV3Client:
        host, port = str(self.etcd).split(":")
        return EtcdV3Client(host, int(port), read_timeout=5, context=self.etcd.tls.client_context())


class _OpaqueStates(RendezvousBackend):
    """Difference 1: the mixin's opaque states as rendezvous states whose round is their bytes (big-endian)."""

    def __init__(self, backend: EtcdV3Backend) -> None:
        self.backend = backend

    @property
    def name(self) -> str:
        return self.backend.name

    @staticmethod
    def _in(state: bytes) -> bytes:
        s = _RendezvousState()
        s.round = int.from_bytes(state, "big")
        return pickle.dumps(s)

    @staticmethod
    def _out(bits: bytes) -> bytes:
        n = pickle.loads(bits).round  # bits built by the backend from checked JSON
        return n.to_bytes((n.bit_length() + 7) // 8, "big")

    def get_state(self):
        result = self.backend.get_state()
        return None if result is None else (self._out(result[0]), result[1])

    def set_state(self, state, token=None):
        result = self.backend.set_state(self._in(state), token)
        return None if result is None else (self._out(result[0]), result[1], result[2])


class EtcdV3BackendMixinTest(_Etcd, unittest.TestCase, RendezvousBackendTestMixin):
    def setUp(self) -> None:
        self.run_id = f"mixin-{uuid.uuid4().hex[:10]}"
        params = self.params(self.run_id)
        self.real = EtcdV3Backend(Retrier(params, 5.0), self.run_id, rendezvous.BACKEND)
        self._backend = _OpaqueStates(self.real)

    def _corrupt_state(self) -> None:
        self.client().put(self.real.key, b"non_base64")  # torch's etcd backend test writes the same

    def test_get_state_raises_error_if_backend_state_is_corrupt(self) -> None:
        # Difference 2 (deliberate): a corrupt state is deleted and reads as no state (a wiped store), so the
        # agents re-form instead of failing; upstream expects RendezvousStateError.
        self._corrupt_state()
        self.assertIsNone(self._backend.get_state())
        self.assertIsNone(self.client().get(self.real.key))


def _seconds(kwargs: dict) -> dict:
    """Difference 3: a timedelta keep_alive_interval as the seconds torch 2.14.1's get_as_int can read."""
    value = kwargs.get("keep_alive_interval")
    if isinstance(value, timedelta):
        kwargs = {**kwargs, "keep_alive_interval": str(int(value.total_seconds()))}
    return kwargs


class _SuiteOnEtcd(_Etcd, upstream.IntegrationTest):
    """Upstream's IntegrationTest with its store and backend on a real etcd (keys unique to each test). Upstream's
    redundancy-list tests leave their third handler joining; it ends when the class's etcd stops (a connection
    error after ``store_retry_timeout``, 5 s here, which pytest reports as an unhandled thread exception)."""

    __test__ = False  # a base: its two subclasses run it

    def setUp(self) -> None:
        super().setUp()  # upstream's: a HashStore and an in-memory backend, replaced here
        tag = uuid.uuid4().hex[:10]
        self.key_prefix = f"/torch-suite/{tag}/rendezvous"
        retry = Retrier(self.params("dummy_run_id"), 5.0)
        self._backend = EtcdV3Backend(retry, "dummy_run_id", rendezvous.BACKEND, key_prefix=self.key_prefix)
        self._store = EtcdV3Store(retry, self._backend, "dummy_run_id", prefix=f"/torch-suite/{tag}/store")

    def _create_handler(self, **kwargs):
        return super()._create_handler(**_seconds(kwargs))

    @patch.object(dist, "PrefixStore")
    def test_share_tcp_store_from_backend(self, prefix_store_class_mock):
        # Difference 3: upstream's body, with spec=REAL_PREFIX_STORE (the class before the patch) where upstream
        # specs the patched Mock (InvalidSpecError on torch 2.14.1 with its own backend too).
        expected_addr = "expected_address"
        expected_port = 54231

        class CustomPrefixStore(Mock):
            def get(self, key):
                return (
                    expected_addr.encode("utf-8")
                    if key == "MASTER_ADDR"
                    else bytes(str(expected_port), "utf-8")
                )

            def set(self, key, value):
                pass

        prefix_store = CustomPrefixStore(spec=REAL_PREFIX_STORE)
        prefix_store_class_mock.return_value = prefix_store
        tcp_store = Mock(spec=dist.TCPStore)
        original_addr = "original_addr"
        original_port = upstream.TEST_PORT
        type(tcp_store).host = PropertyMock(return_value=original_addr)
        type(tcp_store).port = PropertyMock(return_value=original_port)
        # this will be injected
        self._store = tcp_store

        handler1 = self._create_handler(min_nodes=2, max_nodes=2)
        handler2 = self._create_handler(min_nodes=2, max_nodes=2)

        handler1_thread = upstream._CapturingThread(target=handler1.next_rendezvous)
        handler2_thread = upstream._CapturingThread(target=handler2.next_rendezvous)

        handler1_thread.start()
        handler2_thread.start()

        rdzv_info1: RendezvousInfo = handler1_thread.join()
        rdzv_info2: RendezvousInfo = handler2_thread.join()

        self.assertEqual(rdzv_info1.store, prefix_store)
        self.assertEqual(rdzv_info2.store, prefix_store)
        prefix_store_class_mock.assert_called_with(
            "torch.rendezvous.dummy_run_id.0", tcp_store
        )

        self.assertEqual(
            rdzv_info1.bootstrap_store_info, rdzv_info2.bootstrap_store_info
        )

        self.assertEqual(rdzv_info1.bootstrap_store_info.master_addr, expected_addr)
        self.assertEqual(rdzv_info1.bootstrap_store_info.master_port, expected_port)


@pytest.mark.slow
class TorchHandlerOnEtcdV3Test(_SuiteOnEtcd):
    """torch's stock DynamicRendezvousHandler (upstream's create_handler) over EtcdV3Backend and EtcdV3Store."""

    __test__ = True

    @pytest.mark.long  # 18 s of upstream's fixed waits (make test-long); the redundancy list itself is in make test:
    # test_redundancy_list here and tests/runtime/test_launcher_contract.py's spare agent
    def test_redundancy_transition_to_wait_list_then_join_rendezvous(self) -> None:
        super().test_redundancy_transition_to_wait_list_then_join_rendezvous()


@pytest.mark.slow
class AgentHandlerOnEtcdV3Test(_SuiteOnEtcd):
    """The agents' own handler: rendezvous._create with the Job's TLS rdzv-conf (ElasticHandler, healing state
    holder), on the suite's store."""

    __test__ = True

    def _create_handler(self, **kwargs):
        params = {
            "backend": rendezvous.BACKEND,
            "endpoint": str(self.etcd),
            "run_id": "dummy_run_id",
            "min_nodes": 2,
            "max_nodes": 2,
            "join_timeout": "5",
            "local_addr": f"127.0.0.{len(self._handlers)}",
            **self.conf(),
        }
        params.update(**_seconds(kwargs))
        handler = rendezvous._create(RendezvousParameters(**params), key_prefix=self.key_prefix, store=self._store)
        self._handlers.append(handler)
        return handler

    @pytest.mark.long  # 18 s of upstream's fixed waits; the same body runs above with torch's own handler
    def test_redundancy_transition_to_wait_list_then_join_rendezvous(self) -> None:
        super().test_redundancy_transition_to_wait_list_then_join_rendezvous()


@pytest.mark.long  # it tests torch, not this backend: make test-long
class UpstreamControlTest(upstream.IntegrationTest):
    """The control: upstream's IntegrationTest with its own HashStore and in-memory backend on this torch, with the
    same two adaptations (difference 3), so a failure above is the backend's, not the suite's."""

    def _create_handler(self, **kwargs):
        return super()._create_handler(**_seconds(kwargs))

    test_share_tcp_store_from_backend = _SuiteOnEtcd.test_share_tcp_store_from_backend
