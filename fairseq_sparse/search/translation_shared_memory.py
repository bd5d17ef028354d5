"""The task ``translation_shared_memory``: fairseq's translation task whose models decode with one encoder memory per
sentence instead of one copy per hypothesis, for stock fairseq ``transformer`` checkpoints:

    fairseq-generate DATA --user-dir fairseq_sparse --task translation_shared_memory --path CKPT --beam 5 ...

Everything else is fairseq's translation task (same options, data and dictionaries; fairseq-interactive too). Each
model is switched over when it is built (``search/shared_memory.py``; weights and checkpoint unchanged) and gives
the same hypotheses and scores as ``--task translation``. A model that is not fairseq's own transformer is refused
with one line and exit status 1 when it is loaded, before any decoding.
"""
import logging
from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from .shared_memory import share_encoder_memory

logger = logging.getLogger(__name__)

NAME = "translation_shared_memory"


@dataclass
class TranslationSharedMemoryConfig(TranslationConfig):
    pass


@register_task(NAME, dataclass=TranslationSharedMemoryConfig)
class TranslationSharedMemoryTask(TranslationTask):
    """fairseq's translation task; its models keep one encoder memory per sentence in beam search (module docstring)."""

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        try:
            share_encoder_memory(model)
        except ValueError as e:  # one line, exit status 1, as an argument error: nothing is decoded yet
            raise SystemExit(f"error: --task {NAME} cannot share the encoder memory: {e}") from None
        layers = sum(layer.encoder_attn is not None for layer in model.decoder.layers)
        logger.info("%s: one encoder memory per sentence in beam search (%d encoder-decoder attention layers)",
                    NAME, layers)
        return model
