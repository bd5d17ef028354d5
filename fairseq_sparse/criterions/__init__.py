from . import label_smoothed_cross_entropy_with_sparsity  # noqa: F401
