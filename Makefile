# One task runner for the project. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help demo test lint bench up down status clean

help: ## List the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (Python packages of the project and its tests)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	@touch $@

demo: $(STAMP) ## Set up, start the local stack, run the demo pipeline end to end
	$(BIN)/blackbox demo

test: $(STAMP) ## Set up and run every test (starts and stops its own Postgres and Kafka)
	$(BIN)/python -m pytest

lint: $(STAMP) ## ruff check, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP) up ## Run the benchmarks against the local stack (JSON lines on stdout)
	$(BIN)/python -m bench

up: $(STAMP) ## Start the local stack (Postgres and Kafka on loopback)
	$(BIN)/blackbox stack up

down: $(STAMP) ## Stop the local stack (data is kept in .cache/)
	$(BIN)/blackbox stack down

status: $(STAMP) ## Show what runs where
	$(BIN)/blackbox stack status

clean: ## Remove the virtualenv and the local stack's data (stop it first)
	rm -rf $(VENV) .cache
