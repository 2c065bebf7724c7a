# The two commands of the README. Each builds the virtual environment on first use
# and reuses it afterwards (the stamp file is rebuilt only when requirements.txt changes).
PYTHON ?= python3
VENV := .venv
SESSIONS_VENV := .venv-sessions
PY := $(VENV)/bin/python
OUT ?= outputs/main

.PHONY: main test lint bench clean-env

$(VENV)/.stamp: requirements.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip check
	@touch $@

## main: every notebook, end to end, in local mode with the tiny offline model
main: $(VENV)/.stamp $(SESSIONS_VENV)/.stamp
	$(PY) -m helpers.run_notebooks --out $(OUT)

## test: the whole test suite (what .ci/run calls)
test: $(VENV)/.stamp $(SESSIONS_VENV)/.stamp
	$(PY) -m pytest

lint: $(VENV)/.stamp
	$(PY) -m ruff check helpers scripts tests bench notebooks

bench: $(VENV)/.stamp
	$(PY) -m bench.run_all

clean-env:
	rm -rf $(VENV)

# The training-session environment: SageMaker SDK v3 (sagemaker-train) cannot share a virtual
# environment with SDK v2 (both own sagemaker/__init__.py), so it gets its own.
$(SESSIONS_VENV)/.stamp: requirements-sessions.txt
	@test -x $(SESSIONS_VENV)/bin/python || $(PYTHON) -m venv $(SESSIONS_VENV)
	$(SESSIONS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-sessions.txt
	$(SESSIONS_VENV)/bin/python -m pip check
	# The kernel notebooks 07+ name: papermill (main env) starts it by this name.
	$(SESSIONS_VENV)/bin/python -m ipykernel install --user --name sagemaker-training-sessions \
		--display-name "SageMaker training sessions (SDK v3)"
	@touch $@
