# make run   set up (virtualenv + deps) and run the default suites on the embedded local cluster
# make test  set up and run every test (the plugin's own tests and all suites)
# make fuzz  build the native core's fuzz targets and run each for a bounded time (cargo-fuzz)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
SUITES ?= suites
TESTS  ?= tests suites
PYTEST_ARGS ?=

.PHONY: setup run test guest hadoop-target ozone-target gates canary netns-suites fuzz clean asv-assets hadoop-jars ozone-jars

# The native core (native/: Rust + PyO3) is compiled into this package by setuptools-rust (setup.py;
# pip fetches setuptools-rust from PyPI while building, crates come from crates.io). NATIVE=auto builds
# it where cargo is (a failed build fails setup), and says so and goes on with the Python
# implementation where cargo is not; NATIVE=no skips it; NATIVE=yes requires it. The editable install
# builds the core in place (native/python/pytest_hpcnet_native/_native.abi3.so); a change under native/
# reinstalls.
NATIVE ?= auto
NATIVE_SRC = native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs) \
             $(wildcard native/python/pytest_hpcnet_native/*.py)

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(NATIVE_SRC)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@# the core was once a distribution of its own (pytest-hpcnet-native); it is part of this one now
	@$(PY) -m pip uninstall --quiet -y pytest-hpcnet-native 2>/dev/null || true
	@mode=$(NATIVE); if [ "$$mode" = auto ]; then \
	    if command -v cargo >/dev/null 2>&1; then mode=yes; \
	    else echo "setup: cargo not found: the native core is not built; impl=python runs (see README)"; mode=no; fi; \
	fi; \
	if [ "$$mode" = yes ]; then echo "setup: installing the package and building the native core (cargo, 2 jobs)"; fi; \
	start=$$(date +%s); \
	HPCNET_NATIVE=$$mode CARGO_BUILD_JOBS=2 $(PY) -m pip install --quiet -e '.[test]' || exit 1; \
	if [ "$$mode" = yes ]; then echo "setup: installed, native core built, in $$(( $$(date +%s) - start )) s"; fi
	@touch $(STAMP)

# The run's tables print at the end of pytest; the HTML report is written next to the run record.
run: setup
	@$(PY) -m pytest $(SUITES) -p no:cacheprovider $(PYTEST_ARGS); status=$$?; \
	record=$$(ls -t .hpcnet/*.json 2>/dev/null | head -n 1); \
	if [ -n "$$record" ]; then $(VENV)/bin/hpcnet report "$$record" -q; fi; exit $$status

# asv's published site loads its JavaScript from CDNs; fetch local copies once (npm registry) so the
# browser check works offline. Without npm the asv part of that check skips and says why.
asv-assets: setup
	-@$(VENV)/bin/hpcnet asv-site fetch || echo "asv site assets unavailable: the asv browser check will skip"

# A Maven module's jars into a dir: $(call maven-jars,<pom>,<dir>,<make target>,<whose tests skip>).
# Maven resolves a relative outputDirectory against the pom's folder, hence absolute dirs. Without
# mvn/java, or when mvn fails, the tests that need the jars skip and say why. pytest_hpcnet.maven runs
# mvn and says what it downloads.
define maven-jars
	@if command -v mvn >/dev/null 2>&1 && command -v java >/dev/null 2>&1; then \
	    $(PY) -m pytest_hpcnet.maven -f $(1) dependency:copy-dependencies -DoutputDirectory=$(2) \
	        && touch $(2)/.fetched || echo "$(3): mvn failed; the $(4) tests will skip"; \
	else echo "$(3): mvn or java missing; the $(4) tests will skip"; fi
endef

# The Hadoop target's jars (targets/hadoop/pom.xml) into .cache/hadoop: about 800 files, 120 MB, a
# minute the first time.
HADOOP_JARS ?= $(CURDIR)/.cache/hadoop
hadoop-jars: $(HADOOP_JARS)/.fetched
$(HADOOP_JARS)/.fetched: targets/hadoop/pom.xml $(STAMP)
	$(call maven-jars,targets/hadoop/pom.xml,$(HADOOP_JARS),hadoop-jars,Hadoop)

# Apache Ozone's daemons and its ofs:// client (targets/ozone/pom.xml, a Maven module of its own so its
# Hadoop does not mix with the Hadoop target's) into .cache/ozone: about 190 jars, 290 MB, 40 s the first
# time.
OZONE_JARS ?= $(CURDIR)/.cache/ozone
ozone-jars: $(OZONE_JARS)/.fetched
$(OZONE_JARS)/.fetched: targets/ozone/pom.xml $(STAMP)
	$(call maven-jars,targets/ozone/pom.xml,$(OZONE_JARS),ozone-jars,Ozone)

# The conformance files are written against the target fixture; run once more with --hpcnet-target
# hadoop (a session option), their tests drive Apache Hadoop's own programs (the tests that exercise the
# reference directly skip there). Hence a pytest of its own after the first, when the jars were fetched;
# HADOOP_TESTS= leaves it out. It writes its own run record (.hpcnet/<time>-<host>-<pid>.json).
HADOOP_TESTS ?= suites/mapreduce/test_conformance.py suites/dfsio/test_conformance.py suites/rpc/test_conformance.py \
                suites/crosscheck/test_crosscheck.py
# Seed 002 on separate HDFS, YARN and Ozone daemons across netns hosts (root only): JVMs waiting on jobs
# like the Hadoop step, so make test runs it after netns-suites, beside the Hadoop step, not in the first pytest.
OZONE_TESTS ?= suites/crosscheck/test_ozone.py
# Four Hadoop jobs (~2 min) that this step runs on Hadoop through the same workload in
# HADOOP_MINICLUSTER_TESTS (`hpcnet crosscheck --target hadoop --conf-dir`): not twice per CI.
HADOOP_DESELECT ?= suites/crosscheck/test_crosscheck.py::test_crosscheck_interleaves_records_and_judges
# Real Hadoop on one MiniCluster against the reference target (its TeraGen's bytes, TeraValidate of
# our TeraSort, RPCCallBenchmark both ways, the crosscheck command): JVMs waiting on jobs, ~4 min in
# one worker, so not in the first pytest, which it held up. It runs in HADOOP_TESTS' pytest: one process,
# so one MiniCluster serves both (targets/hadoop/shared.py), started and warmed up once.
HADOOP_MINICLUSTER_TESTS ?= suites/crosscheck/test_hadoop.py

# The Soft-RoCE guest (QEMU, two emulated CPUs) runs alone in its own step: beside another pytest worker
# its emulated clock is halved and its budgets are missed. GUEST_TESTS= leaves it out.
GUEST_TESTS ?= tests/test_vm.py::test_verbs_suites_pass_in_the_soft_roce_guest

# pytest's exit 5 (no tests collected) is a failure here, said in words: CI must never pass on nothing.
# The suites' local gates run after the other tests, alone on the machine: beside other tests their
# timings would measure the neighbours. Then the canary: the same gates with a 20% regression injected
# into each enforced gate's candidate; every such gate must FAIL (one that passes fails its test).
# Before them: the native fuzz targets (fuzz) and the Soft-RoCE guest (guest), each alone; then the
# Hadoop target's checks (hadoop-target) beside the suites once more on netns:4 (four hosts on this box,
# netns-suites) followed by seed 002 on Ozone (ozone-target, netns:4 too). None of these enforces a
# timing -- the Hadoop and Ozone steps are JVMs waiting on their jobs, the netns run reports its claims
# -- so two of them share the machine; three at once put a load of 12-16 on two cores and slowed every
# one. The Hadoop log is printed after. make test fails when any step does; each step's time is
# printed as it ends, and last the CPU the gates ran on (their bounds are recorded per host).
test: setup asv-assets hadoop-jars ozone-jars
	@t0=$$(date +%s); took() { echo "make test: $$1 took $$(( $$(date +%s) - $$2 )) s"; }; \
	$(PY) -m pytest $(TESTS) -p no:cacheprovider -n 2 --dist loadfile --durations=10 \
	    $(addprefix --ignore=,$(GATE_TESTS) $(OZONE_TESTS) $(HADOOP_MINICLUSTER_TESTS)) \
	    $(addprefix --deselect=,$(GUEST_TESTS)) $(PYTEST_ARGS); status=$$?; \
	if [ $$status = 5 ]; then echo "make test: pytest collected no tests" >&2; fi; took "the first pytest" $$t0; \
	t=$$(date +%s); $(MAKE) --no-print-directory fuzz || status=1; took fuzz $$t; \
	t=$$(date +%s); $(MAKE) --no-print-directory guest || status=1; took guest $$t; \
	mkdir -p .hpcnet; t=$$(date +%s); \
	( $(MAKE) --no-print-directory hadoop-target > .hpcnet/hadoop-target.log 2>&1; echo $$? > .hpcnet/hadoop-target.rc; \
	  took hadoop-target $$t >> .hpcnet/hadoop-target.log ) & \
	$(MAKE) --no-print-directory netns-suites || status=1; took netns-suites $$t; \
	s=$$(date +%s); $(MAKE) --no-print-directory ozone-target || status=1; took ozone-target $$s; \
	wait; echo "--- make hadoop-target (ran beside netns-suites and ozone-target):"; cat .hpcnet/hadoop-target.log; \
	[ "$$(cat .hpcnet/hadoop-target.rc 2>/dev/null)" = 0 ] || status=1; \
	t=$$(date +%s); $(MAKE) --no-print-directory gates || status=1; took gates $$t; \
	t=$$(date +%s); $(MAKE) --no-print-directory canary || status=1; took canary $$t; \
	echo "make test: the gates ran on $$($(PY) -m pytest_hpcnet.hostcpu) (their bounds are per CPU: Claim.hosts)"; \
	took "make test" $$t0; exit $$status

guest: setup
	@if [ -z "$(strip $(GUEST_TESTS))" ]; then echo "make guest: GUEST_TESTS is empty: no Soft-RoCE guest run"; \
	else $(PY) -m pytest $(GUEST_TESTS) -p no:cacheprovider -rs $(PYTEST_ARGS); fi

hadoop-target: setup hadoop-jars
	@if [ -z "$(strip $(HADOOP_TESTS) $(HADOOP_MINICLUSTER_TESTS))" ]; then \
	    echo "make hadoop-target: HADOOP_TESTS and HADOOP_MINICLUSTER_TESTS are empty: no Hadoop run"; \
	elif [ ! -f $(HADOOP_JARS)/.fetched ]; then \
	    echo "make hadoop-target: no $(HADOOP_JARS)/.fetched (see hadoop-jars above): the --hpcnet-target hadoop run is skipped"; \
	else \
	    $(PY) -m pytest $(HADOOP_TESTS) $(HADOOP_MINICLUSTER_TESTS) $(addprefix --deselect=,$(HADOOP_DESELECT)) \
	        -p no:cacheprovider -rs --hpcnet-target hadoop $(PYTEST_ARGS); status=$$?; \
	    if [ $$status = 5 ]; then echo "make hadoop-target: pytest --hpcnet-target hadoop collected no tests" >&2; fi; \
	    exit $$status; \
	fi

# Seed 002's crosscheck on Ozone and HDFS daemons across netns:4 (suites/crosscheck/test_ozone.py):
# needs root, Java and both jar dirs; the test says which is missing when it skips.
ozone-target: setup hadoop-jars ozone-jars
	@if [ -z "$(strip $(OZONE_TESTS))" ]; then echo "make ozone-target: OZONE_TESTS is empty: no Ozone run"; \
	else $(PY) -m pytest $(OZONE_TESTS) -p no:cacheprovider -rs $(PYTEST_ARGS); status=$$?; \
	    if [ $$status = 5 ]; then echo "make ozone-target: pytest collected no tests" >&2; fi; exit $$status; fi

# Every suite on a netns:4 cluster: four hosts, each its own network namespace, address and work dir,
# the controller on the bridge's port in the root namespace. Needs root (CI is); elsewhere it says why
# it skips. The run record must list 4 nodes with 4 different addresses. Records go to .hpcnet/netns.
# Claims are reported, not enforced, here: this run shares the machine between two workers, and the
# local gates are enforced where they are measured alone (make gates). The MiniCluster file is left
# to hadoop-target: its Hadoop is one JVM on loopback whatever the cluster, and the reference side it
# compares runs on netns:4 in the other suites here.
NETNS_SUITES ?= $(SUITES)
netns-suites: setup
	@if [ "$$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then \
	    echo "make netns-suites: skipped: netns clusters need root (euid 0) and iproute2's ip and tc"; exit 0; fi; \
	rm -rf .hpcnet/netns; \
	$(PY) -m pytest $(NETNS_SUITES) -p no:cacheprovider -n 2 --dist loadfile -q --durations=10 --hpcnet-cluster=netns:4 \
	    $(addprefix --ignore=,$(OZONE_TESTS) $(HADOOP_MINICLUSTER_TESTS)) \
	    --hpcnet-verdicts=report --hpcnet-report=.hpcnet/netns $(PYTEST_ARGS); status=$$?; \
	if [ $$status = 5 ]; then echo "make netns-suites: pytest collected no tests" >&2; fi; \
	$(PY) -m pytest_hpcnet.results check-nodes .hpcnet/netns 4 || status=1; exit $$status

# Coverage-guided fuzzing of the native core's parsers of untrusted bytes (native/fuzz: frames and
# ipc.maximum.data.length, preamble + context + calls, request/response headers, shm control data, the
# block store datanode's packet stream: receive, verify, write, forward).
# cargo-fuzz comes from crates.io, installed into ~/.cargo/bin when absent; it drives libFuzzer on
# the stable toolchain (--sanitizer none needs no nightly; debug assertions and overflow checks stay
# on). Each target starts from its committed corpus (native/fuzz/corpus/<target>; what a run finds
# goes to native/fuzz/target/corpus, not into git) and runs FUZZ_SECONDS; a crash fails, its input
# in native/fuzz/artifacts/<target>. Skipped, and said so, where cargo is not. libFuzzer runs on one core, so
# FUZZ_JOBS targets (one per core) run at a time, each for its own FUZZ_SECONDS; they are reported in order after.
FUZZ_TARGETS ?= frame connection request response shm packet
FUZZ_SECONDS ?= 15
FUZZ_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
CARGO_FUZZ_VERSION ?= 0.13.2
fuzz:
	@if ! command -v cargo >/dev/null 2>&1; then echo "fuzz: cargo not found: the native fuzz targets are skipped"; exit 0; fi; \
	if ! cargo fuzz --version >/dev/null 2>&1; then \
	    echo "fuzz: installing cargo-fuzz $(CARGO_FUZZ_VERSION) (crates.io)"; \
	    cargo install --quiet --locked --version $(CARGO_FUZZ_VERSION) cargo-fuzz || exit 1; \
	fi; \
	start=$$(date +%s); cd native && mkdir -p fuzz/target && \
	if ! cargo fuzz build --sanitizer none >fuzz/target/build.log 2>&1; then \
	    echo "fuzz: building the targets failed:" >&2; tail -n 40 fuzz/target/build.log >&2; exit 1; fi; \
	echo "fuzz: targets built in $$(( $$(date +%s) - start )) s"; \
	rm -f fuzz/target/*.rc; for t in $(FUZZ_TARGETS); do echo $$t; done | xargs -P $(FUZZ_JOBS) -I{} sh -c \
	    'mkdir -p fuzz/target/corpus/{}; cargo fuzz run --sanitizer none {} fuzz/target/corpus/{} fuzz/corpus/{} -- \
	        -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 >fuzz/target/{}.log 2>&1; \
	     echo $$? >fuzz/target/{}.rc'; \
	for t in $(FUZZ_TARGETS); do \
	    rc=$$(cat fuzz/target/$$t.rc 2>/dev/null || echo "no exit status"); \
	    done_line=$$(grep -a 'DONE ' fuzz/target/$$t.log | tail -n 1); \
	    if [ "$$rc" != 0 ]; then echo "fuzz: $$t FAILED (exit $$rc), native/fuzz/target/$$t.log:" >&2; \
	        grep -a -E -A1 'panicked at|==ERROR|^SUMMARY' fuzz/target/$$t.log | head -n 8 >&2; \
	        tail -n 12 fuzz/target/$$t.log >&2; exit 1; fi; \
	    echo "fuzz: $$t: $$(echo "$$done_line" | sed -E 's|^#([0-9]+)[[:space:]]+DONE[[:space:]]+cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+)/[^ ]+ .*exec/s: ([0-9]+).*|\1 runs in $(FUZZ_SECONDS) s (\5 exec/s), coverage: \2 edges, \3 features, corpus \4 inputs|')"; \
	done; \
	echo "fuzz: $(words $(FUZZ_TARGETS)) targets, no crash, $$(( $$(date +%s) - start )) s in all"

# The test files that evaluate the suites' local claims.
GATE_TESTS ?= suites/rpc/test_performance.py suites/mapreduce/test_performance.py \
              suites/dfsio/test_performance.py suites/qjump
CANARY ?= 20%
gates: setup
	@$(PY) -m pytest $(GATE_TESTS) -p no:cacheprovider -q $(PYTEST_ARGS); status=$$?; \
	if [ $$status = 5 ]; then echo "make gates: pytest collected no tests" >&2; fi; exit $$status

# The tests that evaluate enforced gates; a gate no test here evaluates fails the canary run too.
CANARY_TESTS ?= suites/rpc/test_performance.py::test_pooled_buffers_allocate_and_copy_less_per_call \
                suites/rpc/test_performance.py::test_interleaved_echo_cost \
                suites/mapreduce/test_performance.py::test_native_merge_cost \
                suites/dfsio/test_performance.py::test_checksum_cpu_native_crc32c_vs_instruction_floor \
                suites/dfsio/test_performance.py::test_blockstore_read_cpu_native_vs_floor \
                suites/dfsio/test_performance.py::test_blockstore_read_client_cpu_native_vs_python
canary: setup
	@$(PY) -m pytest $(CANARY_TESTS) -p no:cacheprovider -q --hpcnet-canary=$(CANARY) \
	    --hpcnet-report=.hpcnet/canary; status=$$?; \
	if [ $$status = 5 ]; then echo "make canary: pytest collected no tests" >&2; fi; exit $$status

clean:
	rm -rf $(VENV) .hpcnet .pytest_cache build *.egg-info native/target native/fuzz/target native/fuzz/artifacts \
	       native/python/pytest_hpcnet_native/*.so
