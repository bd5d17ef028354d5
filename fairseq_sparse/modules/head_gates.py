"""Per-head gates, masks and physical head pruning for fairseq's MultiheadAttention.

Papers: Voita et al. 2019 (001, Sec. 6: MultiHead(Q, K, V) = Concat_i(g_i * head_i) W^O, one
input-independent HardConcrete gate g_i per head, L_C = sum_i (1 - P(g_i = 0))) and Michel et al. 2019
(003, Eq. 1: MHAtt = sum_h xi_h Att_h with mask variables xi_h).

Both multiply a head's output by a scalar before the output projection. fairseq's attention calls
``out_proj`` as a module on the concatenated heads only on its slow path, so
:func:`enable_head_scaling` switches the fast path off (``skip_embed_dim_check``, which changes nothing
else) and adds a forward pre-hook on ``out_proj`` that scales each head's slice by

    gate (a :class:`HeadGates` in ``mha.head_gates``) x mask (a tensor in ``mha.head_mask``).

This works on any fairseq attention module, so the tools run on stock ``transformer`` checkpoints too.
:func:`prune_heads` removes heads physically (q/k/v rows and out_proj columns), folding gate and mask
values into ``out_proj``; a layer left with no head outputs the constant ``out_proj.bias``.
"""
import json
import math
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from .hard_concrete import HardConcrete
from .sparsity import SparsityCount, SparsityModule, SparsityTerm

#: encoder self-attention, decoder self-attention, decoder-encoder attention (Voita et al. 2019 Table 2's order)
ATTENTION_TYPES = ("enc", "dec", "encdec")
HeadKey = Tuple[str, int]  # (attention type, layer index)


class HeadGates(SparsityModule):
    """One input-independent HardConcrete gate per head (Voita et al. 2019 Sec. 6.1).

    In training the gates are resampled at every forward pass, i.e. once per batch (Voita et al. 2019,
    footnote 3); in eval they are the deterministic g_hat. The penalty is
    ``penalty_scale * sum_h P(g_h != 0)`` (Voita et al.'s (2019) L_C for this layer; ``penalty_scale`` = 1 sums
    over layers as the paper does, 1 / number of gated layers averages as Voita's code does).

    Args:
        num_heads: heads of the attention layer
        hard_concrete: the gate distribution
        attention_type: "enc", "dec" or "encdec" (names the logged statistics)
        layers_of_type: gated layers of this attention type (so the logged head counts add up to totals)
        init_log_alpha: initial log alpha of every head (3.0: g_hat = 1, the converged model unchanged)
    """

    penalty_group = "head_gates"

    def __init__(self, num_heads: int, hard_concrete: HardConcrete, attention_type: str, layers_of_type: int = 1,
                 penalty_scale: float = 1.0, init_log_alpha: float = 3.0):
        super().__init__()
        if attention_type not in ATTENTION_TYPES:
            raise ValueError(f"attention type must be one of {ATTENTION_TYPES}, got {attention_type!r}")
        self.hard_concrete = hard_concrete
        self.log_alpha = nn.Parameter(torch.full((num_heads,), float(init_log_alpha)))
        self.attention_type = attention_type
        self.layers_of_type = layers_of_type
        self.penalty_scale = penalty_scale

    def extra_repr(self):
        return f"heads={self.log_alpha.numel()}, type={self.attention_type}"

    def expected_open(self) -> Tensor:
        """P(g_h != 0) per head; its sum is this layer's L_C (Voita et al. 2019 Eq. 6)."""
        return self.hard_concrete.prob_open(self.log_alpha)

    def deterministic(self) -> Tensor:
        """The test-time gate g_hat per head."""
        return self.hard_concrete.deterministic(self.log_alpha)

    def forward(self) -> Tensor:
        """Gate values for this forward pass; records the penalty and the open-head counts."""
        g_hat = self.deterministic()
        expected = self.expected_open()
        gates = self.hard_concrete.sample(self.log_alpha) if self.training else g_hat
        penalty = self.penalty_scale * expected.sum() if self.training else None
        den = 1.0 / self.layers_of_type  # the counts of one batch add up over the layers of this type
        t = self.attention_type
        # statistics stay tensors: no host synchronisation at every decoding step
        n = float(expected.numel())
        closed = SparsityCount(n - expected.sum(), (g_hat.detach() == 0).sum(), n)
        self.record(SparsityTerm(self.penalty_group, penalty, {
            f"heads_open_expected_{t}": (expected.detach().sum(), den),
            f"heads_open_{t}": ((g_hat.detach() > 0).sum(), den),
            f"{self.penalty_group}_sparsity": (closed.closed, n),  # share of gated heads closed (g_hat = 0)
            f"{self.penalty_group}_{t}_sparsity": (closed.closed, n),
        }, sparsity={self.penalty_group: closed, f"{self.penalty_group}_{t}": closed}))
        return gates


