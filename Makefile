# tributary — one-command set-up on a fresh Debian 12 machine (as root, or with sudo).
#   make demo   set everything up, then run the demo end to end on the embedded Postgres
#   make test   set everything up, then run the whole test suite
#   make setup  set-up alone: apt packages, .venv, the project installed into it, Apache Kafka's and Debezium's jars,
#               Spark's Kafka source, Docker Compose (built from source, for the compose file's check)
#   make lint   ruff check, ruff format --check and mypy over every package

SHELL := /bin/bash
PY ?= python3
VENV := .venv
APT_PACKAGES := postgresql-15 postgresql-15-wal2json openjdk-17-jre-headless maven libpostgresql-jdbc-java procps iproute2 chromium chromium-driver gcc libc6-dev zlib1g-dev python3-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: setup apt venv kafka debezium spark-kafka compose demo test lint bench clean

setup: apt venv kafka debezium spark-kafka compose

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# client/ (the tributary-client distribution) in the same pip command as the project, which depends on it:
# it comes from this checkout, not from the package index.
$(VENV)/.installed: pyproject.toml client/pyproject.toml capture/_hotpath.pyx log/local/_typed.pyx
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ./client -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

# Apache Kafka's broker (KRaft) for `tributary kafka up` and the tests: its jars and their dependencies from
# Maven Central, as deploy/kafka/pom.xml pins them; fetched again only when the pom changes.
KAFKA_LIB := build/kafka/lib
$(KAFKA_LIB)/.fetched: deploy/kafka/pom.xml
	rm -rf $(KAFKA_LIB) && mkdir -p $(KAFKA_LIB)
	mvn -q -B -f deploy/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(KAFKA_LIB))
	@touch $@

kafka: apt $(KAFKA_LIB)/.fetched

# Kafka Connect (standalone) with Debezium's PostgreSQL connector, the reference the envelope tests compare
# tributary's records with: its own classpath (deploy/debezium/pom.xml), apart from the broker's.
DEBEZIUM_LIB := build/debezium/lib
$(DEBEZIUM_LIB)/.fetched: deploy/debezium/pom.xml
	rm -rf $(DEBEZIUM_LIB) && mkdir -p $(DEBEZIUM_LIB)
	mvn -q -B -f deploy/debezium/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(DEBEZIUM_LIB))
	@touch $@

debezium: apt $(DEBEZIUM_LIB)/.fetched

# Spark's own Kafka source (spark-sql-kafka-0-10) for `[projections] kafka_reader = "spark"`: the connector and
# what it needs that Spark does not ship, as deploy/spark-kafka/pom.xml pins them; projections put these jars on
# the session's classpath.
SPARK_KAFKA_LIB := build/spark-kafka/lib
$(SPARK_KAFKA_LIB)/.fetched: deploy/spark-kafka/pom.xml
	rm -rf $(SPARK_KAFKA_LIB) && mkdir -p $(SPARK_KAFKA_LIB)
	mvn -q -B -f deploy/spark-kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(SPARK_KAFKA_LIB))
	@touch $@

spark-kafka: apt $(SPARK_KAFKA_LIB)/.fetched

# Docker Compose v2 (the `docker compose` CLI, standalone as `docker-compose`), for the test that runs
# `docker compose config` on deploy/compose.yaml: it needs no Docker engine. Built from source at the version
# pinned here with Go from the Go module proxy; `go mod download` checks the module against Go's checksum
# database and COMPOSE_SUM, and its go.sum pins every dependency. (`go install …@version` refuses it: its go.mod
# has `exclude` directives.) Go's module and build caches live under build/compose while it builds (about
# 1.5 GB) and are removed after; built again only when the version changes.
COMPOSE_VERSION := v2.40.3
COMPOSE_SUM := h1:XeYkQu1svDtyfZPv5nTwFryQ25ZJMkIlc4pz9HalMPI=
COMPOSE_DIR := build/compose
GO ?= $(or $(shell command -v go),/usr/local/go/bin/go)
$(COMPOSE_DIR)/.built-$(COMPOSE_VERSION):
	@command -v $(GO) >/dev/null || { echo "make compose: no Go toolchain (go) to build Docker Compose with" >&2; exit 1; }
	rm -rf $(COMPOSE_DIR) && mkdir -p $(COMPOSE_DIR)
	set -euo pipefail; export GOMODCACHE=$(abspath $(COMPOSE_DIR))/gomod GOCACHE=$(abspath $(COMPOSE_DIR))/gocache \
	    GOFLAGS=-modcacherw GOTOOLCHAIN=local; \
	src=$$($(GO) mod download -json github.com/docker/compose/v2@$(COMPOSE_VERSION) | $(PY) -c \
	    'import json, sys; m = json.load(sys.stdin); assert m["Sum"] == sys.argv[1], m; print(m["Dir"])' '$(COMPOSE_SUM)'); \
	cd "$$src" && $(GO) build -trimpath -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$(COMPOSE_VERSION)" \
	    -o $(abspath $(COMPOSE_DIR))/docker-compose ./cmd
	rm -rf $(COMPOSE_DIR)/gomod $(COMPOSE_DIR)/gocache
	$(COMPOSE_DIR)/docker-compose version
	@touch $@

compose: $(COMPOSE_DIR)/.built-$(COMPOSE_VERSION)

demo: setup
	$(VENV)/bin/tributary demo

# The whole suite on two workers (pytest-xdist), each with its own Postgres, Spark session and Kafka
# brokers; a module's tests stay together on one worker (its module fixtures are made once). Most of a
# test's time is spent waiting on processes it started, so two workers finish well before one on two
# cores. The 25 slowest tests are listed at the end. TEST_WORKERS=0 runs it in this process alone.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

# mypy sees the top-level folders as the package they install as (`capture/` is `tributary.capture`, …)
# through a tree of links under build/typecheck; what lives in the root folder `tributary/` is linked as it is,
# and `client/tributary_client` (the tributary-client distribution) beside it.
TYPECHECK_PACKAGES := api capture log eventstore projections migrations consumers sinks

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check --extend-exclude '*.md' .
	rm -rf build/typecheck && mkdir -p build/typecheck/tributary
	for d in $(TYPECHECK_PACKAGES); do ln -s ../../../$$d build/typecheck/tributary/$$d; done
	for f in tributary/*; do case $$f in *__pycache__) ;; *) ln -s ../../../$$f build/typecheck/$$f;; esac; done
	ln -s ../../client/tributary_client build/typecheck/tributary_client  # the client distribution, checked with its users
	cd build/typecheck && MYPYPATH=. ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p tributary -p tributary_client

bench: setup
	$(VENV)/bin/python bench/log_append.py

clean:
	-$(VENV)/bin/tributary pg down
	-$(VENV)/bin/tributary pg down --data-dir .tributary/demo/pg
	rm -rf .tributary
