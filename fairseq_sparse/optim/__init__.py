from . import adam_sparsity  # noqa: F401  (registers --optimizer adam_sparsity)
