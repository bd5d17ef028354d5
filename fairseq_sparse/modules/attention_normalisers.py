"""Alternatives to softmax for the encoder-decoder attention: the baselines of Zhang, Zhao, Li & Zong 2019, Sec. IV.

Every normaliser maps the attention logits e_i (one row per query, masked keys = -inf) to weights
alpha_i on the probability simplex. Masked keys get exactly 0; a row whose keys are all masked gets
all-zero weights (never NaN).

* ``softmax``     alpha_ij = exp(e_ij) / sum_k exp(e_ik)                                (fairseq's own)
* ``temperature`` alpha_ij = exp(e_ij / T) / sum_k exp(e_ik / T)                        (Eq. 17)
* ``gumbel``      alpha_ij = exp((e_ij + g_j) / T) / sum_k exp((e_ik + g_k) / T),
                  g ~ Gumbel(0, 1) i.i.d.                                               (Eq. 18)
                  Eq. 18 writes log(e_ij) for the log-probabilities; log softmax(e) differs from e
                  by a per-row constant, which cancels. The noise is drawn in training only: in
                  evaluation (validation, generation) gumbel is plain softmax with temperature T.
* ``sparsemax``   alpha_i = argmin_{a in simplex} ||a - e_i / T||^2, i.e.
                  alpha_ij = max(0, e_ij / T - tau(e_i / T)) with sum_j alpha_ij = 1    (Eqs. 19-20)
* ``entmax15``    alpha_i = argmax_{a in simplex} a . (e_i / T) + H^T_1.5(a), i.e.
                  alpha_ij = max(0, e_ij / (2T) - tau)^2 with sum_j alpha_ij = 1        (Peters et al. 2019)

sparsemax and entmax-1.5 come from the ``entmax`` package. T (``--encdec-attention-temperature``,
default 1) divides the logits for every normaliser but ``softmax``.
"""
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import MultiheadAttention
from torch import Tensor

from .count_attention import CountAwareAttention
from .coverage_attention import DEFAULT_COVERAGE_DIM, CoverageAttention
from .options import fill_dataclass_defaults

NORMALISERS = ["softmax", "temperature", "gumbel", "sparsemax", "entmax15"]
#: normalisers that treat the c states behind L0Drop's counted dummy exactly as softmax(e + log c) does
COUNT_EXACT = ("softmax", "temperature", "gumbel")  # gumbel: pruned decoding is eval-only = temperature

#: finite stand-in for -inf inside sparsemax / entmax (which return NaN or fail on -inf); such
#: entries are far below the threshold tau and are set to exactly 0 afterwards anyway
_FINITE_NEG = -1e4


@dataclass
class AttentionNormaliserConfig(FairseqDataclass):
    encdec_attention_normaliser: ChoiceEnum(NORMALISERS) = field(
        default="softmax",
        metadata={"help": "how the encoder-decoder attention turns logits into weights (Zhang, Zhao, Li & Zong 2019 Sec. IV "
                          "baselines): softmax (fairseq's), temperature (softmax(e/T), Eq. 17), gumbel "
                          "(Gumbel-softmax with temperature T in training, Eq. 18; softmax(e/T) in evaluation), "
                          "sparsemax (Eqs. 19-20), entmax15 (entmax-1.5); sparsemax and entmax15 need "
                          "`pip install entmax`"},
    )
    encdec_attention_temperature: float = field(
        default=1.0,
        metadata={"help": "temperature T > 0 of the encoder-decoder attention normaliser: the logits are "
                          "divided by T (not used by softmax)"},
    )
    encdec_attention_coverage: bool = field(
        default=False,
        metadata={"help": "a coverage model on the encoder-decoder attention (Zhang, Zhao, Li & Zong 2019 Sec. V, "
                          "Eqs. 21-22, Tu et al. 2016's neural coverage): a GRU-updated coverage vector per source "
                          "position feeds every head's logits; combine with --attention-reg entropy for the paper's "
                          "NMT+Cov+Ent. Softmax attention only"},
    )
    encdec_coverage_dim: int = field(
        default=DEFAULT_COVERAGE_DIM,
        metadata={"help": "size of the coverage vector of each source position (Tu et al. 2016: 10)"},
    )


def attention_normaliser_defaults(args):
    """Fill in the options missing from args (older checkpoints, other architectures)."""
    fill_dataclass_defaults(args, AttentionNormaliserConfig)


