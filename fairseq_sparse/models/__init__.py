from . import transformer_head_gates, transformer_l0drop, transformer_simplified_decoder  # noqa: F401
