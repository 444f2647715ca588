"""inference-ledger core: canonical JSON, signing, records, storage.

This package imports no web framework, CLI framework or HTTP client; the API (`api/`),
the collectors (`collectors/`) and the CLI (`cli/`) are built on top of it.
"""

__version__ = "0.1.0"
