"""Turning text into vectors, for ingest and queries alike: the default int8 ONNX MiniLM,
the OpenAI-compatible HTTP embedder, and the ``register_embedders`` hook's registry.
May import: ``security`` (the outbound guard) and the shared modules.
"""

# The embedder used when neither the user nor the collection names one (``plugins`` re-exports
# it): here, so that naming it imports nothing else.
DEFAULT_EMBEDDER = "minilm"
