# make run   set up (virtualenv + deps) and run the default suites on the embedded local cluster
# make test  set up and run every test (the plugin's own tests and all suites)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SUITES ?= suites
TESTS  ?= tests suites
PYTEST_ARGS ?=

.PHONY: setup run test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: setup
	$(PY) -m pytest $(SUITES) -p no:cacheprovider $(PYTEST_ARGS)

test: setup
	$(PY) -m pytest $(TESTS) -p no:cacheprovider -n 2 --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .hpcnet .pytest_cache build *.egg-info
