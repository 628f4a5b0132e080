"""One way to run an ONNX model in process: the embedder and the cross-encoder share it."""

import mmap
import os
from pathlib import Path


def usable_threads() -> int:
    """CPUs this process may run on: affinity, not os.cpu_count() (containers pin fewer)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_session(model_file: Path, threads: int, *, prepack: bool = True, int8_matmul: bool = False,
                signed: bool | None = None):
    """An onnxruntime session on the CPU (see :func:`pending_session`, which does the work)."""
    return pending_session(model_file, threads, prepack=prepack, int8_matmul=int8_matmul, signed=signed)()


def pending_session(model_file: Path, threads: int, *, prepack: bool = True, int8_matmul: bool = False,
                    signed: bool | None = None):
    """An onnxruntime session on the CPU: sequential, fully optimised, warnings off.

    ``threads`` is the intra-op pool; inter-op stays at 1 (the graphs are sequential).
    A weight-only int8 export (int8 weights dequantised by ``Cast`` and ``Mul``) is
    dequantised here in numpy and handed over from memory (``onnx_graph``, adr/0037):
    the same weights, bit for bit, without onnxruntime's constant folding, which cost
    most of a fresh process's model load. ``prepack=False`` skips packing the matrix
    weights at creation (cheaper to create, the same results; each run packs instead):
    for a process that embeds one query. ``int8_matmul`` runs the int8 matrices in integers
    (``onnx_graph.prepare``, adr/0040) and raises ValueError for a model it cannot rewrite so,
    rather than fall back to float vectors; ``signed`` hands their weights over as int8 rather
    than uint8 (None: where :func:`signed_kernel_exact` says that sums exactly, adr/0042).
    Raises whatever onnxruntime raises; callers turn it into their own error.

    Returns a function that builds the session. This call does what holds the GIL: it
    imports onnxruntime, maps the file and rewrites the graph (``onnx_graph.prepare``: many
    small numpy steps, each taking the GIL back). The returned function only builds the
    session, onnxruntime's own work, which releases the GIL (measured, adr/0037). A fresh
    process calls this on its main thread and the returned function in the model thread, so
    the session is built while the main thread imports the rest of the search; rewriting the
    graph in the model thread instead took three to four times as long, waiting for the GIL
    between its steps (adr/0041).
    """
    ort = onnxruntime()  # imported on first load: it is slow and BM25-only runs never need it
    options = _options(ort, threads)
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if int8_matmul and signed is None:
        signed = signed_kernel_exact(ort)
    return _prepared(ort, model_file, options, ["CPUExecutionProvider"], int8_matmul, bool(signed))


def onnxruntime():
    """The onnxruntime module, imported with its telemetry off (issue 37).

    Importing onnxruntime (1.32 here) starts its telemetry provider, which writes a device id
    to ``~/.cache/Microsoft/DeveloperTools/.onnxruntime/`` (``deviceid``, ``onnxruntime.db``).
    Its ``ORT_DISABLE_TELEMETRY`` environment variable, read when the library loads, turns
    the provider off before it writes anything; ``disable_telemetry_events()`` alone comes too
    late (the import has written the file). A value the user set is left as it is."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime as ort

    if os.environ["ORT_DISABLE_TELEMETRY"] not in ("0", ""):
        ort.disable_telemetry_events()
    return ort


def _options(ort, threads: int):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return options


_signed_exact: bool | None = None


def signed_kernel_exact(ort) -> bool:
    """Whether onnxruntime's uint8 x int8 integer kernel sums exactly on this CPU: its answer
    to ``onnx_graph.signed_probe`` (a few milliseconds, once per process). With VNNI it does;
    on AVX2 without it, pairs of products saturate (adr/0040)."""
    global _signed_exact
    if _signed_exact is None:
        import numpy as np

        from .onnx_graph import signed_probe

        model, ones, exact = signed_probe()
        try:  # with the options the model's sessions use, so the same kernel answers
            session = ort.InferenceSession(model, sess_options=_options(ort, 1),
                                           providers=["CPUExecutionProvider"])
            (out,) = session.run(None, {"a": ones})
            _signed_exact = bool(np.all(np.abs(out - exact) <= exact * 1e-6))
        except Exception:  # an onnxruntime without the op or the kernel: the uint8 form
            _signed_exact = False
    return _signed_exact


def _prepared(ort, model_file: Path, options, providers: list, int8_matmul: bool = False,
              signed: bool = False):
    """:func:`pending_session`'s graph mapped and rewritten now; its session built by the
    function returned."""
    from .onnx_graph import prepare

    with open(model_file, "rb") as f:
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # an empty or unmappable file: let onnxruntime say why
            mapped = None
    prepared = (prepare(memoryview(mapped), int8_matmul=int8_matmul, signed=signed)
                if mapped is not None else None)
    if prepared is None and int8_matmul:
        raise ValueError("this model has no int8 matrices to multiply in integers")
    if prepared is None:
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # a view is still referenced somewhere: the collector closes it
                pass
        return lambda: ort.InferenceSession(str(model_file), sess_options=options, providers=providers)
    names = list(prepared.initializers)
    values = [ort.OrtValue.ortvalue_from_numpy(prepared.initializers[n]) for n in names]
    options.add_external_initializers(names, values)

    def build():
        session = ort.InferenceSession(prepared.model, sess_options=options, providers=providers)
        # The session reads these buffers (some are views of the mapped file): keep them alive.
        session._groundkit_buffers = (mapped, prepared.initializers, values)
        return session
    return build
