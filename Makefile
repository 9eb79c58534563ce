# tributary — one-command set-up on a fresh Debian 12 machine (as root, or with sudo).
#   make demo   set everything up, then run the demo end to end on the embedded Postgres
#   make test   set everything up, then run the whole test suite
#   make setup  set-up alone: apt packages, .venv, the project installed into it

SHELL := /bin/bash
PY ?= python3
VENV := .venv
APT_PACKAGES := postgresql-15 postgresql-15-wal2json openjdk-17-jre-headless libpostgresql-jdbc-java procps chromium chromium-driver gcc libc6-dev zlib1g-dev python3-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: setup apt venv demo test lint bench clean

setup: apt venv

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml capture/_hotpath.pyx capture/log/_typed.pyx
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

demo: setup
	$(VENV)/bin/tributary demo

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check api bench capture eventstore migrations projections tests setup.py
	$(VENV)/bin/mypy capture/log capture/lsn.py capture/wal2json.py capture/envelope.py capture/values.py capture/routing.py capture/schema_tracker.py capture/insert_template.py capture/source.py eventstore/aggregate.py eventstore/domain

bench: setup
	$(VENV)/bin/python bench/log_append.py

clean:
	-$(VENV)/bin/tributary pg down
	rm -rf .tributary
