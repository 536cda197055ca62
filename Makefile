# The two commands the README starts with: `make demo` (the whole graph, locally: every source's
# partition, then the training tail) and `make test`.
# Both create .venv when it is missing. DAGSTER_HOME is honoured when set; otherwise the instance
# lives in .dagster_home/ with the repo's dagster.yaml.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ifeq ($(origin DAGSTER_HOME), undefined)
DAGSTER_HOME := $(CURDIR)/.dagster_home
HOME_CONFIG := $(DAGSTER_HOME)/dagster.yaml
endif
export DAGSTER_HOME
ZERO_RAW_URI ?= $(CURDIR)/.zero/raw

.PHONY: demo test lint bench venv bytecode

venv: $(VENV)/.installed $(VENV)/.activate-hook

$(VENV)/.installed: pyproject.toml requirements.lock
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	@touch $@

# `source .venv/bin/activate` also points DAGSTER_HOME at this repo's instance (creating it with the
# repo's dagster.yaml) and exports nothing else: `dagster dev`, `dagster-webserver` and `dagster-daemon`
# find the code location in [tool.dagster] of pyproject.toml; a second pointer such as
# DAGSTER_MODULE_NAME would make the webserver that `dagster dev` starts exit while `dagster dev` runs on.
$(VENV)/.activate-hook: Makefile deploy/activate-hook.sh $(VENV)/.installed
	@sed -i '/^# >>> zero_assets >>>$$/,/^# <<< zero_assets <<<$$/d; /DAGSTER_MODULE_NAME=zero_assets/d; /^# zero_assets: after activation/,/^# instance and code location\.$$/d; /^export DAGSTER_HOME="$${DAGSTER_HOME:-.*\/\.dagster_home}"$$/d' $(VENV)/bin/activate
	@cat deploy/activate-hook.sh >> $(VENV)/bin/activate
	@touch $@

# Python writes no bytecode where PYTHONDONTWRITEBYTECODE is set (this development host; AWS's deep
# learning containers), so every process compiled the project's modules again: 0.17-0.3 s of CPU for
# one that loads the definitions (the CLI, a run, a step), 0.04-0.07 s for a job. compileall writes them and
# skips what is up to date; a module edited since is compiled in memory, as before.
bytecode: venv
	@$(PY) -m compileall -q zero_assets training_code benchmarks

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	@mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

demo: venv bytecode $(HOME_CONFIG)
	@case "$(ZERO_RAW_URI)" in s3://*) ;; *) test -e "$(ZERO_RAW_URI)" || $(VENV)/bin/zero-assets make-demo-data --out "$(ZERO_RAW_URI)";; esac
	@# One listing of the top level registers the sources (printed); each registered source is indexed
	@# and validated in its own run (its partition), then the tail once: the selection, its shards, the
	@# warm state, training and the report; not the rehearsal (run by hand: README, "A training campaign").
	@set -o pipefail; \
	sources=$$(ZERO_RAW_URI="$(ZERO_RAW_URI)" $(VENV)/bin/zero-assets sources --register | tee /dev/stderr | awk -F'\t' '$$2 !~ /^refused/ {print $$1}') || exit 1; \
	for source in $$sources; do \
	  echo "source $$source"; \
	  ZERO_RAW_URI="$(ZERO_RAW_URI)" $(VENV)/bin/dg launch --assets 'raw_image_index,validated_images' --partition "$$source" || exit 1; \
	done
	ZERO_RAW_URI="$(ZERO_RAW_URI)" $(VENV)/bin/dg launch --assets 'key:training_set+ and not group:campaign'
	ZERO_RAW_URI="$(ZERO_RAW_URI)" $(VENV)/bin/zero-assets summary

# Four pytest-xdist workers, each taking whole files (a module's fixtures are built once): most tests wait on
# jobs, servers and subprocesses, so four keep 2 cores busy. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 4
test: venv bytecode $(HOME_CONFIG)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# What CI checks before the tests: ruff's lint rules and its formatting (config in pyproject.toml).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Speed: each benchmark prints `BENCH <name> ratio=<x> goal=<y>` against a baseline from the same run.
bench: venv bytecode
	$(PY) -m benchmarks $(BENCH)
