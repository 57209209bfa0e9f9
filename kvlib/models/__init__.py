"""The models room: where a model and a corpus come from (the embedded model, the zoo, files, directories, the hub)."""

from kvlib._lazy import lazy_exports, table_of

_EXPORTS = table_of(sources="ModelSource Source SOURCES register_source resolve_model load_model_and_tokenizer load_tokenizer_and_config model_display_name context_length LazyModel", zoo="ZOO ZooModel EMBEDDED fetch list_models", corpus="Corpus load_corpus tokenize")
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
