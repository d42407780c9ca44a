# The two commands: `make demo` and `make test`. Each sets everything up first (scripts/setup.sh:
# a .venv with the vLLM 0.32.0 build for this machine; quick when already done).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-unit tiny-models clean

setup:
	@bash scripts/setup.sh

tiny-models: setup
	$(PY) -m vllm_omni.models.tiny

demo: setup
	$(PY) -m vllm_omni.demo

test: setup
	$(PY) -m pytest -q --durations=15 $(PYTEST_ARGS)

# Fast tests only: no vLLM engine is started.
test-unit: setup
	$(PY) -m pytest -q -m "not engine" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