class HeadlessAttention(MultiheadAttention):
    """An attention layer whose heads were all pruned: Concat() W^O + b = b for every position."""

    #: no incremental state: the fixed-shape search (search/fixed_shape_search.py) has nothing of it to reorder
    fixed_shape_sentence_state = True

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        bias = self.out_proj.bias
        if bias is None:
            out = query.new_zeros(query.size(0), query.size(1), self.out_proj.out_features)
        else:
            out = bias.to(query.dtype).expand(query.size(0), query.size(1), -1)
        return out, None


def attention_modules(model: nn.Module) -> "OrderedDict[HeadKey, MultiheadAttention]":
    """Every attention layer of a fairseq encoder-decoder transformer, keyed (type, layer)."""
    found = OrderedDict()
    encoder, decoder = getattr(model, "encoder", None), getattr(model, "decoder", None)
    for i, layer in enumerate(getattr(encoder, "layers", None) or []):
        found[("enc", i)] = layer.self_attn
    for i, layer in enumerate(getattr(decoder, "layers", None) or []):
        if getattr(layer, "self_attn", None) is not None:  # None: a decoder without TEM (Yang et al.'s (2020) sem-ifm)
            found[("dec", i)] = layer.self_attn
    for i, layer in enumerate(getattr(decoder, "layers", None) or []):
        if getattr(layer, "encoder_attn", None) is not None:
            found[("encdec", i)] = layer.encoder_attn
    if not found:
        raise ValueError(f"{type(model).__name__} has no fairseq transformer attention layers")
    return found


def head_ids(mha: MultiheadAttention) -> List[int]:
    """Original indices of the heads the layer still has (after physical pruning, a subset)."""
    ids = getattr(mha, "head_ids", None)
    return list(range(mha.num_heads)) if ids is None else list(ids)


def head_scale(mha: MultiheadAttention) -> Optional[Tensor]:
    """gate x mask per head, or None when the layer has neither."""
    scale = None
    gates = getattr(mha, "head_gates", None)
    if gates is not None:
        scale = gates()
    mask = getattr(mha, "head_mask", None)
    if mask is not None:
        scale = mask if scale is None else scale * mask
    return scale


def _scale_heads(out_proj, args):
    mha = out_proj.__dict__["_head_owner"]
    scale = head_scale(mha)
    if scale is None:
        return None
    (x,) = args
    if scale.numel() != mha.num_heads:
        raise ValueError(f"head gates/mask have {scale.numel()} values for {mha.num_heads} heads")
    shape = x.shape
    x = x.reshape(*shape[:-1], mha.num_heads, mha.head_dim) * scale.to(x.dtype).unsqueeze(-1)
    return (x.reshape(shape),)


def enable_head_scaling(mha: MultiheadAttention):
    """Make ``mha`` multiply head h's output by gate_h x mask_h before out_proj (idempotent)."""
    if "_head_owner" in mha.out_proj.__dict__:
        return
    mha.skip_embed_dim_check = True  # slow path: the only one that calls out_proj as a module
    # a plain (unregistered) back-reference: not a submodule, not in the state dict, and deepcopy /
    # pickle keep it pointing at the copied attention module
    mha.out_proj.__dict__["_head_owner"] = mha
    mha.out_proj.register_forward_pre_hook(_scale_heads)


