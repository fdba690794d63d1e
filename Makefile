# The developer interface, and CI's: `make run` and `make test` set everything up themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Debian packages the test suite uses: git (scope repositories, git fetcher), bubblewrap (sandbox),
# docker-registry and skopeo (a real OCI registry and a client that is not ours), chromium (e2e)
DEB_PACKAGES := git bubblewrap docker-registry skopeo chromium openssl

.PHONY: run test check fmt bench system-deps venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Atrium needs Python 3.11+"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Install missing Debian packages when running as root; otherwise say what is missing.
system-deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    policy=/usr/sbin/policy-rc.d; own_policy=""; \
	    if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' > $$policy && chmod +x $$policy && own_policy=1; fi; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	    status=$$?; [ -n "$$own_policy" ] && rm -f $$policy; \
	    service docker-registry stop >/dev/null 2>&1 || true; \
	    [ $$status = 0 ] || exit $$status; \
	  else \
	    echo "missing Debian packages:$$missing (run as root or: sudo apt-get install$$missing)"; exit 1; \
	  fi; \
	fi

run: $(STAMP)
	$(BIN)/atrium serve

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: system-deps $(STAMP) check
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
