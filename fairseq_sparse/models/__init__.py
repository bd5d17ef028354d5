from . import transformer_head_gates, transformer_l0drop  # noqa: F401
