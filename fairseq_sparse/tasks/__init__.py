from . import translation_fixed_shape, translation_shared_memory, translation_source_tags  # noqa: F401
