# The two commands a newcomer types: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint types docs docs-check bytecode unit optimized bench bench-compare clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,postgres,http,demo,web,langgraph,pydantic-ai,mcp]'
	touch $(STAMP)

demo: $(STAMP) bytecode
	$(BIN)/tether demo --crash-at effect_sent

lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard bench) examples docs/_hooks
	$(BIN)/ruff format --check src tests $(wildcard bench) examples docs/_hooks

types: $(STAMP)
	$(BIN)/mypy -p tether -p examples

# The docs site (mkdocs.yml, docs/): `make docs` serves it on 127.0.0.1:8000 and
# rebuilds on every edit; `make docs-check` builds it with --strict (a broken link,
# a page left out of the nav or a stale API name fails). The pages' code blocks
# run in `make unit` (tests/docs).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-check: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

# --durations: each pass ends with its slowest tests, where CI's time goes.
# TEST_JOBS processes share the suite (pytest-xdist); each test file stays whole in
# one of them (--dist loadfile), so a file's module fixtures and its order are those
# of a serial run. TEST_JOBS=0 runs it in this process alone.
TEST_JOBS ?= 2
XDIST := $(if $(filter 0,$(TEST_JOBS)),-p no:xdist,-n $(TEST_JOBS) --dist loadfile)

# Every process the tests start (the children the crash tests kill, each `tether`
# command) imports tether. Where PYTHONDONTWRITEBYTECODE is set (this machine sets
# it) nothing is cached and every such process compiled tether's source again: about
# 0.3 s of each child's 0.7 s start, most of the suite's time. Compiled here once,
# for both passes (-o 1 is the -O pass's); a file edited later is compiled as usual.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 -o 0 -o 1 src examples tests

unit: $(STAMP) bytecode
	$(BIN)/python -m pytest -q $(XDIST) --durations=15

# The runtime may not depend on `assert`: the whole suite runs again with -O.
# Every test runs; the crash matrices run each cell once instead of up to 20 times
# (the first pass already ran 20 per point), and the simulator and the damaged-store
# fuzz run a smaller corpus, which keeps CI's two passes under 45 minutes on this
# machine. PYTHONOPTIMIZE=1 is -O for every interpreter the pass starts: the xdist
# workers and the children the crash tests kill.
optimized: $(STAMP) bytecode
	PYTHONOPTIMIZE=1 TETHER_CRASH_TRIALS=1 $(BIN)/python -O -m pytest -q -p no:cacheprovider $(XDIST) --durations=15

test: lint types docs-check unit optimized

bench: $(STAMP)
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/workers.py
	$(BIN)/python bench/effects.py
	$(BIN)/python bench/workspace.py

# tether side by side with LangGraph and DBOS (bench/compare.py). The peers are
# installed here only, never by `make test`; the run writes bench/compare.md,
# bench/compare.json and the compare-marked table of docs/explanation/benchmarks.md.
PEERS := langgraph-checkpoint-sqlite langgraph-checkpoint-postgres dbos

bench-compare: $(STAMP)
	$(BIN)/pip install --quiet $(PEERS)
	$(BIN)/python bench/compare.py $(COMPARE_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache site
