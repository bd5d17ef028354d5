"""The decoding side: the fixed-shape beam search, its parts and the tasks that decode with them."""
from . import translation_fixed_shape, translation_shared_memory  # noqa: F401  (registers the tasks)
