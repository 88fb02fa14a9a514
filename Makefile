# The task runner behind the README's commands.  `make help` lists the targets.
VENV ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.labkit-setup
SIZE  ?= auto

.PHONY: help setup lab test notebooks doctor clean
help:  ## list targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: $(STAMP)  ## create .venv, install torch (CPU build without a GPU), labkit, kernel 'labkit'
$(STAMP): pyproject.toml scripts/setup.sh
	LABKIT_VENV=$(VENV) bash scripts/setup.sh
	@touch $@

# Jupyter refuses to run as root unless told; containers and cloud VMs often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

# Learners work on copies in work/ (git-ignored): the committed notebooks stay without outputs.
# WORK: where the copies live; LAB_ARGS: extra JupyterLab options (the browser test sets a port and token).
WORK     ?= work
LAB_ARGS ?=
lab: setup  ## open the workbook in JupyterLab on localhost, on your copies in work/ (token auth on)
	$(PY) -m labkit workcopy --to $(WORK)
	$(PY) -m jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=$(WORK) $(ROOT_FLAG) $(LAB_ARGS)

test: setup  ## run the whole test suite (unit tests + every notebook in smoke mode)
	$(PY) -m pytest

notebooks: setup  ## execute every notebook headless: copies + HTML in build/ (SIZE=auto|smoke|full)
	$(PY) -m labkit notebooks --size $(SIZE) --out build

doctor: setup  ## describe this machine and check the environment
	$(PY) -m labkit doctor

clean:  ## remove build outputs (keeps .venv)
	rm -rf build .pytest_cache
