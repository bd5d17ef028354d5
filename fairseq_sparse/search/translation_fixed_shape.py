"""The task ``translation_fixed_shape``: fairseq's translation task decoded by the fixed-shape beam search
(``fairseq_sparse/search/fixed_shape_search.py``: rows never removed, finished hypotheses in preallocated tensors, stopping
checked every few steps), for any model fairseq-generate decodes, stock ``transformer`` checkpoints and every
architecture of this plugin alike:

    fairseq-generate DATA --user-dir fairseq_sparse --task translation_fixed_shape --path CKPT --beam 5 ...

Everything else is fairseq's translation task (options, data, dictionaries; fairseq-interactive too). The hub
interface keeps the task its checkpoint names: :func:`use_fixed_shape_search` switches a loaded one over. Generation
options the search does not implement are refused in one line before any decoding.
"""
from dataclasses import dataclass, field, fields

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq.dataclass import ChoiceEnum

from .fixed_shape_search import BEAM_REORDERS, STEP_FORMS, UNSUPPORTED, FixedShapeSequenceGenerator

NAME = "translation_fixed_shape"


@dataclass
class TranslationFixedShapeConfig(TranslationConfig):
    fixed_shape_stop_every: int = field(
        default=4, metadata={"help": "steps between two checks of whether every sentence is finished (the search "
                                     "reads the device only then; the result does not depend on it)"})
    fixed_shape_step_form: ChoiceEnum(STEP_FORMS) = field(
        default="auto", metadata={"help": "auto: steps of fixed shape captured in CUDA graphs on a GPU where the "
                                          "model allows it, fairseq's own search otherwise (on the CPU too: faster "
                                          "without a graph); prefix: the fixed-shape search's eager steps over the "
                                          "growing prefix; fixed: steps of fixed shape (captured on a GPU), refused "
                                          "for a model that cannot have them"})
    fixed_shape_max_graphs: int = field(
        default=4, metadata={"help": "CUDA graphs kept, one per batch shape (least recently used dropped); 0: none "
                                     "(auto then runs fairseq's search, fixed its steps eagerly)"})
    fixed_shape_beam_reorder: ChoiceEnum(BEAM_REORDERS) = field(
        default="copy", metadata={"help": "steps of fixed shape: copy the self-attention keys and values to the "
                                          "beams' new order at every step, as fairseq does (copy), or leave them "
                                          "where they were written and read them through an ancestry table "
                                          "(indirect: no copies, beam times the attention products)"})
    fixed_shape_source_bucket: int = field(
        default=16, metadata={"help": "where steps are captured in CUDA graphs, sources are padded (masked) to a "
                                      "multiple of this many tokens, so that batches of nearby lengths share a graph; "
                                      "1: no padding"})


def refused_options(args):
    """The generation options the fixed-shape search cannot honour, as fairseq-generate's flags."""
    checks = {"--sampling": getattr(args, "sampling", False),
              "--diverse-beam-groups": (getattr(args, "diverse_beam_groups", -1) or -1) > 0,
              "--diversity-rate": (getattr(args, "diversity_rate", -1) or -1) > 0,
              "--match-source-len": getattr(args, "match_source_len", False),
              "--prefix-size": (getattr(args, "prefix_size", 0) or 0) > 0,
              "--constraints": bool(getattr(args, "constraints", None)),
              "--lm-path": bool(getattr(args, "lm_path", None)),
              "--print-alignment": bool(getattr(args, "print_alignment", None)),
              # dropout left on in decoding: a captured step would replay one dropout mask
              "--retain-dropout": bool(getattr(args, "retain_dropout", False))}
    return [flag for flag, on in checks.items() if on]


@register_task(NAME, dataclass=TranslationFixedShapeConfig)
class TranslationFixedShapeTask(TranslationTask):
    """fairseq's translation task with the fixed-shape beam search (module docstring). A refused setting ends a console
    tool in one line (SystemExit); in a library (``use_fixed_shape_search``: ``library = True``) it is a ValueError the
    caller can catch."""

    library = False

    def refuse(self, message: str):
        if self.library:
            raise ValueError(message)
        raise SystemExit(f"error: {message}")

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        refused = refused_options(args)
        if refused or prefix_allowed_tokens_fn is not None:
            self.refuse(f"--task {NAME} decodes with the fixed-shape beam search, which does not support "
                        f"{', '.join(refused) or 'prefix_allowed_tokens_fn'} ({UNSUPPORTED}): use --task translation "
                        "for it")
        cfg = self.cfg
        kwargs = dict(extra_gen_cls_kwargs or {}, stop_every=cfg.fixed_shape_stop_every,
                      step_form=cfg.fixed_shape_step_form, max_graphs=cfg.fixed_shape_max_graphs,
                      source_bucket=cfg.fixed_shape_source_bucket, beam_reorder=cfg.fixed_shape_beam_reorder)
        try:  # the generator checks its settings: one line, before anything is decoded
            return super().build_generator(models, args, seq_gen_cls=FixedShapeSequenceGenerator,
                                           extra_gen_cls_kwargs=kwargs)
        except ValueError as e:
            self.refuse(f"--task {NAME}: {e}")


def use_fixed_shape_search(hub, **options):
    """fairseq's hub interface (``from_pretrained``) decoding with the fixed-shape search: its task becomes this task
    over the same settings and dictionaries; ``options``: this task's own (``fixed_shape_stop_every``,
    ``fixed_shape_step_form``, ``fixed_shape_max_graphs``, ``fixed_shape_source_bucket``,
    ``fixed_shape_beam_reorder``). Returns the hub."""
    from omegaconf import OmegaConf

    own = {f.name for f in fields(TranslationFixedShapeConfig)}
    unknown = sorted(set(options) - own)
    if unknown:
        raise ValueError(f"unknown option(s) of --task {NAME}: {', '.join(unknown)}")
    task = hub.task
    settings = {k: v for k, v in OmegaConf.to_container(OmegaConf.create(task.cfg)).items() if k in own}
    hub.task = TranslationFixedShapeTask(TranslationFixedShapeConfig(**{**settings, **options}), task.src_dict,
                                         task.tgt_dict)
    hub.task.library = True  # a refused setting raises ValueError: the calling program goes on
    return hub
