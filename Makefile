# The developer interface, and CI's: `make run` and `make test` set everything up themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run-stamp
STAMP := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.installed-bench-stamp
# Debian packages the test suite uses: git (scope repositories, git fetcher), bubblewrap (sandbox),
# docker-registry and skopeo (a real OCI registry and a client that is not ours), chromium (e2e),
# nodejs (the `atrium new --template node` app's interpreter), busybox-static (the images the image
# store tests build), postgresql (the state tests' second database: tests/state starts its own),
# haproxy (several shells behind deploy/haproxy.cfg), nftables (each instance's own network),
# slirp4netns (the network of an image instance under a shell that is not root), mmdebstrap (a
# real server's image, Debian's radicale, built from the configured Debian mirror by the e2e tests)
DEB_PACKAGES := git bubblewrap docker-registry skopeo chromium openssl nodejs busybox-static \
	postgresql haproxy nftables iptables iproute2 slirp4netns mmdebstrap
# and for `make bench`: nginx (the data proxy's anchor) and wrk (the load); the upstream app's
# uvloop and httptools for Debian's python3 (as root, apps run under their own uid and cannot
# reach an interpreter under /root); configurable-http-proxy comes from the npm registry on first
# use (with the machine's node and npm)
BENCH_DEB_PACKAGES := nginx-light wrk python3-uvloop python3-httptools

.PHONY: run test unit check fmt bench chaos system-deps bench-deps venv clean

# `make run` installs what running needs; the test and lint tools come with `make test`
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Atrium needs Python 3.11+"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# the extra `bench` (the data proxy's candidate client and server) only for `make bench`
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

venv: $(STAMP)

# Install missing Debian packages when running as root; otherwise say what is missing.
system-deps:
	@scripts/apt-install $(DEB_PACKAGES)

bench-deps:
	@scripts/apt-install $(DEB_PACKAGES) $(BENCH_DEB_PACKAGES)

# git is needed (scope repositories); bubblewrap is the best sandbox: without it the shell falls
# back to plain processes and says so; slirp4netns gives image apps a network of their own when
# the shell is not root (without it, and without root, image apps are refused)
run: $(RUN_STAMP)
	@scripts/apt-install git
	-@scripts/apt-install bubblewrap
	-@scripts/apt-install slirp4netns
	$(BIN)/atrium serve

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# the floor is the figure measured when it was set (docs/decisions.md "Coverage"): it may rise, never fall
COVERAGE_FLOOR := 86

# `check` runs beside the tests, niced (the tests keep the CPU they ask for: they mostly wait on
# real processes): a fresh clone's mypy has no cache and takes minutes. Its output is printed
# when the tests end; either failing fails `make test` (docs/decisions.md "Faster shell start")
test: system-deps $(STAMP)
	rm -rf .coverage-data && mkdir -p .coverage-data
	@checked=$$(mktemp); nice -n 10 $(MAKE) --no-print-directory check >$$checked 2>&1 & checks=$$!; \
	  $(BIN)/coverage run -m pytest; tests=$$?; \
	  wait $$checks; status=$$?; cat $$checked; rm -f $$checked; \
	  if [ $$status -ne 0 ]; then echo "make check failed (its output is above)"; exit $$status; fi; \
	  exit $$tests
	@$(BIN)/coverage combine -q
	@total=$$($(BIN)/coverage report --format=total --fail-under=$(COVERAGE_FLOOR)); status=$$?; \
	  echo "coverage of atrium/ by the tests: $$total% (floor $(COVERAGE_FLOOR)%)"; exit $$status

# the inner loop: the pure tests only (no servers, no packages), about 20 s, then every test
# folder collected together (about 12 s) as `make test` does, so an import-order error in
# collection (which stops the whole suite at once) shows here first
unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit
	@out=$$(mktemp); $(BIN)/pytest -q -p no:cacheprovider --collect-only >$$out 2>&1; status=$$?; \
	  tail -n 1 $$out; [ $$status -eq 0 ] || cat $$out; rm -f $$out; exit $$status

# random kill -9 of a real shell during install, update, uninstall, launch, backup, restore,
# rollback, export, import and wake, then the promises checked;
# CHAOS_RUNS runs (200), CHAOS_SEED replays one (docs/reliability.md)
CHAOS_RUNS ?= 200
CHAOS_SEED ?=
chaos: system-deps $(STAMP)
	CHAOS_RUNS=$(CHAOS_RUNS) CHAOS_SEED=$(CHAOS_SEED) $(BIN)/python -m bench chaos

# `make bench BENCH="dataproxy soak"` runs only those (names in bench/__main__.py);
# `make bench BENCH=load` holds 200 clients, 50 event streams and KV writes on one shell against
# the tail's goals (ATRIUM_BENCH_LOAD_SECONDS, 60; ATRIUM_BENCH_LOAD_PROVIDER, sdk or upstream)
bench: bench-deps $(BENCH_STAMP)
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .coverage-data
