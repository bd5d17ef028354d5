"""Sparsity regularisers on encoder-decoder attention (Zhang, Zhao, Li & Zong 2019, Sec. III) and attention statistics.

Zhang, Zhao, Li & Zong 2019 maximises sum_i [log p(y_i | y_<i, x) + lambda R(alpha_i)] (Eq. 12) with

* maximum L-inf (Eq. 14): R(alpha_i) = max_j alpha_ij, optimised with the weak subgradient of Eq. 16
  (all of the gradient goes to one arg-max entry k: dR/dalpha_ij = delta_kj);
* minimum entropy (Eq. 15): R(alpha_i) = -Ent(alpha_i) = sum_j alpha_ij log alpha_ij.

fairseq minimises, so the penalty this module reports is P = -R, added to the loss as
lambda * P: ``entropy`` adds lambda * Ent (lower entropy is better), ``linf`` adds -lambda * max
(a larger maximum is better). The linf penalty uses ``Tensor.max(dim)``, whose backward sends the
whole gradient to the one index it returns, i.e. exactly the weak subgradient of Eq. 16 (ties are
broken by taking one index of I(alpha_i); ``amax`` would instead split the gradient among ties).
0 log 0 is taken as 0, with a finite gradient (exact zeros come from masked keys and from sparse
normalisers such as sparsemax).

Normalisation. Eq. 12 adds lambda R per target position, next to that position's log-likelihood. The
penalty is therefore the mean over real target tokens (and over the regularised heads and layers) of
-R. The criterion adds every penalty as lambda * penalty * (number of real target tokens) = lambda * sum_i -R(alpha_i), Eq. 12's sum over target positions, whatever the averaging:
the paper's lambda (0.01) keeps its meaning next to the per-token cross-entropy, and ``--sentence-avg``
does not divide it by the mean target length. Padding is excluded on both sides:

* target (query) positions: from the decoder's ``prev_output_tokens`` (read by a forward pre-hook on
  the decoder): a query position is real iff its input token is not padding. fairseq builds
  ``prev_output_tokens`` from the target by moving EOS to the front, which keeps the padding where it
  is, so this is the target's padding for right- and left-padded targets alike;
* source (key) positions: the ``key_padding_mask`` the attention itself is called with. Weights on
  masked keys are 0 in fairseq anyway; they are zeroed here too, so the penalty provably ignores them.

Multi-head attention. Zhang, Zhao, Li & Zong 2019 has one (RNN) attention distribution per target position. Here every
head of every chosen layer computes such a distribution, so the default (``heads="each"``) applies R to
each head and averages over heads: each head may sharpen on its own source position. The alternative
(``heads="mean"``) regularises the head-averaged distribution, which no head computes; since entropy is
concave and max is convex, Ent(mean) >= mean Ent and max(mean) <= mean max, so it can only be lowered
by making the heads agree on the same positions, fighting the head specialisation papers 001/003 find
(positional, rare-word, syntactic heads). It is kept as an option because fairseq's alignments
(``--print-alignment``) are head averages. Layers (``layers``): ``"all"`` (default: each
encoder-decoder attention layer plays the role of the paper's single attention), ``"last"`` (the layer
fairseq uses for alignments) or a list of decoder layer indices; the penalty is averaged over them.

Statistics (always reported, train and valid): ``attn_entropy`` and ``attn_max``, the entropy and the
largest weight of each head's distribution, averaged over heads, chosen layers and real target tokens
(a ratio of sums over batches). They do not depend on ``heads``, so runs stay comparable; the value of
the penalty itself is logged by the criterion as ``attention_reg_penalty``.

Mechanics. :func:`attach_attention_regulariser` hooks the chosen encoder-decoder attention modules of
a fairseq encoder-decoder transformer (ours or stock ``transformer``, no special architecture needed)
and the decoder. The hooks do nothing unless the regulariser is inside :meth:`capture` (the criterion
wraps its forward pass in it), so generation, incremental decoding and other uses of the model are
untouched; they also skip incremental calls. Inside ``capture`` the attention pre-hook asks the module
for per-head weights (need_weights = need_head_weights = True) and the forward hook reads them (heads x
batch x tgt x src, fp32, before attention dropout) and hands the caller exactly what it asked for
(None, the head mean, or the per-head weights), so the decoder layer behaves identically. In eval mode
the regulariser reports statistics only (penalty None). An L0Drop decoder reads a compressed memory in
eval mode: one slot of :class:`~fairseq_sparse.modules.count_attention.CountAwareAttention` stands for
c = exp(log_count) pruned source states with weight p / c each; the statistics are computed over the
real source positions: Ent = -sum p log p + sum p log c, max = max p / c.
"""
import contextlib
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from .head_gates import attention_modules
from .sparsity import SparsityModule, SparsityTerm

