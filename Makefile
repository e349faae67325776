# The two commands a newcomer needs: `make train` and `make test`.
# Both create the virtual environment (.venv) on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(abspath $(VENV))/bin/python
STAMP  := $(VENV)/.installed
MASTER ?= local[2]
# Executors and the driver must run the venv's Python (it has TensorFlow).
SPARK_ENV := PYSPARK_PYTHON=$(PY) PYSPARK_DRIVER_PYTHON=$(PY)

# Documentation site (mkdocs.yml): built into site/ without network; served on 127.0.0.1:8000.
DOCS_PORT ?= 8000

.PHONY: env check-java docs docs-serve train test test-fast bench bench-network clean dist dist-env cluster-up cluster-down hosts-up hosts-down

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "ERROR: pyspark 4 needs Java 17 or newer, and 'java' is not on PATH."; \
	  echo "Install it (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless;"; \
	  echo "macOS: brew install openjdk@17) or set JAVA_HOME and PATH."; exit 1; }
	@major=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$major" ] || [ "$$major" -lt 17 ]; then \
	  echo "ERROR: pyspark 4 needs Java 17 or newer; found: $$(java -version 2>&1 | head -1)."; \
	  echo "Install openjdk-17 and point JAVA_HOME at it."; exit 1; fi

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

env: check-java $(STAMP)

## Train a small CNN on scikit-learn's bundled digits with spark-submit on local[2].
train: env
	$(SPARK_ENV) $(VENV)/bin/spark-submit --master "$(MASTER)" \
	  --driver-java-options "-Dlog4j2.configurationFile=file:$(abspath conf/log4j2.properties)" \
	  --conf spark.ui.showConsoleProgress=false --conf spark.log.level=WARN \
	  jobs/train_digits.py --output-dir output/digits --overwrite

## The documentation site into site/ (--strict: a broken link or reference fails), offline.
docs: env
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

## Serve the documentation site on http://127.0.0.1:$(DOCS_PORT), rebuilt on every change.
docs-serve: env
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

# The suite's workers (pytest-xdist): half of a serial run's wall time is waiting on cluster setups and
# spark-submits, so two workers share 2 cores; tests/conftest.py's scheduler keeps what cannot run side by side
# on one worker.
TEST_WORKERS ?= 2
PYTEST := $(SPARK_ENV) $(VENV)/bin/python -m pytest -n $(TEST_WORKERS)

## The whole test suite (slow cluster tests included), as CI runs it.
test: env
	$(PYTEST) tests

## The unit tier: every test that starts no Spark, spark-submit, cluster, notebook, site build, browser or other
## Python (tests/conftest.py's integration mark), in about 2 minutes.
test-fast: env
	$(PYTEST) tests -m "not integration"

## Benchmark suite of docs/benchmarks/ (~85 min on 2 cores): the trainer against plain Keras,
## Elephas (installed into its own benchmarks/.venv-elephas on first use) and the ideal; per-round
## overhead vs model size, k, workers and depth; the scaling projection of docs/benchmarks/scaling.md; plots.
## Every script runs through benchmarks/harness.py: README's session settings (RECOMMENDED_CONF) unless
## an arm measures another setting, and one results format in benchmarks/results/<name>.json.
bench: env
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/suite.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/overhead.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/overhead.py --sweeps aggregation --out benchmarks/results/aggregation.json
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/connect_overhead.py --repeats 3 --rounds 16
	$(PY) benchmarks/driver_scaling.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/unix_sockets.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/advisor_check.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/straggler.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/cold_start.py
	$(SPARK_ENV) $(VENV)/bin/python benchmarks/compressed_training.py
	$(PY) benchmarks/scaling.py
	$(PY) benchmarks/plots.py

## What executors without sparkdl_avg need: dist/sparkdl_avg-<version>.zip (--py-files) and the wheel.
dist: env
	$(PY) scripts/build_dist.py zip wheel

## A venv-pack archive with the wheel and all dependencies (with TensorFlow: ~1.3 GB) for --archives ...#environment.
dist-env: env
	$(PY) scripts/build_dist.py env

## A Spark standalone master and two 1-core workers on 127.0.0.1 (logs and pids in output/cluster).
cluster-up: env
	PYTHON=$(PY) scripts/cluster.sh up

cluster-down:
	PYTHON=$(PY) scripts/cluster.sh down

## Hosts that share only a network (as root): HOSTS network+mount namespaces on 1 Gbit/s links (RATE),
## a standalone master and the driver on host 0, a worker per other host, an S3 store (scripts/hosts.py).
HOSTS ?= 4
RATE  ?= 1gbit
hosts-up: env
	$(PY) scripts/hosts.py up --hosts $(HOSTS) --rate $(RATE)

hosts-down:
	$(PYTHON) scripts/hosts.py down

## Aggregation paths on the shaped-network cluster (docs/benchmarks/network.md, ~30 min, root),
## then update_compression there (~14 min); the driver's session has README's settings (benchmarks/harness.py),
## results in benchmarks/results/network.json and network_compression.json.
bench-network: env
	$(PY) benchmarks/network.py
	$(PY) benchmarks/network.py --workers 8 --params 3e6 --paths "sql driver" "sql shuffle" auto \
		--compressions none int8 bf16 --out benchmarks/results/network_compression.json

clean:
	rm -rf output build dist site *.egg-info .pytest_cache
