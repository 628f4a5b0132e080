"""One way to run an ONNX model in process: the embedder and the cross-encoder share it."""

from pathlib import Path


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