def check_attention_normaliser_args(args):
    """Validate before anything is built."""
    name = getattr(args, "encdec_attention_normaliser", "softmax")
    temperature = float(getattr(args, "encdec_attention_temperature", 1.0))
    if name not in NORMALISERS:
        raise ValueError(f"--encdec-attention-normaliser must be one of {NORMALISERS}, got {name!r}")
    if not temperature > 0 or temperature == float("inf"):
        raise ValueError(f"--encdec-attention-temperature must be a finite number > 0, got {temperature}")
    if name == "softmax" and temperature != 1.0:
        raise ValueError(f"--encdec-attention-temperature {temperature} has no effect with "
                         "--encdec-attention-normaliser softmax; use --encdec-attention-normaliser temperature")
    if getattr(args, "encdec_attention_coverage", False):
        if name != "softmax":
            raise ValueError(f"--encdec-attention-coverage works with softmax attention only, not "
                             f"--encdec-attention-normaliser {name}")
        dim = getattr(args, "encdec_coverage_dim", DEFAULT_COVERAGE_DIM)
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"--encdec-coverage-dim must be an integer >= 1, got {dim!r}")
    if name in ("sparsemax", "entmax15"):
        _entmax()  # fail at build time when the package is missing


def _entmax():
    try:
        import entmax
    except ImportError as e:  # pragma: no cover - entmax is in requirements.txt
        raise ImportError("sparsemax / entmax15 attention needs the `entmax` package: pip install entmax") from e
    return entmax


def _masked_rows(logits: Tensor, dim: int):
    """(masked entries, rows with every entry masked)."""
    masked = torch.isneginf(logits)
    empty = masked.all(dim=dim, keepdim=True)
    return masked, empty


def _finish(weights: Tensor, masked: Tensor, empty: Tensor) -> Tensor:
    return weights.masked_fill(masked | empty, 0.0)


def softmax_t(logits: Tensor, temperature: float = 1.0, dim: int = -1) -> Tensor:
    """Eq. 17: softmax(e / T); masked (-inf) entries get 0, an all-masked row all 0."""
    masked, empty = _masked_rows(logits, dim)
    x = logits.float() / temperature
    if bool(empty.any()):
        x = x.masked_fill(empty, 0.0)
    return _finish(F.softmax(x, dim=dim), masked, empty)


def gumbel_noise(like: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """g ~ Gumbel(0, 1) i.i.d., float32, of the shape of ``like``."""
    u = torch.rand(like.shape, generator=generator, dtype=torch.float32, device=like.device)
    return -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))


def gumbel_softmax(logits: Tensor, temperature: float = 1.0, dim: int = -1, training: bool = True,
                   generator: Optional[torch.Generator] = None) -> Tensor:
    """Eq. 18: softmax((e + g) / T), g ~ Gumbel(0, 1); without noise (softmax(e / T)) unless training."""
    if not training:
        return softmax_t(logits, temperature, dim)
    return softmax_t(logits.float() + gumbel_noise(logits, generator), temperature, dim)  # -inf + g stays -inf


def _sparse(fn, logits: Tensor, temperature: float, dim: int) -> Tensor:
    masked, empty = _masked_rows(logits, dim)
    x = logits.float() / temperature
    # shift each row so that its largest real logit is 0, then put masked entries far below it
    row_max = x.masked_fill(masked, float("-inf")).amax(dim=dim, keepdim=True).masked_fill(empty, 0.0)
    x = (x - row_max).masked_fill(masked, _FINITE_NEG)
    return _finish(fn(x, dim=dim), masked, empty)


def sparsemax(logits: Tensor, temperature: float = 1.0, dim: int = -1) -> Tensor:
    """Eqs. 19-20: the Euclidean projection of e / T onto the simplex, max(0, e_j / T - tau)."""
    return _sparse(_entmax().sparsemax, logits, temperature, dim)


def entmax15(logits: Tensor, temperature: float = 1.0, dim: int = -1) -> Tensor:
    """entmax-1.5 of e / T: max(0, e_j / (2T) - tau)^2, sum 1 (Peters, Niculae & Martins 2019)."""
    return _sparse(_entmax().entmax15, logits, temperature, dim)