#: regulariser kinds: none (statistics only), entropy (Zhang, Zhao, Li & Zong 2019 Eq. 15), linf (Eq. 14)
REG_KINDS = ("none", "entropy", "linf")
#: R per head, averaged over heads ("each") or R of the head-averaged distribution ("mean")
HEAD_MODES = ("each", "mean")
DEFAULT_LAYERS = "all"
DEFAULT_HEADS = "each"
#: the attribute under which the regulariser sits in the model (a parameter-free submodule)
ATTACHED_NAME = "attention_regulariser"
#: fairseq MultiheadAttention.forward's positional parameters, to read calls made positionally
_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "incremental_state", "need_weights", "static_kv",
             "attn_mask", "before_softmax", "need_head_weights")

LayerSpec = Union[str, Tuple[int, ...]]


def parse_layers(spec: str) -> LayerSpec:
    """``"all"``, ``"last"`` or comma-separated decoder layer indices (e.g. ``"0,2"``)."""
    spec = (spec or "").strip()
    if spec in ("all", "last"):
        return spec
    try:
        layers = tuple(sorted({int(x) for x in spec.split(",") if x.strip()}))
    except ValueError:
        layers = ()
    if not layers or min(layers) < 0:
        raise ValueError(f"--attention-reg-layers must be 'all', 'last' or comma-separated layer indices >= 0, "
                         f"got {spec!r}")
    return layers


def resolve_layers(spec: LayerSpec, available: Sequence[int]) -> List[int]:
    """The decoder layers (with encoder-decoder attention) that ``spec`` selects."""
    available = sorted(available)
    if spec == "all":
        return available
    if spec == "last":
        return available[-1:]
    missing = [i for i in spec if i not in available]
    if missing:
        raise ValueError(f"--attention-reg-layers: decoder layers {missing} have no encoder-decoder attention "
                         f"(layers with one: {available})")
    return list(spec)


def entropy(probs: Tensor, log_multiplicity: Optional[Tensor] = None) -> Tensor:
    """Ent(alpha) = -sum_j alpha_j log alpha_j over the last dimension, 0 log 0 = 0 (Zhang, Zhao, Li & Zong 2019 Eq. 15).

    log_multiplicity (broadcastable to probs): slot j stands for exp(m_j) real positions of weight
    alpha_j / exp(m_j) each, which adds sum_j alpha_j m_j.
    """
    log_p = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()  # finite at 0: 0 * log(tiny) = 0
    ent = -(probs * log_p).sum(-1)
    if log_multiplicity is not None:
        ent = ent + (probs * log_multiplicity).sum(-1)
    return ent


def max_weight(probs: Tensor, log_multiplicity: Optional[Tensor] = None) -> Tensor:
    """L-inf(alpha) = max_j alpha_j over the last dimension (Zhang, Zhao, Li & Zong 2019 Eq. 14). Its gradient is one-hot
    at the returned arg-max (the weak subgradient of Eq. 16)."""
    if log_multiplicity is not None:
        probs = probs * torch.exp(-log_multiplicity)
    return probs.max(dim=-1).values


def attention_penalty(probs: Tensor, kind: str, heads: str = DEFAULT_HEADS,
                      log_multiplicity: Optional[Tensor] = None) -> Tensor:
    """-R per query: probs heads x ... x src -> ... (averaged over heads, or of the head average)."""
    if kind not in REG_KINDS[1:]:
        raise ValueError(f"attention regulariser must be one of {REG_KINDS[1:]}, got {kind!r}")
    if heads not in HEAD_MODES:
        raise ValueError(f"--attention-reg-heads must be one of {HEAD_MODES}, got {heads!r}")
    if heads == "mean":
        probs = probs.mean(0, keepdim=True)
    per_head = entropy(probs, log_multiplicity) if kind == "entropy" else -max_weight(probs, log_multiplicity)
    return per_head.mean(0)


