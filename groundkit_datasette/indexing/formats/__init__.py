"""One module per file format family, each an extractor registered through the
``register_extractors`` hook (``builtin.py``), as a third-party plugin registers its own:
``base`` is the contract with the dispatcher (``indexing/extract.py``), ``text`` the fixed
decoding rule the text formats share, ``packages`` what the zip formats share (adr/0057)."""
