# deepen-run: every target sets up the virtualenv first if it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
GLUE    ?= $(abspath ../shared/glue)
export DEEPEN_GLUE_DIR ?= $(GLUE)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: install test test-fast demo sweep ui bench lint clean clean-all study study-s3 study-s4 study-ablations

$(BIN)/deepen-run: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned first: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/deepen-run

# Everything, what CI runs; the slowest tests are listed at the end. One test process a core
# (pytest-xdist): a Ctrl-C'd sweep's launcher no longer waits inside its signal handler, so the sweep
# tests hold beside other tests (docs/reliability.md); timing: docs/development.md.
test: install
	$(BIN)/pytest -q -n auto --dist worksteal --durations=15

# The development loop: unit contracts on the tiny random BERT, no end-to-end or slow runs; one test
# process a core (pytest-xdist; worksteal hands out the longer tests early).
test-fast: install
	$(BIN)/pytest -q -n auto --dist worksteal -m "not e2e and not slow and not subprocess and not slurm and not postgres" --durations=5

# HIRE on SST-2, offline MiniLM, a 2000-example subset: a few minutes on a laptop CPU.
# Keeps its weights (train.save_best=true): deepen-predict --run <its id> "a gorgeous, witty film" uses them.
demo: install
	$(BIN)/deepen-run method=hire task=sst2 backbone=minilm data.max_train_samples=2000 train.max_steps=60 \
		train.learning_rate=5e-5 data.max_seq_length=64 train.save_best=true

# A small parallel sweep: 4 seeds of MiniLM on RTE, one parent run + 4 children, then the table.
sweep: install
	$(BIN)/deepen-run -m hydra/launcher=joblib hydra.launcher.n_jobs=2 seed=1,2,3,4 task=rte backbone=minilm \
		train.max_steps=100 train.learning_rate=5e-5 data.max_seq_length=128

UI_PORT ?= 5000
# Prints the runs table's URL once the server answers; Ctrl-C stops it. The store: $MLFLOW_TRACKING_URI
# where it is set (as deepen-run's tracking.uri), else the checkout's.
ui: install
	@mkdir -p outputs
	@$(BIN)/python -m deepen_run.tracking.ui "$${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/outputs/mlflow.db}" \
		$(CURDIR)/outputs/mlartifacts $(UI_PORT)

# ruff with the rules in pyproject.toml ([tool.ruff]): real mistakes (pyflakes, bugbear, ...), seconds.
lint: install
	$(BIN)/ruff check deepen_run tests scripts

# The CPU and its flags first (the recipe is not echoed: that line heads the output), then side-by-side
# with the Hugging Face Trainer, method overheads, length sweep, start-up cost, the machine's limit,
# train.compile (about 40 min on 2 AVX-512 BF16 cores: docs/performance.md); writes
# outputs/bench/bench.{json,md}. BENCH_ARGS=--quick for a smoke run, BENCH_ARGS="--only phases" for the
# whole process against the Trainer alone (sections: python scripts/bench.py --help).
bench: install
	@$(BIN)/python scripts/bench.py $(BENCH_ARGS)

# The floor study (docs/study.md, conf/study/floor_*.yaml): MiniLM on SST-2 and STS-B, seeds 1-5, every
# primary control, in parts of at most ~90 min on 2 idle cores (time in all: docs/results.md); the report in
# outputs/study-floor/all/. PART=pilot|base|hire|dup|multi runs one part (pilot first), PART=sched|gru a
# secondary one; a killed part continues when the same command runs again. STUDY_ARGS: e.g. --smoke.
study: install
	$(BIN)/python scripts/study.py $(if $(PART),--part $(PART)) $(STUDY_ARGS)

# Study III (docs/study.md, "Study III"; conf/study/s3_*.yaml): PALs x schedules on real size ratios,
# the PALs paper's other rows, HIRE against a capacity control matched to its parameter count, a
# confirmatory family of 5 under Holm; outputs/study-s3/. PART=pilot first, then
# multi_a|multi_b|multi_c|hire_a|hire_b|hire_c|explore. Each finished job is published under
# docs/results/s3/jobs/ (commit it): a later session runs only the rest. Cost: docs/study.md.
study-s3: install
	$(BIN)/python scripts/study.py --study s3 $(if $(PART),--part $(PART)) $(STUDY_ARGS)

# Study IV (docs/plans/s4.yaml, its plan, committed before its first job; conf/study/s4_*.yaml):
# PART=pilot first, then hire_a, hire_b, capacity, dup_a, dup_b, multi, sched_a, sched_b (each at most
# 90 min on 2 idle cores, resuming job by job; each job file records the plan's sha); PART=family
# runs nothing and reads the study by its plan (deepen-report --plan).
study-s4: install
	$(BIN)/python scripts/study.py --study s4 $(if $(PART),--part $(PART)) $(STUDY_ARGS)

# The older ablation presets (abl_*), one sweep each; the report covers exactly these sweeps.
study-ablations: install
	$(BIN)/python scripts/study.py --part ablations $(STUDY_ARGS)

# Run folders (logs, kept checkpoints) and the tokenization cache; the MLflow store
# (outputs/mlflow.db, outputs/mlartifacts) is kept: `make clean-all` removes it too, and the study's
# and bench's outputs. Only what deepen-run wrote goes: a folder holding anything else is kept and named.
# The standard library only: no install first (the venv's python if there is one).
CLEAN_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
clean:
	PYTHONPATH=. $(CLEAN_PY) -m deepen_run.run.clean outputs

clean-all:
	PYTHONPATH=. $(CLEAN_PY) -m deepen_run.run.clean outputs --store