def normalise(name: str, logits: Tensor, temperature: float = 1.0, dim: int = -1, training: bool = False) -> Tensor:
    """Attention weights (float32) from logits with any of :data:`NORMALISERS`."""
    if name == "softmax":
        return softmax_t(logits, 1.0, dim)
    if name == "temperature":
        return softmax_t(logits, temperature, dim)
    if name == "gumbel":
        return gumbel_softmax(logits, temperature, dim, training=training)
    if name == "sparsemax":
        return sparsemax(logits, temperature, dim)
    if name == "entmax15":
        return entmax15(logits, temperature, dim)
    raise ValueError(f"unknown attention normaliser {name!r}; choose from {NORMALISERS}")


class NormalisedAttention(CountAwareAttention):
    """Encoder-decoder attention with a normaliser other than softmax (see the module docstring).

    A :class:`CountAwareAttention`, so it also reads L0Drop's compressed memory (``log_count``; None
    with a stock encoder). The logits are divided by T *before* the log counts are added, so
    softmax(e / T + log c) -- exact pruned decoding -- holds for ``temperature`` (and ``gumbel`` in
    evaluation). sparsemax / entmax15 are not exact with a counted dummy (c states != one state with
    logit + log c); the models refuse that combination at build time.
    """

    #: as CountAwareAttention's: the fixed-shape search leaves its state (the sentence's memory) in place
    fixed_shape_sentence_memory = True

    def __init__(self, *args, normaliser: str = "temperature", temperature: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        if normaliser not in NORMALISERS:
            raise ValueError(f"unknown attention normaliser {normaliser!r}; choose from {NORMALISERS}")
        if not temperature > 0:
            raise ValueError(f"attention temperature must be > 0, got {temperature}")
        self.normaliser = normaliser
        self.temperature = float(temperature)

    def extra_repr(self):
        return f"normaliser={self.normaliser}, temperature={self.temperature}"

    def apply_sparse_mask(self, attn_weights: Tensor, tgt_len: int, src_len: int, bsz: int):
        if self.normaliser != "softmax" and self.temperature != 1.0:
            attn_weights = attn_weights / self.temperature  # e / T, then + log c (count-aware)
        return super().apply_sparse_mask(attn_weights, tgt_len, src_len, bsz)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        if self.normaliser == "softmax" or before_softmax:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=need_weights,
                                   static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
                                   need_head_weights=need_head_weights)
        tgt_len, bsz, _ = query.size()
        # static_kv=True: the slow path (PyTorch's fast path ignores before_softmax); the keys of an
        # encoder-decoder attention are static anyway, and fairseq's decoder layer passes it too
        logits, v = super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                    incremental_state=incremental_state, need_weights=False,
                                    static_kv=True, attn_mask=attn_mask, before_softmax=True)
        # logits are already divided by T (apply_sparse_mask), so normalise with T = 1; Gumbel noise is
        # divided by T too: softmax((e + g) / T + log c), Eq. 18
        if self.normaliser == "gumbel" and self.training:
            logits = logits.float() + gumbel_noise(logits) / self.temperature
        weights = normalise(self.normaliser, logits, 1.0, dim=-1, training=False)
        return self.attend(weights, v, tgt_len, bsz, need_weights, need_head_weights)


def build_encdec_attention(embed_dim: int, cfg, q_noise: float = 0.0, qn_block_size: int = 8,
                           softmax_cls=MultiheadAttention):
    """The encoder-decoder attention of a decoder layer (``build_encoder_attention``): ``softmax_cls``
    (unchanged) for ``softmax``, :class:`CoverageAttention` with ``--encdec-attention-coverage``, else
    :class:`NormalisedAttention`. Options are read from ``cfg``
    (fairseq's TransformerConfig keeps the plugin's flat options as attributes)."""
    name = getattr(cfg, "encdec_attention_normaliser", None) or "softmax"
    temperature = getattr(cfg, "encdec_attention_temperature", None)
    temperature = 1.0 if temperature is None else float(temperature)
    kwargs = dict(
        kdim=cfg.encoder.embed_dim,
        vdim=cfg.encoder.embed_dim,
        dropout=cfg.attention_dropout,
        encoder_decoder_attention=True,
        q_noise=q_noise,
        qn_block_size=qn_block_size,
    )
    if getattr(cfg, "encdec_attention_coverage", False):
        return CoverageAttention(embed_dim, cfg.decoder.attention_heads, coverage_dim=int(cfg.encdec_coverage_dim),
                                 **kwargs)
    if name == "softmax":
        return softmax_cls(embed_dim, cfg.decoder.attention_heads, **kwargs)
    return NormalisedAttention(embed_dim, cfg.decoder.attention_heads, normaliser=name, temperature=temperature,
                               **kwargs)
