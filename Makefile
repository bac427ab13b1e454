# Everything Phalanx needs installs from this file and pyproject.toml.
#   make demo   local cluster up, operator installed with Helm, a TrainingJob trained through a failure
#   make demo-real  the same on a real node (root): the images built first, a worker's container SIGKILLed
#   make test   the type check, then every test: unit and end-to-end against the real control plane (built once, cached)
#   make test-long   the cluster scenarios of minutes whose parts other tests cover too (not in CI)
#   make test-bench  the smoke of Phalanx's own benchmarks on the local cluster (not in CI)
#   make test-peers  the smoke of the peers' benchmarks (torchft, DLRover, Kubeflow Trainer, JobSet; not in CI)
#   make test-real-node  every real-node test, the two trainings in real containers included (root; those two not in CI)
#   make bench  the benchmarks (not part of `make test`; their smoke mode is), report in bench/results/
#   make image  the operator and worker images without a registry (buildah; docs/images.md)
#   make lock   the images' hash locks (locks/) from constraints.txt, after changing it
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# A local wheel folder, where a machine has one (a CPU build of torch, say), is offered to pip beside PyPI.
PIP_FIND_LINKS ?= /opt/wheels
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=
PYTEST := $(BIN)/python -m pytest
# After a pytest run: its exit 5 (no test collected) fails too, so that a selection matching nothing never passes.
NONE_RAN = if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; rc=1; fi

.PHONY: install deps control-plane real-node test test-long test-compat test-bench test-peers test-real-node unit e2e lint typecheck demo demo-real bench image lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# Third-party dependencies change rarely: reinstall them only when pyproject.toml changes. uv installs them: from
# its cache (~/.cache/uv) it links the files of the several GB of torch and CUDA wheels into a fresh venv where pip
# unpacked them again, 1 minute instead of 3 of CI's 90. The bytecode is compiled once here: processes started
# with PYTHONDONTWRITEBYTECODE would otherwise compile torch at each import.
$(VENV)/.deps-stamp: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install -c constraints.txt uv
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode --find-links $(PIP_FIND_LINKS) \
		-c constraints.txt -e ".[dev]"
	touch $@

deps: $(VENV)/.deps-stamp

# Phalanx itself: an editable install through pyproject's package mapping (edits stay live). It is redone
# every time (a few seconds, no dependencies) so that new modules and data files are linked too. Its bytecode is
# compiled here, once: a process whose environment says PYTHONDONTWRITEBYTECODE (CI's does) would otherwise compile
# every module it imports, each time it starts (0.2 s of CPU per launcher; the tests start thousands).
install: deps
	$(PIP) install --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q -j 0 build/__editable__.*

# The control plane alone serves the agent's nodes (the demo, the benchmarks); the tests and the real-node demo
# also need kubelet and kube-proxy, built with it the first time when both are missing.
control-plane: install
	$(BIN)/phalanx dev install

real-node: install
	$(BIN)/phalanx dev install --real-node

lint: install
	$(BIN)/ruff check src operator worker devcluster tests bench examples
	$(BIN)/ruff format --check src operator worker devcluster tests bench examples

# CI (`.ci/run`) runs this: lint and the type check first, then every test.
# Every test but the benchmarks' smoke: the peers' (`make test-peers`) measures the baselines (torchft, DLRover,
# and two more controllers built from their Go modules), not Phalanx; Phalanx's own (`make test-bench`) takes
# about 10 minutes of a stream. With either, CI would not fit its 90 minutes on two cores.
# The tests that need no cluster (`make unit`, on two processes) and then the local cluster's (`make e2e`, on two
# processes with a cluster each); with -k, a failure in the first still lets the second run, and fails the whole.
# (Run side by side, the unit tests at nice 19 on the CPU the e2e tests leave idle, the launchers' unit tests,
# judged by the clock, missed their timing, and the e2e tests ran 16% slower: two cores share more than time.)
test: lint typecheck real-node
	$(MAKE) --no-print-directory -k unit e2e

# The cluster scenarios of a minute or more whose parts other tests in `make test` cover too (marker `long`; the
# README lists them, each with the test that stays). With them `make test` would not fit CI's 90 minutes on two
# cores.
test-long: real-node
	$(PYTEST) -m "long and not peers and not bench" tests/e2e tests/chaos $(PYTEST_ARGS); rc=$$?; $(NONE_RAN); exit $$rc

# `phalanx bench --quick` for Phalanx's own cluster benchmarks (gang creation, operator scale, re-rendezvous,
# recovery, goodput, hang detection, kills during saves).
test-bench: control-plane
	$(PYTEST) -m bench tests/e2e $(PYTEST_ARGS); rc=$$?; $(NONE_RAN); exit $$rc

# `phalanx bench --quick` for the peers beside Phalanx: torchft and DLRover, Kubeflow Trainer and JobSet (built
# from their modules the first time).
test-peers: control-plane
	$(PYTEST) -m peers tests/e2e $(PYTEST_ARGS); rc=$$?; $(NONE_RAN); exit $$rc

