# Every target installs what it needs first: on a fresh machine `make demo` and `make test` are enough.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU wheel when no GPU is present, so no multi-GB CUDA build is pulled in.
TORCH_CPU := torch==2.13.0

.PHONY: setup test test-fast demo lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "GPU found: installing the default (CUDA) torch build"; $(PY) -m pip install -q "torch>=2.2"; \
	else \
		echo "no GPU: installing the CPU torch wheel $(TORCH_CPU)"; $(PY) -m pip install -q "$(TORCH_CPU)"; \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# pytest exits 5 when it collected nothing: that is a failure too, never a green run
# two workers: the packaging tests beside all the others, which keep their order (tests/conftest.py: pytest_xdist_make_scheduler)
test: setup
	@$(VENV)/bin/pytest -q -n 2 --dist loadscope; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

# the unit tier: no Ray cluster, no S3 server, no subprocess jobs (tests/conftest.py and the markers)
test-fast: setup
	$(VENV)/bin/pytest -q -m "not cluster and not s3 and not subprocess and not slow and not cuda"

demo: setup
	$(VENV)/bin/elmo pipeline

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	$(PY) benchmarks/bilm_forward.py --quick
	$(PY) benchmarks/shard.py
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/checkpoint_stall.py
	$(PY) benchmarks/shard_boundaries.py
	$(PY) benchmarks/embed.py

clean:
	rm -rf $(VENV) runs .pytest_cache
