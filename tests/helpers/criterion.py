"""label_smoothed_cross_entropy_with_sparsity built in-process, as fairseq builds it: from its config and the task."""
from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import (
    LabelSmoothedCrossEntropyWithSparsity,
    LabelSmoothedCrossEntropyWithSparsityConfig,
)

#: the trainer's options the config reads from fairseq's other groups (``II(...)``), as a run that sets none has them
RUN_DEFAULTS = dict(optimizer=None, bf16=False, save_interval_updates=0, no_epoch_checkpoints=False, max_update=0)


def sparsity_criterion(task, sentence_avg, label_smoothing, **options):
    """The criterion for TASK (None: no task), every option at its default but OPTIONS (the config's field names;
    an unknown one is a TypeError)."""
    cfg = LabelSmoothedCrossEntropyWithSparsityConfig(
        **{**RUN_DEFAULTS, "sentence_avg": sentence_avg, "label_smoothing": label_smoothing, **options})
    return LabelSmoothedCrossEntropyWithSparsity(cfg, task)
