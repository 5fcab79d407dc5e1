# Vendored from pytorch/pytorch: test/distributed/elastic/rendezvous/dynamic_rendezvous_test.py
# at commit 01f9ef32eae5ef513002dd44902c23cbe6be3aae (the v2.14.1 tag, 5c4886908584029761b579af026dcfb627c84070,
# the torch this repository pins, is not in the source index this was read from; of the stored versions this one
# matches torch 2.14.1's handler: next_rendezvous returns a RendezvousInfo, use_agent_store, the shared TCPStore
# and TORCH_DISABLE_SHARE_RDZV_TCP_STORE. The older stored 584cfb1c6279fde66bea473c0adc4cbbd4ad8598 has 3 of
# these 7 tests and the tuple return of torch <= 2.3).
# Copyright (c) Facebook, Inc. and its affiliates. BSD-3-Clause: see LICENSE in this folder (torch 2.14.1's).
# Only IntegrationTest and what it uses (_ignore_exception, _wait_for, _CapturingThread, _InMemoryRendezvousBackend,
# TEST_PORT), unchanged; the imports are those of the upstream file that these need. The file is renamed so pytest
# does not collect it alone: tests/runtime/test_rendezvous_torch_suite.py runs it against the eks-etcd backend.
# ruff: noqa

# Owner(s): ["oncall: r2p"]

# Copyright (c) Facebook, Inc. and its affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

import os
import pickle
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from unittest import TestCase
from unittest.mock import Mock, patch, PropertyMock

import torch.distributed as dist
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous import (
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    create_handler,
    DynamicRendezvousHandler,
    RendezvousBackend,
)


TEST_PORT = 54321


def _ignore_exception(exception_type: Exception, fn: Callable):
    try:
        fn()
    except exception_type:
        pass


def _wait_for(condition, timeout=10, interval=1, name=None):
    def _wait_while():
        while True:
            if condition():
                break
            else:
                time.sleep(interval)

    wait_thread = threading.Thread(target=_wait_while, name=name)
    wait_thread.start()
    wait_thread.join(timeout=timeout)


class _CapturingThread(threading.Thread):
    def __init__(self, target=None, name=None, args=None, kwargs=None):
        if args is None:
            args = ()
        if kwargs is None:
            kwargs = {}
        threading.Thread.__init__(
            self, target=target, args=args, kwargs=kwargs, name=name
        )
        self._result = None

    def run(self):
        if self._target is not None:
            self._result = self._target(*self._args, **self._kwargs)

    def join(self, *args):
        threading.Thread.join(self, *args)
        return self._result


