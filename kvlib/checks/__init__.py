"""The checks room: decoding checks beyond perplexity (pass-key retrieval, generation agreement) and
the RULER-style long-context suite (``kvlib.checks.ruler``)."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(retrieval="RetrievalConfig RetrievalResult run_retrieval", agreement="AgreementConfig AgreementResult run_agreement", decoding="DecodingChecks run_decoding_checks")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
