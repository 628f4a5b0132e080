"""One way to run an ONNX model in process: the embedder and the cross-encoder share it."""

import os
from pathlib import Path


def usable_threads() -> int:
    """CPUs this process may run on: affinity, not os.cpu_count() (containers pin fewer)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_session(model_file: Path, threads: int):
    """An onnxruntime session on the CPU: sequential, fully optimised, warnings off.

    ``threads`` is the intra-op pool; inter-op stays at 1 (the graphs are sequential).
    Raises whatever onnxruntime raises; callers turn it into their own error.
    """
    import onnxruntime as ort  # imported on first load: it is slow and BM25-only runs never need it

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])
