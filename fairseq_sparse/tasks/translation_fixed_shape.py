"""The task ``translation_fixed_shape``: fairseq's translation task decoded by the fixed-shape beam search
(``fairseq_sparse/fixed_shape_search.py``: rows never removed, finished hypotheses in preallocated tensors, stopping
checked every few steps), for any model fairseq-generate decodes, stock ``transformer`` checkpoints and every
architecture of this plugin alike:

    fairseq-generate DATA --user-dir fairseq_sparse --task translation_fixed_shape --path CKPT --beam 5 ...

Everything else is fairseq's translation task (options, data, dictionaries; fairseq-interactive and the hub
interface too). Generation options the search does not implement are refused in one line before any decoding.
"""
from dataclasses import dataclass, field

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..fixed_shape_search import UNSUPPORTED, FixedShapeSequenceGenerator

NAME = "translation_fixed_shape"


@dataclass
class TranslationFixedShapeConfig(TranslationConfig):
    fixed_shape_stop_every: int = field(
        default=4, metadata={"help": "steps between two checks of whether every sentence is finished (the search "
                                     "reads the device only then; the result does not depend on it)"})


def refused_options(args):
    """The generation options the fixed-shape search cannot honour, as fairseq-generate's flags."""
    checks = {"--sampling": getattr(args, "sampling", False),
              "--diverse-beam-groups": (getattr(args, "diverse_beam_groups", -1) or -1) > 0,
              "--diversity-rate": (getattr(args, "diversity_rate", -1) or -1) > 0,
              "--match-source-len": getattr(args, "match_source_len", False),
              "--prefix-size": (getattr(args, "prefix_size", 0) or 0) > 0,
              "--constraints": bool(getattr(args, "constraints", None)),
              "--lm-path": bool(getattr(args, "lm_path", None)),
              "--print-alignment": bool(getattr(args, "print_alignment", None))}
    return [flag for flag, on in checks.items() if on]


@register_task(NAME, dataclass=TranslationFixedShapeConfig)
class TranslationFixedShapeTask(TranslationTask):
    """fairseq's translation task with the fixed-shape beam search (module docstring)."""

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        refused = refused_options(args)
        if refused or prefix_allowed_tokens_fn is not None:
            raise SystemExit(f"error: --task {NAME} decodes with the fixed-shape beam search, which does not support "
                             f"{', '.join(refused) or 'prefix_allowed_tokens_fn'} ({UNSUPPORTED}): use --task "
                             "translation for it")
        kwargs = dict(extra_gen_cls_kwargs or {}, stop_every=self.cfg.fixed_shape_stop_every)
        return super().build_generator(models, args, seq_gen_cls=FixedShapeSequenceGenerator,
                                       extra_gen_cls_kwargs=kwargs)