def add_head_gates(model: nn.Module, types: Sequence[str], hard_concrete: HardConcrete,
                   penalty: str = "sum", init_log_alpha: float = 3.0) -> List[HeadKey]:
    """Put a :class:`HeadGates` on every attention layer of the given types; returns their keys."""
    modules = attention_modules(model)
    for t in types:
        if t not in ATTENTION_TYPES:
            raise ValueError(f"unknown attention type {t!r} for head gates; choose from {','.join(ATTENTION_TYPES)}")
        if not any(k[0] == t for k in modules):
            raise ValueError(f"head gates on '{t}' requested but the model has no {t} attention layers")
    keys = [k for k in modules if k[0] in types and not isinstance(modules[k], HeadlessAttention)]
    if penalty not in ("sum", "layer_mean"):
        raise ValueError(f"head gate penalty must be 'sum' or 'layer_mean', got {penalty!r}")
    scale = 1.0 if penalty == "sum" else 1.0 / max(1, len(keys))
    for key in keys:
        mha = modules[key]
        n_of_type = sum(1 for k in keys if k[0] == key[0])
        mha.head_gates = HeadGates(mha.num_heads, hard_concrete, key[0], n_of_type, scale, init_log_alpha)
        enable_head_scaling(mha)
    return keys


def set_head_masks(model: nn.Module, masks: Optional[Dict[HeadKey, Tensor]]):
    """Set xi_h (Michel et al. 2019 Eq. 1) on the given layers and clear it everywhere else; None clears all."""
    modules = attention_modules(model)
    masks = masks or {}
    for key in masks:
        if key not in modules:
            raise ValueError(f"head mask for {key} but the model has no such attention layer")
    for key, mha in modules.items():
        mask = masks.get(key)
        if mask is not None:
            if mask.dim() != 1 or mask.numel() != mha.num_heads:
                raise ValueError(f"head mask for {key[0]} layer {key[1]} has shape {tuple(mask.shape)}, "
                                 f"the layer has {mha.num_heads} heads")
            enable_head_scaling(mha)
            mha.head_mask = mask
        elif getattr(mha, "head_mask", None) is not None:
            mha.head_mask = None


# ------------------------------------------------------------------------------------------------
# the head mask format: {"enc": [[1, 0, 1, 1], ...], "dec": ..., "encdec": ...}, one row per layer of
# the type, one value xi_h in [0, 1] per current head (Michel et al. 2019, Eq. 1); omitted types are all
# ones. The one reader / validator / writer of the prune-heads and importance tools and the benchmark.


def head_layout(model: nn.Module) -> "OrderedDict[HeadKey, int]":
    """Current number of heads of every attention layer, keyed (type, layer), in model order."""
    return OrderedDict((k, 0 if isinstance(m, HeadlessAttention) else int(m.num_heads))
                       for k, m in attention_modules(model).items())


def _mask_rows(matrix) -> Dict[str, List[Tensor]]:
    """{type: [mask of layer 0, ...]} of a head mask JSON object; ValueError on anything malformed:
    not an object, an unknown type, rows that are not lists, values that are not numbers in [0, 1]."""
    if not isinstance(matrix, dict):
        raise ValueError("head mask must be a JSON object {\"enc\": [[...], ...], \"dec\": ..., \"encdec\": ...}, "
                         f"not {type(matrix).__name__}")
    out = {}
    for t, rows in matrix.items():
        if t not in ATTENTION_TYPES:
            raise ValueError(f"unknown attention type {t!r} in head mask; choose from {', '.join(ATTENTION_TYPES)}")
        if not isinstance(rows, list):
            raise ValueError(f"head mask for '{t}' must be a list of rows (one per layer), not {rows!r}")
        out[t] = []
        for layer, row in enumerate(rows):
            if not isinstance(row, list):
                raise ValueError(f"head mask for {t} layer {layer} must be a list of values (one per head), not {row!r}")
            for v in row:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 <= v <= 1):
                    raise ValueError(f"head mask for {t} layer {layer} has the value {v!r}: "
                                     f"every value must be a number in [0, 1]")
            out[t].append(torch.tensor([float(v) for v in row]))
    return out


