# make setup : create .venv and install the pinned stack, plus Debian's chromium for the browser tests
#              (idempotent; a second run is a no-op)
# make demo  : the Python setup + run the whole pipeline on the bundled tiny CPU default (no browser needed)
# make test  : setup + the test suite
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup browser demo test test-two-node bench clean

setup: $(STAMP) browser

# The UI tests (tests/ui) drive Debian's chromium through Playwright (Playwright's own browser download
# cannot reach its CDN here). Installed with apt-get when missing and we are root (CI on a fresh machine);
# elsewhere the tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium (browser tests)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	      || echo "note: apt-get could not install chromium: the browser tests (tests/ui) will be skipped"; \
	  else \
	    echo "note: no chromium and no root apt-get: the browser tests (tests/ui) will be skipped"; \
	  fi; }

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/llm-pipeline run configs/pipelines/tiny-cpu.yaml

test: setup
	$(BIN)/python -m pytest -q

# the two-node training dispatch alone (real Prefect server + worker, two msrun node ranks; 2-3.5 min)
test-two-node: setup
	$(BIN)/python -m pytest -q tests/flows/test_two_node_dispatch.py

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs output
