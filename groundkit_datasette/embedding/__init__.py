"""Turning text into vectors, for ingest and queries alike: the default int8 ONNX MiniLM,
the OpenAI-compatible HTTP embedder, and the ``register_embedders`` hook's registry.
May import: ``security`` (the outbound guard) and the shared modules.
"""