def layer_sums(probs: Tensor, query_mask: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
               log_multiplicity: Optional[Tensor] = None, kind: str = "none", heads: str = DEFAULT_HEADS,
               with_penalty: bool = True) -> Dict[str, Tensor]:
    """Sums over the real target tokens of one attention layer.

    probs: heads x batch x tgt x src; query_mask: batch x tgt (True = real target token);
    key_padding_mask: batch x src (True = padding); log_multiplicity: batch x src.
    Returns ``tokens`` (real target tokens), ``entropy`` and ``max`` (head-averaged, detached) and, when
    kind != "none" and with_penalty, ``penalty`` (sum of -R, with gradient).
    """
    H, B, T, S = probs.shape
    if key_padding_mask is not None:
        probs = probs.masked_fill(key_padding_mask.view(1, B, 1, S).to(torch.bool), 0.0)
    m = None if log_multiplicity is None else log_multiplicity.to(probs.dtype).view(1, B, 1, S)
    real = probs.new_ones(B, T) if query_mask is None else query_mask.to(probs.dtype)
    out = {"tokens": real.sum()}
    if kind != "none" and with_penalty:
        out["penalty"] = (attention_penalty(probs, kind, heads, m) * real).sum()
    with torch.no_grad():
        if kind == "entropy" and heads == "each" and "penalty" in out:
            out["entropy"] = out["penalty"].detach()
        else:
            out["entropy"] = (entropy(probs, m).mean(0) * real).sum()
        out["max"] = (max_weight(probs, m).mean(0) * real).sum()
    return out


def unwrap_model(model: nn.Module) -> nn.Module:
    """The fairseq model inside distributed wrappers (the trainer hands criterions the wrapped model)."""
    while "decoder" not in model._modules and isinstance(model._modules.get("module"), nn.Module):
        model = model._modules["module"]
    return model


def encoder_decoder_attention(model: nn.Module) -> Dict[int, MultiheadAttention]:
    """{decoder layer index: its encoder-decoder attention}; empty for models without one."""
    try:
        found = attention_modules(unwrap_model(model))
    except ValueError:
        return {}
    return {layer: mha for (kind, layer), mha in found.items() if kind == "encdec"}


