from .hard_concrete import HardConcrete  # noqa: F401
from .l0drop import L0Drop, compress, expand_attention  # noqa: F401
from .sparsity import SparsityModule, SparsityTerm, collect_sparsity_terms  # noqa: F401
