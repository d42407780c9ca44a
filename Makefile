# The two commands: `make demo` and `make test`. Each sets everything up first (scripts/setup.sh:
# a .venv with the vLLM 0.32.0 build for this machine; quick when already done).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-unit lint tiny-models clean

setup:
	@bash scripts/setup.sh

tiny-models: setup
	$(PY) -m vllm_omni.testing.tiny

demo: setup
	$(PY) -m vllm_omni.demo

test: setup
	$(PY) -m pytest -q --durations=15 $(PYTEST_ARGS)

# Fast tests only: no vLLM engine is started.
test-unit: setup
	$(PY) -m pytest -q -m "not engine" $(PYTEST_ARGS)

# Style (CI runs it): ruff's rules ([tool.ruff] in pyproject.toml) and its formatting.
LINT_PATHS := vllm_omni tests benchmarks
lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
