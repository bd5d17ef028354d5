from . import transformer_l0drop  # noqa: F401
