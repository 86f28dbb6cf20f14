# objtrain: two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
# The CPU build of torch; GPU users override, e.g. `make install TORCH='torch --index-url ...'`.
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench findings findings-all clean

install: $(STAMP)

# Re-runs only when the package definition changes, so a second `make install` is instant.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The main job on the embedded default corpus (the Python standard library's own source): tokenize, look at
# what the objectives make of it, compare FIM with CLM (progress lines even when piped, then the cost table,
# the few metrics that answer the question, the verdict) and end on what the comparison found, in one
# sentence. (A 1M-parameter model's infill of a gap, which the demo used to end on, shows nothing yet:
# `objtrain generate runs/demo/compare/arms/fim-0.5 --prefix ... --suffix ...` tries it.) Timed by
# benchmarks/bench_demo.py.
DEMO_DIR ?= runs/demo
demo: $(STAMP)
	$(BIN)/objtrain tokenize --corpus stdlib --vocab-size 4096 -o $(DEMO_DIR)/store --force
	$(BIN)/objtrain pack $(DEMO_DIR)/store --seq-len 256 --mode bestfit -o $(DEMO_DIR)/packed --force
	$(BIN)/objtrain corrupt $(DEMO_DIR)/packed --objective span --n 1
	$(BIN)/objtrain corrupt data/sample.py --tokenizer $(DEMO_DIR)/store --objective mlm --seq-len 64 --n 1
	$(BIN)/objtrain corrupt data/sample.py --tokenizer $(DEMO_DIR)/store --objective fim fim_rate=1.0 --seq-len 64 --n 1
	$(BIN)/objtrain corrupt $(DEMO_DIR)/packed --objective ul2 --stats --n 128
	$(BIN)/objtrain compare fim-vs-clm --data $(DEMO_DIR)/store -o $(DEMO_DIR)/compare --force

test: $(STAMP)
	$(BIN)/ruff check objtrain tests benchmarks scripts
	$(BIN)/python -m pytest -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check objtrain tests benchmarks scripts
	$(BIN)/ruff format --check objtrain tests benchmarks scripts

# The published findings (docs/findings): builds the prose store from ../shared/data, then runs each
# shipped experiment with three seeds (resumable: run it again to continue) and rewrites every report and
# docs/findings/README.md from the results. FINDINGS_JOBS experiments at once, each on its share of the
# cores (tiny models use a second thread poorly, so two one-thread lanes train faster on 2 cores); each
# one's output goes to runs/findings/logs/. `findings` runs the comparisons across model kinds, heads and
# sizes (about 6 hours on 2 CPU cores); `findings-all` adds the questions about one objective (about 11).
FINDINGS_JOBS ?= 2
findings: $(STAMP)
	$(BIN)/python benchmarks/findings_data.py runs/findings/data
	$(BIN)/python -m scripts.findings run --jobs $(FINDINGS_JOBS)

findings-all: $(STAMP)
	$(BIN)/python benchmarks/findings_data.py runs/findings/data
	$(BIN)/python -m scripts.findings run --all --jobs $(FINDINGS_JOBS)

# Benchmarks measure against peers (Hugging Face transformers) in the same run.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
