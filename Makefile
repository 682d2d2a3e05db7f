# The two commands of the README: `make run` and `make test`. Both bootstrap what they need.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=
# Two worker processes, one test file each at a time (a file's module fixtures stay in one worker): most of the
# suite waits (timeouts, restarts, culling), so two run in 8.5 minutes on 2 cores where one takes 15.
PYTEST_WORKERS ?= 2

.PHONY: run test bootstrap lint bench clean

bootstrap:
	@scripts/bootstrap.sh

run: bootstrap
	$(VENV)/bin/notebookos up $(ARGS)

test:
	@scripts/bootstrap.sh --browser
	$(VENV)/bin/ruff check jupyter_notebookos tests benchmarks
	$(VENV)/bin/mypy jupyter_notebookos
	$(VENV)/bin/python -m pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

lint: bootstrap
	$(VENV)/bin/ruff check jupyter_notebookos tests benchmarks
	$(VENV)/bin/ruff format --check jupyter_notebookos tests benchmarks
	$(VENV)/bin/mypy jupyter_notebookos

bench: bootstrap
	@for b in benchmarks/*.py; do echo "== $$b"; $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .venv-lab .venv-hub .hub .state build *.egg-info labextension/node_modules \
		labextension/jupyter_notebookos_lab/labextension labextension/build labextension/*.egg-info
