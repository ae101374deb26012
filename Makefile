# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Both create .venv from the pinned requirements when it is missing or out of date, without
# compiling every installed module to bytecode (--no-compile: Python compiles the modules a job
# imports the first time it imports them, a small part of torch's and transformers' thousands).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: run test test-slow test-all report clean-results

$(VENV)/.installed: requirements.txt requirements-data.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -r requirements.txt
	$(BIN)/pip install --quiet --no-compile --no-deps -r requirements-data.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

run: $(VENV)/.installed
	$(BIN)/snakemake --profile workflow/profiles/default --cores $(CORES)
	$(BIN)/snakemake --profile workflow/profiles/default --cores $(CORES) --report results/report.html

# the suite a change must pass (10 minutes on a fresh 2-core clone, set-up included:
# bench/budget.yaml); the slow tier (tests marked slow: real runs of other configs, paper-size
# models, kill-and-resume) runs in CI beside it, and test-all runs both
test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n $(CORES) -m "not slow"

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n $(CORES) -m slow

test-all: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n $(CORES)

clean-results:
	rm -rf results/* .snakemake && touch results/.gitkeep
