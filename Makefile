# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Both create .venv from the pinned requirements when it is missing or out of date:
# envs/install.py installs them with uv (wheels unpacked in parallel, pip's own settings for
# where packages come from passed on), or with pip where uv cannot be had, without compiling;
# compileall then compiles the environment and the library on every core. Compiling ahead is
# not optional: where PYTHONDONTWRITEBYTECODE is set (CI's machines, this project's sandboxes)
# Python never writes the bytecode of what it imports, so every job and test process would
# compile torch, transformers, xarray and Snakemake from source at each start. Left out: the
# libraries' own test suites, pip's and setuptools' code, and the model files of transformers
# other than those the project's kinds and tests load (a user's model compiles its one file at
# import). Files that do not compile on this Python (test helpers in newer syntax) are skipped,
# as pip skips them.
NOT_COMPILED := /tests?/|/testing/_internal/|/site-packages/(pip|setuptools|pkg_resources|_distutils_hack)/|/transformers/models/(?!(auto|llama|bert|t5|gpt2|vit)/)
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup run test test-slow test-all docs report clean-results

$(VENV)/.installed: requirements.txt requirements-data.txt pyproject.toml envs/install.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python envs/install.py $(VENV)
	$(BIN)/python -m compileall -qq -j 0 -x '$(NOT_COMPILED)' $(VENV)/lib oattn_lib scripts || true
	touch $@

# the environment alone, for using the clone as a module from another directory
# (docs/how-to/own-directory.md)
setup: $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/snakemake --profile workflow/profiles/default --cores $(CORES)
	$(BIN)/snakemake --profile workflow/profiles/default --cores $(CORES) --report results/report.html

# the suite a change must pass (10 minutes on a fresh 2-core clone, set-up included:
# bench/budget.yaml); the slow tier (tests marked slow: real runs of other configs, paper-size
# models) runs in CI beside it, and test-all runs both
test: $(VENV)/.installed $(VENV)/.extras-installed
	$(BIN)/python -m pytest -q -n $(CORES) -m "not slow"

# the slow tier executes the notebook (tests/test_site.py): it needs the site's tools too
test-slow: $(VENV)/.installed $(VENV)/.extras-installed $(VENV)/.docs-installed
	$(BIN)/python -m pytest -q -n $(CORES) -m slow

test-all: $(VENV)/.installed $(VENV)/.extras-installed $(VENV)/.docs-installed
	$(BIN)/python -m pytest -q -n $(CORES)

# the optional extras' packages (requirements-extras.txt: TransformerLens, nnsight), for the tests
# of oattn_lib.adapters; the main job never imports them
$(VENV)/.extras-installed: $(VENV)/.installed requirements-extras.txt
	$(BIN)/python envs/install.py --extras $(VENV)
	touch $@

# The documentation site (mkdocs.yml) into site/, strictly: a broken link or anchor, a docstring
# the API reference cannot read or a notebook cell that fails stops the build. Its tools
# (requirements-docs.txt) are installed into the same environment on first use, not by the
# set-up of `make run` and `make test`, which never build the site.
$(VENV)/.docs-installed: $(VENV)/.installed requirements-docs.txt
	$(BIN)/python -m pip install --quiet -r requirements-docs.txt
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean-results:
	rm -rf results/* .snakemake && touch results/.gitkeep