class IntegrationTest(TestCase):
    def setUp(self) -> None:
        self._store = HashStore()
        self._handlers = []
        self._backend = _InMemoryRendezvousBackend()

    def tearDown(self) -> None:
        for handler in self._handlers:
            handler._stop_heartbeats()

    def _create_handler(self, **kwargs) -> DynamicRendezvousHandler:
        params = {
            "backend": self._backend.name,
            "endpoint": "dummy_endpoint",
            "run_id": "dummy_run_id",
            "min_nodes": 2,
            "max_nodes": 2,
            "join_timeout": "5",
            "local_addr": f"127.0.0.{len(self._handlers)}",
        }
        params.update(**kwargs)

        rzdv_params = RendezvousParameters(**params)

        handler = create_handler(self._store, self._backend, rzdv_params)
        self._handlers.append(handler)
        return handler

    def test_all_nodes_join_rendezvous(self) -> None:
        handler1 = self._create_handler(min_nodes=2, max_nodes=2)
        handler2 = self._create_handler(min_nodes=2, max_nodes=2)

        handler1_thread = _CapturingThread(target=handler1.next_rendezvous)
        handler2_thread = _CapturingThread(target=handler2.next_rendezvous)

        handler1_thread.start()
        handler2_thread.start()

        rdzv_info1: RendezvousInfo = handler1_thread.join()
        rdzv_info2: RendezvousInfo = handler2_thread.join()
        self.assertEqual(rdzv_info1.store.underlying_store, self._store)
        self.assertEqual(rdzv_info2.store.underlying_store, self._store)

        self.assertNotEqual(rdzv_info1.rank, rdzv_info2.rank)

        self.assertEqual(rdzv_info1.world_size, 2)
        self.assertEqual(rdzv_info2.world_size, 2)

    def test_redundancy_list(self) -> None:
        handler1 = self._create_handler(min_nodes=2, max_nodes=2)
        handler2 = self._create_handler(min_nodes=2, max_nodes=2)
        handler3 = self._create_handler(min_nodes=2, max_nodes=2)

        handler1_thread = _CapturingThread(target=handler1.next_rendezvous)
        handler2_thread = _CapturingThread(target=handler2.next_rendezvous)
        handler3_thread = _CapturingThread(
            target=_ignore_exception,
            args=(RendezvousTimeoutError, lambda: handler3.next_rendezvous()),
        )

        handler1_thread.start()
        handler2_thread.start()

        # establish successful rendezvous
        handler1_thread.join()
        handler2_thread.join()

        # expect to register in redundancy list
        handler3_thread.start()

        # wait until the handler3 is registered in the redundancy list
        _wait_for(lambda: pickle.loads(self._backend.get_state()[0]).redundancy_list)

        state_and_token = self._backend.get_state()
        state = pickle.loads(state_and_token[0])
        addresses = [node.addr for node in state.redundancy_list]
        self.assertListEqual(addresses, ["127.0.0.2"])

    def test_redundancy_transition_to_wait_list_then_join_rendezvous(self) -> None:
        handler1 = self._create_handler(
            min_nodes=1,
            max_nodes=2,
        )
        handler2 = self._create_handler(
            min_nodes=1,
            max_nodes=2,
            keep_alive_interval=timedelta(seconds=1),
        )
        handler3 = self._create_handler(
            min_nodes=1,
            max_nodes=2,
        )

        handler1_thread = _CapturingThread(target=handler1.next_rendezvous)
        handler2_thread = _CapturingThread(target=handler2.next_rendezvous)

        handler3_thread = _CapturingThread(
            target=_ignore_exception,
            args=(RendezvousTimeoutError, lambda: handler3.next_rendezvous()),
        )

        handler1_thread.start()
        handler2_thread.start()

        # establish successful rendezvous
        handler1_thread.join()
        handler2_thread.join()

        handler3_thread.start()

        _wait_for(lambda: pickle.loads(self._backend.get_state()[0]).redundancy_list)

        handler2._stop_heartbeats()

        _wait_for(
            lambda: len(pickle.loads(self._backend.get_state()[0]).participants) == 1
        )
        _wait_for(
            lambda: len(pickle.loads(self._backend.get_state()[0]).wait_list) == 1
        )

    def test_use_agent_store_is_true_by_default(self):
        handler = self._create_handler(
            min_nodes=1,
            max_nodes=2,
        )

        self.assertTrue(handler.use_agent_store)

    @patch.dict(os.environ, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    def test_use_agent_store_is_disabled(self):
        handler = self._create_handler(
            min_nodes=1,
            max_nodes=2,
        )

        self.assertFalse(handler.use_agent_store)

    @patch.object(dist, "PrefixStore")
    def test_share_tcp_store_from_backend(self, prefix_store_class_mock):
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

        prefix_store = CustomPrefixStore(spec=dist.PrefixStore)
        prefix_store_class_mock.return_value = prefix_store
        tcp_store = Mock(spec=dist.TCPStore)
        original_addr = "original_addr"
        original_port = TEST_PORT
        type(tcp_store).host = PropertyMock(return_value=original_addr)
        type(tcp_store).port = PropertyMock(return_value=original_port)
        # this will be injected
        self._store = tcp_store

        handler1 = self._create_handler(min_nodes=2, max_nodes=2)
        handler2 = self._create_handler(min_nodes=2, max_nodes=2)

        handler1_thread = _CapturingThread(target=handler1.next_rendezvous)
        handler2_thread = _CapturingThread(target=handler2.next_rendezvous)

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

    @patch.dict(os.environ, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    @patch.object(dist, "PrefixStore")
    def test_share_tcp_store_is_disabled(self, prefix_store_class_mock):
        prefix_store = Mock()
        prefix_store_class_mock.return_value = prefix_store

        prefix_store.set.return_value = None
        prefix_store.get.return_value = b"123"
        tcp_store = Mock(spec=dist.TCPStore)
        # this will be injected
        self._store = tcp_store

        handler1 = self._create_handler(min_nodes=2, max_nodes=2)
        handler2 = self._create_handler(min_nodes=2, max_nodes=2)

        handler1_thread = _CapturingThread(target=handler1.next_rendezvous)
        handler2_thread = _CapturingThread(target=handler2.next_rendezvous)

        handler1_thread.start()
        handler2_thread.start()

        rdzv_info1: RendezvousInfo = handler1_thread.join()
        rdzv_info2: RendezvousInfo = handler2_thread.join()

        self.assertEqual(rdzv_info1.store, prefix_store)
        self.assertEqual(rdzv_info2.store, prefix_store)
        prefix_store_class_mock.assert_called_with(
            "torch.rendezvous.dummy_run_id.0", self._store
        )
        self.assertEqual(rdzv_info1.bootstrap_store_info.master_port, 123)
        self.assertEqual(rdzv_info2.bootstrap_store_info.master_port, 123)


class _InMemoryRendezvousBackend(RendezvousBackend):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = None
        self._token = None

    @property
    def name(self):
        return "_in_memory_backend"

    def get_state(self):
        with self._lock:
            if self._state is None:
                return None
            return (self._state, self._token)

        return self._state

    def set_state(self, state, token):
        if state is None:
            raise ValueError("State cannot be None.")
        with self._lock:
            if token is None and self._token is not None:
                return None
            if self._token != token:
                return None

            self._state = state
            self._token = self._token + 1 if self._token is not None else 0
