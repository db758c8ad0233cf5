# make setup : create .venv and install the pinned stack (idempotent; a second run is a no-op)
# make demo  : setup + run the whole pipeline on the bundled tiny CPU default
# make test  : setup + the test suite
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(STAMP)

demo: setup
	$(BIN)/llm-pipeline run configs/pipelines/tiny-cpu.yaml

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs output
