"""Which of the plugin's import-time changes to fairseq and torch are made. All of them by default; the environment
variable FAIRSEQ_SPARSE_PATCHES=none makes none, or a comma list names those to make:

- ``last_batch``: fairseq's ``batch_by_size`` keeps the last batch it drops (last_batch.py);
- ``ngram_block``: ``--no-repeat-ngram-size`` blocks repeats on the CPU as fairseq's CUDA kernel does (ngram_block.py);
- ``safe_globals``: torch's safe loader may read fairseq checkpoints everywhere (safe_globals.py; the plugin's
  own reads, checkpoint_safety.py, allow them either way).
"""
import os

NAMES = ("last_batch", "ngram_block", "safe_globals")


def enabled(name: str) -> bool:
    """Whether the change NAME is made (FAIRSEQ_SPARSE_PATCHES); an unknown name is an error, not a silent no."""
    value = os.environ.get("FAIRSEQ_SPARSE_PATCHES", "all").strip()
    if value == "all":
        return True
    chosen = {v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"}
    unknown = sorted(chosen - set(NAMES))
    if unknown:
        raise ValueError(f"FAIRSEQ_SPARSE_PATCHES={value}: unknown {', '.join(unknown)} (all, none, or a comma list "
                         f"of {', '.join(NAMES)})")
    return name in chosen
