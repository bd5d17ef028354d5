from . import adam_sparsity, continued  # noqa: F401  (registers --optimizer adam_sparsity, --lr-scheduler inverse_sqrt_continued)
