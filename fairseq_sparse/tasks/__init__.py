from . import translation_shared_memory, translation_source_tags  # noqa: F401