def check_head_mask(matrix, layout: Dict[HeadKey, int]) -> "OrderedDict[HeadKey, Tensor]":
    """Validate a head mask JSON object against a model's layout ({(type, layer): heads}, see
    :func:`head_layout`); returns {(type, layer): mask} for every layer (omitted types: all ones).

    Raises ValueError naming the type and layer on a malformed object, an unknown type, a value that is
    not a finite number in [0, 1], or a wrong number of layers or heads.
    """
    masks = OrderedDict((k, torch.ones(n)) for k, n in layout.items())
    for t, rows in _mask_rows(matrix).items():
        keys = [k for k in layout if k[0] == t]
        if len(rows) != len(keys):
            raise ValueError(f"head mask for '{t}' has {len(rows)} rows, the model has {len(keys)} {t} layers")
        for key, mask in zip(keys, rows):
            if mask.numel() != layout[key]:
                raise ValueError(f"wrong shape: head mask for {t} layer {key[1]} has {mask.numel()} values, "
                                 f"the layer has {layout[key]} heads")
            masks[key] = mask
    return masks


def read_head_mask(path: str) -> dict:
    """The head mask JSON object in ``path``, checked for everything but the model's shapes (that is
    :func:`check_head_mask`); ValueError naming the file otherwise."""
    if not os.path.isfile(path):
        raise ValueError(f"head mask {path}: no such file")
    try:
        with open(path) as f:
            matrix = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"head mask {path} is not valid JSON: {e}") from None
    try:
        _mask_rows(matrix)
    except ValueError as e:
        raise ValueError(f"head mask {path}: {e}") from None
    return matrix


def write_head_mask(path: str, matrix: dict) -> str:
    """Write a head mask JSON object to ``path`` (one line; atomically: a temporary file, then renamed)."""
    _mask_rows(matrix)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(matrix) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def masks_from_matrix(model: nn.Module, matrix) -> "OrderedDict[HeadKey, Tensor]":
    """A head mask JSON object -> {(type, layer): mask} for ``model`` (:func:`check_head_mask`)."""
    return check_head_mask(matrix, head_layout(model))


def masks_to_matrix(masks: Dict[HeadKey, Tensor], layout: Dict[HeadKey, int]) -> Dict[str, List[List[float]]]:
    """{(type, layer): mask} -> the head mask JSON object (all layers of ``layout`` listed; 0 and 1 as ints)."""
    matrix: Dict[str, List[List[float]]] = {}
    for key, n in layout.items():
        m = masks.get(key)
        row = [1.0] * n if m is None else [float(v) for v in m.detach().cpu().tolist()]
        matrix.setdefault(key[0], []).append([int(v) if v in (0.0, 1.0) else v for v in row])
    return matrix


def gate_values(model: nn.Module) -> Dict[HeadKey, Tensor]:
    """g_hat x mask of every layer (ones for layers without gates or masks), in current head order."""
    values = {}
    for key, mha in attention_modules(model).items():
        v = torch.ones(mha.num_heads)
        gates = getattr(mha, "head_gates", None)
        if gates is not None:
            v = v * gates.deterministic().detach().cpu()
        mask = getattr(mha, "head_mask", None)
        if mask is not None:
            v = v * mask.detach().float().cpu()
        values[key] = v
    return values


