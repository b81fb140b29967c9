# One task runner for the project. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The files of the folders mapped into the agent_blackbox package. The editable install
# is strict (a tree of links in build/ that static tools can read), so a module added or
# removed is picked up by installing again. The list is rewritten only when it changes.
PARTS := blackbox schemas outbox consumers replayer backup console keystore broker stack cli wiring examples
MANIFEST := $(VENV)/.package-files
COMPILED := $(VENV)/.compiled
$(shell mkdir -p $(VENV) && find $(PARTS) -type f -not -path '*/__pycache__/*' 2>/dev/null | sort > $(MANIFEST).new && (cmp -s $(MANIFEST).new $(MANIFEST) || mv $(MANIFEST).new $(MANIFEST)); rm -f $(MANIFEST).new)

.DEFAULT_GOAL := help
.PHONY: help demo test docs lint bench soak up down status clean

help: ## List the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(MANIFEST)
	@echo "setting up $(VENV) (Python packages of the project and its tests)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# The strict editable install warns that it links build/; that is the point of it.
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install --quiet --config-settings editable_mode=strict --editable '.[dev]'
	@touch $@

# An installed wheel's modules are compiled when it is installed; the editable install's
# links are not, and where PYTHONDONTWRITEBYTECODE is set (as in some CI images) every
# process, each test's command and each replay worker, would compile them all again.
# compileall writes only what is missing or older than its source.
$(COMPILED): $(STAMP) $(filter %.py,$(shell cat $(MANIFEST)))
	$(BIN)/python -c "import agent_blackbox as p, compileall as c, os, sys; sys.exit(not c.compile_dir(os.path.dirname(p.__file__), quiet=1, workers=0))"
	@touch $@

demo: $(COMPILED) ## Set up, start the local stack, run the demo pipeline end to end
	$(BIN)/blackbox demo

test: $(COMPILED) docs ## Set up, build the docs and run every test (starts and stops its own Postgres and Kafka)
	$(BIN)/python -m pytest

# Every warning (a broken link or anchor, a name the API reference cannot find, a setting
# without a docstring) fails the build.
docs: $(STAMP) ## Build the documentation site into build/site/ (mkdocs --strict)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP) ## ruff check, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(COMPILED) up ## Run the benchmarks against the local stack (JSON lines on stdout)
	$(BIN)/python -m bench

soak: $(STAMP) ## The fault matrix over 1M events on its own services (SOAK_EVENTS=N; JSON lines)
	$(BIN)/python -m bench.soak

up: $(STAMP) ## Start the local stack (Postgres and Kafka on loopback)
	$(BIN)/blackbox stack up

down: $(STAMP) ## Stop the local stack (data is kept in .cache/)
	$(BIN)/blackbox stack down

status: $(STAMP) ## Show what runs where
	$(BIN)/blackbox stack status

clean: ## Remove the virtualenv and the local stack's data (stop it first)
	rm -rf $(VENV) .cache build
