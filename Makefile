# make setup : create .venv and install the pinned stack, plus Debian's chromium and postgresql for the tests
#              (idempotent; a second run is a no-op)
# make demo  : the Python setup + run the whole pipeline on the bundled tiny CPU default (no browser needed)
# make test  : setup + the test suite
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test-debs demo test test-two-node bench clean

setup: $(STAMP) test-debs

# Debian packages the tests need: chromium for the UI tests (tests/ui drive it through Playwright, whose own
# browser download cannot reach its CDN here) and postgresql for the session's Prefect server (tests/postgres.py:
# a team's shared server runs on PostgreSQL). Installed with apt-get when missing and we are root (CI on a fresh
# machine); elsewhere the UI tests skip and say why, and the server falls back to SQLite (in CI both fail).
DEBS := chromium:chromium postgresql:/usr/lib/postgresql/*/bin/pg_ctl
test-debs:
	@for want in $(DEBS); do pkg=$${want%%:*}; probe=$${want#*:}; \
	  if command -v $$probe >/dev/null 2>&1 || ls $$probe >/dev/null 2>&1; then continue; fi; \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing $$pkg (tests)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkg >/dev/null; } \
	      || echo "note: apt-get could not install $$pkg: the tests that need it skip (and fail in CI)"; \
	  else \
	    echo "note: no $$pkg and no root apt-get: the tests that need it skip (and fail in CI)"; \
	  fi; done

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/llm-pipeline run configs/pipelines/tiny-cpu.yaml

# three workers (pytest-xdist) on two cores, one test file each at a time: module fixtures stay in one process, and
# much of the suite waits on subprocesses and servers (two workers kept the cores 69% busy: README, "Tests and benchmarks")
TEST_WORKERS ?= 3
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# the two-node training dispatch alone (real Prefect server + worker, two msrun node ranks; 2-3.5 min)
test-two-node: setup
	$(BIN)/python -m pytest -q tests/flows/test_two_node_dispatch.py

bench: setup
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs output