def _select_heads(mha: MultiheadAttention, keep: List[int]):
    """Keep the heads at positions ``keep`` (current numbering): q/k/v rows and out_proj columns."""
    hd = mha.head_dim
    rows = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in keep]) if keep else torch.zeros(0, dtype=torch.long)
    with torch.no_grad():
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
            proj.weight = nn.Parameter(proj.weight.index_select(0, rows).clone())
            if proj.bias is not None:
                proj.bias = nn.Parameter(proj.bias.index_select(0, rows).clone())
            proj.out_features = rows.numel()
        mha.out_proj.weight = nn.Parameter(mha.out_proj.weight.index_select(1, rows).clone())
        mha.out_proj.in_features = rows.numel()
        if mha.bias_k is not None:
            mha.bias_k = nn.Parameter(mha.bias_k.index_select(2, rows).clone())
            mha.bias_v = nn.Parameter(mha.bias_v.index_select(2, rows).clone())
    ids = head_ids(mha)
    mha.head_ids = [ids[h] for h in keep]
    mha.num_heads = len(keep)
    mha.embed_dim = hd * len(keep)  # the width of the concatenated heads; queries keep their size
    mha.skip_embed_dim_check = True
    if not keep:
        mha.__class__ = HeadlessAttention  # same parameters, forward returns out_proj.bias


def kept_heads_spec(model: nn.Module) -> Dict[str, List[List[int]]]:
    """{"enc": [[original ids kept in layer 0], ...], "dec": ..., "encdec": ...}."""
    spec: Dict[str, List[List[int]]] = {}
    for (t, _), mha in attention_modules(model).items():
        spec.setdefault(t, []).append([] if isinstance(mha, HeadlessAttention) else head_ids(mha))
    return spec


def apply_kept_heads(model: nn.Module, spec) -> None:
    """Give a freshly built model the shapes of a physically pruned one (before its state dict loads).

    ``spec``: the JSON string or dict of :func:`kept_heads_spec`; head ids are original indices.
    """
    if not spec:
        return
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"--kept-heads is not valid JSON: {e}") from None
    modules = attention_modules(model)
    for t, layers in spec.items():
        n_layers = sum(1 for k in modules if k[0] == t)
        if t not in ATTENTION_TYPES or len(layers) != n_layers:
            raise ValueError(f"--kept-heads: '{t}' lists {len(layers)} layers, the model has {n_layers} {t} layers")
        for i, ids in enumerate(layers):
            mha = modules[(t, i)]
            bad = [h for h in ids if not 0 <= h < mha.num_heads]
            if bad or len(set(ids)) != len(ids):
                raise ValueError(f"--kept-heads: {t} layer {i} lists heads {ids}; the layer has {mha.num_heads}")
            _select_heads(mha, sorted(ids))


def prune_heads(model: nn.Module, keep: Dict[HeadKey, Sequence[int]], allow_empty_layers: bool = True):
    """Physically remove heads (Michel et al. 2019 Sec. 4.2's "actually pruning the heads").

    ``keep`` maps (type, layer) to the positions (current numbering) of the heads that stay; layers
    not listed keep all heads. Each kept head's gate g_hat and mask value are folded into its out_proj
    columns, so the result computes exactly what the gated/masked model computed; gates and masks are
    then removed. Returns :func:`kept_heads_spec` of the result.
    """
    modules = attention_modules(model)
    for key, heads in keep.items():
        if key not in modules:
            raise ValueError(f"cannot prune {key}: the model has no such attention layer")
        n = modules[key].num_heads
        if any(not 0 <= h < n for h in heads):
            raise ValueError(f"cannot keep heads {list(heads)} of {key[0]} layer {key[1]}: it has {n} heads")
        if not heads and not allow_empty_layers:
            raise ValueError(f"pruning would remove every head of {key[0]} layer {key[1]}; "
                             f"pass allow_empty_layers (--allow-empty-layers) to allow it")
    values = gate_values(model)
    for key, mha in modules.items():
        with torch.no_grad():
            scale = values[key].to(mha.out_proj.weight)
            cols = scale.repeat_interleave(mha.head_dim)
            mha.out_proj.weight.mul_(cols.unsqueeze(0))
        if getattr(mha, "head_gates", None) is not None:
            del mha.head_gates
        mha.head_mask = None
        if key in keep:
            _select_heads(mha, sorted(set(int(h) for h in keep[key])))
    return kept_heads_spec(model)
