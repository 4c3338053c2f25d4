# Every target bootstraps .venv by itself: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench dist openapi clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "leadsvc needs Python 3.11+; set PYTHON=python3.11"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[postgres,redis,dev]'
	@touch $(STAMP)

# Webhook secrets derive from webhooks.secret_key: `make run` signs with a key made once in
# var/secret.key, so that a restart keeps every receiver's secret. A key set in the environment wins.
SECRET_KEY_FILE := var/secret.key

run: $(STAMP) $(SECRET_KEY_FILE)
	$(BIN)/leadsvc demo
	$(if $(LEADSVC_WEBHOOKS_SECRET_KEY)$(LEADSVC_WEBHOOKS_SECRET_KEY_FILE),,LEADSVC_WEBHOOKS_SECRET_KEY_FILE=$(SECRET_KEY_FILE)) $(BIN)/leadsvc serve

$(SECRET_KEY_FILE):
	@mkdir -p $(dir $@)
	@umask 077 && $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))' > $@.new && mv $@.new $@

# The browser test drives Debian's Chromium through chromedriver; the reverse-proxy test runs the
# README's nginx configuration. `make test` installs what is missing (as bench does wrk).
TEST_PACKAGES := $(if $(wildcard /usr/bin/chromium),,chromium) $(if $(wildcard /usr/bin/chromedriver),,chromium-driver) \
	$(if $(shell command -v nginx || command -v /usr/sbin/nginx),,nginx-light)

test: $(STAMP)
	@$(if $(strip $(TEST_PACKAGES)),{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(strip $(TEST_PACKAGES)) >/dev/null; } \
		|| { echo "the suite needs Debian's $(strip $(TEST_PACKAGES)): apt-get install $(strip $(TEST_PACKAGES))"; exit 1; })
	$(BIN)/python -m pytest

# dist/leadsvc.pyz: one file that runs with any Python 3.11+ (see README, Deployment).
dist: $(STAMP)
	$(BIN)/python tools/build_pyz.py --output dist/leadsvc.pyz

# Not part of `make test`: builds (once, cached in bench/.cache/ and the PostgreSQL database
# leadsvc_bench) a 1,000,000-lead database per backend, then measures leadsvc against bench/baseline.py.
bench: $(STAMP)
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; } || { echo "bench needs wrk: apt-get install wrk"; exit 1; }
	$(BIN)/python bench/run.py $(BENCH_ARGS)

openapi: $(STAMP)
	@mkdir -p schemas
	$(BIN)/leadsvc openapi --output schemas/openapi.json

clean:
	rm -rf $(VENV) var dist build *.egg-info .pytest_cache
