from . import translation_source_tags  # noqa: F401
