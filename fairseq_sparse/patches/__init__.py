"""The plugin's repairs to fairseq and torch, made at import; FAIRSEQ_SPARSE_PATCHES chooses them (switch.py)."""
from .switch import NAMES, enabled  # noqa: F401