# Type check (mypy; settings under [tool.mypy] in pyproject.toml) of operator/, worker/, devcluster/, bench/
# and src/phalanx. pyproject's package-dir maps those folders into `phalanx`, which mypy cannot follow from the
# checkout nor through an editable install, so it checks a plain copy of the package installed into
# $(TYPECHECK_DIR) (no dependencies: seconds); third parties come from the venv. Its report is rewritten to
# name the checkout's files: $(TYPECHECK_DIR)/phalanx/worker/launch.py is worker/launch.py (operator/,
# devcluster/, bench/ alike), $(TYPECHECK_DIR)/phalanx/cli.py is src/phalanx/cli.py. mypy's cache lives beside the
# control plane's build, outside the checkout: a fresh clone's check then takes seconds instead of two minutes of
# CI's 90 (mypy compares each file's hash before it trusts what it cached).
TYPECHECK_DIR := build/typecheck
PHALANX_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/phalanx
typecheck: install
	rm -rf $(TYPECHECK_DIR)
	$(PIP) install --no-deps --no-build-isolation --no-compile --target $(TYPECHECK_DIR) .
	MYPYPATH=$(TYPECHECK_DIR) $(BIN)/mypy --cache-dir $(PHALANX_CACHE_DIR)/mypy -p phalanx > build/typecheck.out; rc=$$?; \
	sed -E -e 's,^$(TYPECHECK_DIR)/phalanx/(operator|worker|devcluster|bench)/,\1/,' \
		-e 's,^$(TYPECHECK_DIR)/phalanx/,src/phalanx/,' build/typecheck.out; exit $$rc

# Every test that needs no cluster, on two processes (pytest-xdist); tests/conftest.py keeps those that start
# training processes together on one of them.
unit: install
	$(PYTEST) -m "not peers and not bench" -n 2 --dist loadgroup --ignore=tests/e2e --ignore=tests/chaos \
		$(PYTEST_ARGS); rc=$$?; $(NONE_RAN); exit $$rc

# The local cluster's tests (tests/e2e, tests/chaos) on two processes, each with a cluster of its own (the host
# routes two pod networks), a test file whole on one of them (tests/conftest.py); then, alone, the real node's
# tests (their cluster needs a routed pod network and this host's one kubelet; their two trainings through a
# failure in containers are left to `make test-real-node`) and the demo's (its `phalanx demo` upgrades the
# session's Helm release, and Helm names the fields it owns after the process: an xdist worker renames its own).
# A test on a local cluster is partly waiting (for a heartbeat's timeout, for a job to start and finish): one at a
# time, the two cores were busy for about two thirds of the suite, and two side by side fill the rest.
E2E_MARKERS := not peers and not bench and not real_training and not long
SERIAL_TESTS := tests/e2e/test_real_node.py tests/e2e/test_demo.py
e2e: real-node
	$(PYTEST) -m "$(E2E_MARKERS)" -n 2 --dist loadgroup --no-loadscope-reorder $(SERIAL_TESTS:%=--ignore=%) \
		tests/e2e tests/chaos $(PYTEST_ARGS); rc=$$?; $(NONE_RAN); \
	$(PYTEST) -m "$(E2E_MARKERS)" $(SERIAL_TESTS) $(PYTEST_ARGS); rc2=$$?; \
	$(SERIAL_NONE_RAN); [ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]
# None of the tests run alone collected fails the run, unless PYTEST_ARGS chose the tests.
SERIAL_NONE_RAN = if [ $$rc2 -eq 5 ]; then $(if $(strip $(PYTEST_ARGS)),rc2=0,echo "pytest collected none of \
	$(SERIAL_TESTS): failing" >&2; rc2=1); fi

# Every real-node test (root): containerd, kubelet and kube-proxy on this host, the images, and the demo and the
# example trained through a failure in real containers.
test-real-node: real-node
	$(PYTEST) -m realnode tests/e2e $(PYTEST_ARGS); rc=$$?; $(NONE_RAN); exit $$rc

# The oldest Kubernetes minor still supported, as a second target (not in CI): its build (about 10 minutes the
# first time), then the demo, the CRD and chart install and the end-to-end smoke tests (marker `compat`) on it.
COMPAT_KUBE_VERSION ?= 1.35.8
test-compat: install
	PHALANX_KUBE_VERSION=$(COMPAT_KUBE_VERSION) $(BIN)/phalanx dev install
	PHALANX_KUBE_VERSION=$(COMPAT_KUBE_VERSION) $(PYTEST) -m compat tests/e2e $(PYTEST_ARGS); rc=$$?; $(NONE_RAN); exit $$rc

demo: control-plane
	$(BIN)/phalanx demo

# The demo on a real node (containerd, kubelet, kube-proxy on this host; root), the images built first and
# cached (`make image`'s build).
demo-real: real-node
	$(BIN)/phalanx demo --real-nodes

# Benchmarks: the cluster benchmarks share a local cluster started for the run and stopped after; report.md,
# results.json and plots go to bench/results/ (p50/p95/max, the machine, every timeout, the baselines).
#   BENCH_ARGS="--quick" (smoke mode)   BENCH_ARGS="--only gang-creation operator-scale"   `phalanx bench --list`
BENCH_ARGS ?=
bench: control-plane
	$(BIN)/phalanx bench --out bench/results $(BENCH_ARGS)

# The images on Debian bases made from this machine's mirror, cached under ~/.cache/phalanx/images; the worker
# gets Debian's CPU build of torch. IMAGE_ARGS="--target worker", "--torch cpu --wheels DIR" (PyTorch's CPU
# wheel) or "--torch cu126 --torch-index-url URL"; a wheel variant needs its lock first (`phalanx image lock
# --torch-variant cpu --torch-index-url DIR-or-URL`).
IMAGE_ARGS ?=
image: install
	$(BIN)/phalanx image build $(IMAGE_ARGS)

# The hash locks the Dockerfile installs from (locks/): write them again after changing constraints.txt.
lock: install
	$(BIN)/phalanx image lock

clean:
	rm -rf $(VENV) build dist src/*.egg-info *.egg-info
