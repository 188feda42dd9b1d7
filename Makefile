# deepen-run: every target sets up the virtualenv first if it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
GLUE    ?= $(abspath ../shared/glue)
export DEEPEN_GLUE_DIR ?= $(GLUE)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: install test demo sweep ui bench lint clean

$(BIN)/deepen-run: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned first: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/deepen-run

test: install
	$(BIN)/pytest -q

demo: install
	$(BIN)/deepen-run task=sst2 backbone=minilm data.max_train_samples=4000 train.max_steps=150 \
		train.learning_rate=5e-5 data.max_seq_length=64

ui: install
	@echo "MLflow UI: http://127.0.0.1:5000/#/experiments (runs table: add ?workflowType=machine_learning)"
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/outputs/mlflow.db --host 127.0.0.1 --port 5000

clean:
	rm -rf outputs/runs outputs/multiruns outputs/cache
