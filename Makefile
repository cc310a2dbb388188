# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Everything else here is what those two need; each target installs what it uses.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NODE_STAMP := workers/node_modules/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-installed-stamp

.PHONY: demo test lint typecheck unit compat deps node-deps bench soak clean dist

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(NODE_STAMP): workers/package.json workers/package-lock.json
	npm ci --prefix workers --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

deps: $(STAMP)
node-deps: $(NODE_STAMP)

## demo: validate, show, build, plan (offline) and diff the example policy, replay a generated
## day of traffic through it (and the diff's impact on that day), then run the fleet
## demonstration (four app instances behind a round-robin front, one shared Redis)
demo: $(STAMP)
	@echo "== edgegen validate examples/policy.yaml"
	@$(BIN)/edgegen validate examples/policy.yaml
	@echo
	@echo "== edgegen show examples/policy.yaml"
	@$(BIN)/edgegen show examples/policy.yaml
	@echo
	@echo "== edgegen build examples/policy.yaml --out out/edge --explain"
	@$(BIN)/edgegen build examples/policy.yaml --out out/edge --explain
	@echo
	@echo "== edgegen plan examples/policy.yaml --state examples/zone-state.json  (offline, against a pulled zone)"
	@$(BIN)/edgegen plan examples/policy.yaml --state examples/zone-state.json
	@echo
	@echo "== edgegen diff examples/policy-previous.yaml examples/policy.yaml  (what a PR comment shows)"
	@$(BIN)/edgegen diff examples/policy-previous.yaml examples/policy.yaml | sed -n '1,/^Generated artifacts/p;/^Generated artifacts/,/^$$/p' | uniq
	@echo
	@echo "== edgegen replay examples/policy.yaml --traffic out/traffic-day.ndjson.gz  (a generated day, 2 req/s)"
	@$(BIN)/python -m bench.traffic --seconds 86400 --rate 2 --format ndjson --out out/traffic-day.ndjson.gz >/dev/null
	@$(BIN)/edgegen replay examples/policy.yaml --traffic out/traffic-day.ndjson.gz --chart out/replay.svg | sed '/^Timeline/,/^$$/d'
	@echo "(the timeline is drawn in out/replay.svg)"
	@echo
	@echo "== edgegen diff examples/policy-previous.yaml examples/policy.yaml --traffic out/traffic-day.ndjson.gz  (its impact section)"
	@$(BIN)/edgegen diff examples/policy-previous.yaml examples/policy.yaml --traffic out/traffic-day.ndjson.gz | sed -n '/^Impact on recorded traffic/,$$p'
	@echo; $(BIN)/python examples/fleet_demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) $(NODE_STAMP)
	npm test --prefix workers --silent
	$(BIN)/python -m pytest

## compat: the contract suite on the oldest supported redis-py (pyproject's app extra), without
## hiredis; the rest of the suite runs on the newest release with it
REDIS_OLDEST := 8.0.0
OLDEST_DIR := $(VENV)/redis-$(REDIS_OLDEST)
COMPAT_PATH := tests/compat/no_hiredis:$(OLDEST_DIR)
compat: $(STAMP)
	test -d $(OLDEST_DIR) || $(BIN)/python -m pip install --quiet --no-deps --target $(OLDEST_DIR) redis==$(REDIS_OLDEST)
	PYTHONPATH=$(COMPAT_PATH) $(BIN)/python -c "import redis, redis.utils; assert redis.__version__ == '$(REDIS_OLDEST)' and not redis.utils.HIREDIS_AVAILABLE, redis.__version__"
	PYTHONPATH=$(COMPAT_PATH) $(BIN)/python -m pytest -q -p no:cacheprovider tests/applimit/test_applimit_contract.py tests/applimit/test_applimit_faults.py tests/applimit/test_applimit_batching.py

## test: install into .venv (and workers/node_modules), then ruff, mypy --strict, pytest (and
## the contract suite on the oldest supported redis-py)
test: lint typecheck unit compat

## bench: every benchmark but http, about eight minutes; results in bench/results/, report in
## docs/benchmarks.md (make bench BENCH_ARGS="--only sync,async" for a selection)
## (the HTTP benchmark is run only when named: make bench BENCH_ARGS="--only http"; it needs wrk)
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

## soak: mixed traffic through applimit for SOAK_SECONDS (default 120) against reference
## models, with Redis memory, key expiry and connection counts checked
SOAK_SECONDS ?= 120
soak: $(STAMP)
	$(BIN)/python -m bench.soak --seconds $(SOAK_SECONDS)

## dist: the wheel in dist/, to install elsewhere or upload to an internal index (see README)
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist

clean:
	rm -rf $(VENV) workers/node_modules .mypy_cache .ruff_cache .pytest_cache .hypothesis dist
