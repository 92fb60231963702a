# Common commands. `make demo` deploys to the local lab; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYINFRA := $(VENV)/bin/pyinfra
# Every lab stack (files/stacks/lab-*.yml: the lab's own, and the deliberately broken pair the tests deploy), comma-separated.
LAB_STACKS := $(shell ls files/stacks | sed -n 's/^\(lab-.*\)\.yml$$/\1/p' | paste -sd, -)
LAB_WHEELHOUSE := lab/cache/wheelhouse
# The demo's two hosts; the tests add spare hosts for placement and migration (old -> new).
LAB_HOSTS ?= gpu-a,gpu-b
TEST_LAB_HOSTS ?= gpu-a,gpu-b,gpu-c,gpu-d,gpu-e

.PHONY: help deps venv lab test-lab-hosts lab-down lab-status wheelhouse demo test test-unit test-lab bench lint clean

help:
	@echo "make demo       start the local lab and deploy the services to it"
	@echo "make test       run the whole test suite (unit + lab)"
	@echo "make test-unit  fast tests only (no lab)"
	@echo "make bench      print the benchmark figures (name: value)"
	@echo "make lab / lab-down / lab-status"

# System packages the lab needs (Debian/Ubuntu; run as root). Skipped when present.
deps:
	@command -v systemd-nspawn >/dev/null && command -v debootstrap >/dev/null && command -v ssh-keygen >/dev/null \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container debootstrap openssh-client iproute2 python3-venv)

$(VENV)/.done: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.done

lab: deps venv
	$(PY) lab/lab.py up --hosts $(LAB_HOSTS)

test-lab-hosts: deps venv
	$(PY) lab/lab.py up --hosts $(TEST_LAB_HOSTS)

lab-down:
	$(PYTHON) lab/lab.py down

lab-status:
	$(PYTHON) lab/lab.py status

wheelhouse: venv
	$(PY) -m tools.wheelhouse $(LAB_STACKS) $(LAB_WHEELHOUSE)

demo: lab wheelhouse
	$(PYINFRA) lab/inventory.py deploy.py -y

test-unit: venv
	$(PY) -m pytest tests/unit -q

test-lab: test-lab-hosts wheelhouse
	$(PY) -m pytest tests/lab -q -m lab

test: test-lab-hosts wheelhouse
	$(PY) -m pytest tests -q -m 'lab or not lab' --durations=30

bench: lab wheelhouse
	$(PY) bench/run.py $(FIGURES)

lint: venv
	$(VENV)/bin/pip install --quiet ruff==0.17.6 && $(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