class AttentionRegulariser(SparsityModule):
    """Zhang, Zhao, Li & Zong's (2019) attention regularisers on encoder-decoder attention, plus attention statistics.

    Args:
        kind: "none" (statistics only), "entropy" (minimum entropy, Eq. 15) or "linf" (maximum L-inf, Eq. 14)
        layers: "all", "last" or decoder layer indices (see the module docstring for the defaults)
        heads: "each" (R per head, averaged) or "mean" (R of the head-averaged distribution)

    Use :func:`attach_attention_regulariser`, then run the model inside :meth:`capture`; after it, the
    term is read by :func:`~fairseq_sparse.modules.sparsity.collect_sparsity_terms`.
    """

    penalty_group = "attention_reg"

    def __init__(self, kind: str = "none", layers: Union[str, LayerSpec] = DEFAULT_LAYERS,
                 heads: str = DEFAULT_HEADS):
        super().__init__()
        if kind not in REG_KINDS:
            raise ValueError(f"--attention-reg must be one of {REG_KINDS}, got {kind!r}")
        if heads not in HEAD_MODES:
            raise ValueError(f"--attention-reg-heads must be one of {HEAD_MODES}, got {heads!r}")
        self.kind, self.heads = kind, heads
        self.layers_spec = parse_layers(layers) if isinstance(layers, str) else parse_layers(
            ",".join(str(i) for i in layers))
        self.active = False
        self.layers: List[int] = []
        self._handles = []
        self._padding_idx: Optional[int] = None
        self._query_mask: Optional[Tensor] = None
        self._pending: Dict[MultiheadAttention, tuple] = {}
        self._sums: Dict[str, Tensor] = {}

    def extra_repr(self):
        return f"kind={self.kind}, heads={self.heads}, layers={self.layers}"

    # --- attaching -------------------------------------------------------------------------------
    def attach(self, model: nn.Module) -> "AttentionRegulariser":
        core = unwrap_model(model)
        encdec = encoder_decoder_attention(core)
        if not encdec:
            raise ValueError(f"{type(core).__name__} has no encoder-decoder attention to regularise")
        self.layers = resolve_layers(self.layers_spec, list(encdec))
        if self.kind != "none":
            wrapped = [i for i in self.layers if hasattr(core.decoder.layers[i], "precheckpoint_forward")]
            if wrapped:  # the checkpointed first forward runs without autograd: the penalty would get no gradient
                raise ValueError("--attention-reg entropy/linf does not work with --checkpoint-activations "
                                 f"(decoder layers {wrapped} are checkpointed)")
        for i in self.layers:
            self._handles.append(encdec[i].register_forward_pre_hook(self._before_attention, with_kwargs=True))
            self._handles.append(encdec[i].register_forward_hook(self._after_attention))
        self._handles.append(core.decoder.register_forward_pre_hook(self._read_target_padding, with_kwargs=True))
        self._padding_idx = getattr(core.decoder, "padding_idx", None)
        if self._padding_idx is None:
            self._padding_idx = core.decoder.dictionary.pad()
        core.add_module(ATTACHED_NAME, self)
        self.train(core.training)
        return self

    def detach(self, model: Optional[nn.Module] = None):
        """Remove the hooks (and, given the model, the submodule)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if model is not None and unwrap_model(model)._modules.get(ATTACHED_NAME) is self:
            del unwrap_model(model)._modules[ATTACHED_NAME]

    # --- one forward pass ------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self):
        """Hooks are live only inside this block; on a normal exit the pass's term is recorded."""
        self._sums, self._pending, self._query_mask = {}, {}, None
        self.active = True
        try:
            yield self
        except BaseException:
            self._sums = {}
            raise
        else:
            self._record()
        finally:
            self.active = False
            self._pending, self._query_mask = {}, None

    def _read_target_padding(self, decoder, args, kwargs):
        if not self.active:
            return None
        tokens = args[0] if args else kwargs.get("prev_output_tokens")
        incremental = kwargs.get("incremental_state") is not None
        self._query_mask = None if tokens is None or incremental else tokens.ne(self._padding_idx)
        return None

    def _before_attention(self, mha, args, kwargs):
        if not self.active:
            return None
        if len(args) > 3:  # positional call: name everything after query, key, value
            kwargs = dict(kwargs, **dict(zip(_MHA_ARGS[3:], args[3:])))
            args = args[:3]
        if kwargs.get("incremental_state") is not None or kwargs.get("before_softmax", False):
            return None
        need_head = bool(kwargs.get("need_head_weights", False))
        need = need_head or bool(kwargs.get("need_weights", True))
        self._pending[mha] = (need, need_head, kwargs.get("key_padding_mask"), getattr(mha, "log_count", None))
        kwargs["need_weights"] = kwargs["need_head_weights"] = True
        return args, kwargs

    def _after_attention(self, mha, args, output):
        pending = self._pending.pop(mha, None)
        if pending is None:
            return None
        need, need_head, key_padding_mask, log_count = pending
        attn, weights = output
        if weights is not None:
            self._add_layer(weights, key_padding_mask, log_count)
        if need_head or weights is None:
            return None  # what the caller asked for
        return attn, (weights.mean(dim=0) if need else None)

    def _add_layer(self, weights: Tensor, key_padding_mask: Optional[Tensor], log_count: Optional[Tensor]):
        H, B, T, S = weights.shape
        query_mask = self._query_mask
        if query_mask is not None and tuple(query_mask.shape) != (B, T):
            query_mask = None
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, S):
            key_padding_mask = None
        if log_count is not None and tuple(log_count.shape) != (B, S):
            log_count = None
        sums = layer_sums(weights, query_mask, key_padding_mask, log_count, self.kind, self.heads,
                          with_penalty=self.training)
        for name, value in sums.items():
            self._sums[name] = value if name not in self._sums else self._sums[name] + value

    def _record(self):
        sums, self._sums = self._sums, {}
        if not sums:
            return
        tokens = float(sums["tokens"])
        if tokens <= 0:
            return
        penalty = sums["penalty"] / tokens if "penalty" in sums else None
        self.record(SparsityTerm(self.penalty_group, penalty, {
            "attn_entropy": (float(sums["entropy"]), tokens),
            "attn_max": (float(sums["max"]), tokens),
        }))


def find_attention_regularisers(model: nn.Module) -> List[AttentionRegulariser]:
    return [m for m in model.modules() if isinstance(m, AttentionRegulariser)]


def attach_attention_regulariser(model: nn.Module, kind: str = "none", layers: Union[str, LayerSpec] = DEFAULT_LAYERS,
                                 heads: str = DEFAULT_HEADS) -> AttentionRegulariser:
    """Attach a regulariser to ``model`` (replacing one attached before) and return it."""
    regulariser = AttentionRegulariser(kind, layers, heads)
    core = unwrap_model(model)
    old = core._modules.get(ATTACHED_NAME)
    if isinstance(old, AttentionRegulariser):
        old.detach(core)
    return regulariser.attach(core)


@contextlib.contextmanager
def attention_capture(model: nn.Module):
    """Run the model's attention regularisers (if any) for the forward passes inside this block."""
    with contextlib.ExitStack() as stack:
        for regulariser in find_attention_regularisers(model):
            stack.enter_context(regulariser.capture())
        yield
