# make run   set up (virtualenv + deps) and run the default suites on the embedded local cluster
# make test  set up and run every test (the plugin's own tests and all suites)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SUITES ?= suites
TESTS  ?= tests suites
PYTEST_ARGS ?=

.PHONY: setup run test clean asv-assets

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The run's tables print at the end of pytest; the HTML report is written next to the run record.
run: setup
	@$(PY) -m pytest $(SUITES) -p no:cacheprovider $(PYTEST_ARGS); status=$$?; \
	record=$$(ls -t .hpcnet/*.json 2>/dev/null | head -n 1); \
	if [ -n "$$record" ]; then $(VENV)/bin/hpcnet report "$$record" -q; fi; exit $$status

# asv's published site loads its JavaScript from CDNs; fetch local copies once (npm registry) so the
# browser check works offline. Without npm the asv part of that check skips and says why.
asv-assets: setup
	-@$(VENV)/bin/hpcnet asv-site fetch || echo "asv site assets unavailable: the asv browser check will skip"

# pytest's exit 5 (no tests collected) is a failure here, said in words: CI must never pass on nothing.
test: setup asv-assets
	@$(PY) -m pytest $(TESTS) -p no:cacheprovider -n 2 --dist loadfile $(PYTEST_ARGS); status=$$?; \
	if [ $$status = 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$status

clean:
	rm -rf $(VENV) .hpcnet .pytest_cache build *.egg-info
