# make run   set up (virtualenv + deps) and run the default suites on the embedded local cluster
# make test  set up and run every test (the plugin's own tests and all suites)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SUITES ?= suites
TESTS  ?= tests suites
PYTEST_ARGS ?=

.PHONY: setup run test clean asv-assets hadoop-jars

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

# The Hadoop target's jars (targets/hadoop/pom.xml) into .cache/hadoop; Maven resolves a relative
# outputDirectory against the pom's folder, hence the absolute path. Without mvn/java the Hadoop tests skip.
HADOOP_JARS ?= $(CURDIR)/.cache/hadoop
hadoop-jars: $(HADOOP_JARS)/.fetched
$(HADOOP_JARS)/.fetched: targets/hadoop/pom.xml
	@if command -v mvn >/dev/null 2>&1 && command -v java >/dev/null 2>&1; then \
	    mvn -q -B -f targets/hadoop/pom.xml dependency:copy-dependencies -DoutputDirectory=$(HADOOP_JARS) && touch $@ \
	    || echo "hadoop-jars: mvn failed; the Hadoop tests will skip"; \
	else echo "hadoop-jars: mvn or java missing; the Hadoop tests will skip"; fi

# The Hadoop target's conformance checks need --hpcnet-target hadoop, a session option, hence a second
# pytest (one process: one MiniCluster) after the first, when the jars were fetched; HADOOP_TESTS=
# leaves it out. Each pytest writes its own run record (.hpcnet/<time>-<host>-<pid>.json).
HADOOP_TESTS ?= suites/mapreduce/test_hadoop_conformance.py suites/dfsio/test_hadoop_dfsio.py

# pytest's exit 5 (no tests collected) is a failure here, said in words: CI must never pass on nothing.
# make test fails when either pytest does, with the first failing status.
test: setup asv-assets hadoop-jars
	@$(PY) -m pytest $(TESTS) -p no:cacheprovider -n 2 --dist loadfile $(PYTEST_ARGS); status=$$?; \
	if [ $$status = 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	if [ -z "$(strip $(HADOOP_TESTS))" ]; then echo "make test: HADOOP_TESTS is empty: no --hpcnet-target hadoop run"; \
	elif [ ! -f $(HADOOP_JARS)/.fetched ]; then \
	    echo "make test: no $(HADOOP_JARS)/.fetched (see hadoop-jars above): the --hpcnet-target hadoop run is skipped"; \
	else \
	    $(PY) -m pytest $(HADOOP_TESTS) -p no:cacheprovider --hpcnet-target hadoop $(PYTEST_ARGS); hstatus=$$?; \
	    if [ $$hstatus = 5 ]; then echo "make test: pytest --hpcnet-target hadoop collected no tests" >&2; fi; \
	    if [ $$status = 0 ]; then status=$$hstatus; fi; \
	fi; exit $$status

clean:
	rm -rf $(VENV) .hpcnet .pytest_cache build *.egg-info
