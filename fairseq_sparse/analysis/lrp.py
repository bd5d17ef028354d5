"""Relevance of the encoder self-attention heads by layer-wise relevance propagation (LRP): Voita et al. 2019
Sec. 4 (Figs. 1-2), with the LRP variant of Ding et al. 2017 as the authors' code implements it.

For one sentence, teacher forced, the relevance of each target position's top-1 logit (1 per position)
is propagated back through the whole model, operation by operation, to the encoder input. At every operation
y = f(x_1, .., x_n) the relevance of y is split over the inputs with the alpha-beta rule (alpha = beta = 0.5):
with the impacts z_ji = x_i dy_j/dx_i + f_j(0)/n (the bias spread evenly over the inputs), positive and
negative impacts are normalised separately,

    R_i = sum_j R_j (alpha z+_ji / (sum_i z+_ji + eps) + beta z-_ji / (sum_i z-_ji - eps)),

and the input relevances are rescaled so that their total |R| equals the output's (relevance is conserved
at every operation). Linear layers, the frozen-statistics LayerNorm and the attention's weighted sum of
values are linear in their inputs, a residual sum adds its two inputs, ReLU passes relevance to its active
inputs. The attention weights are treated as constants (the authors' ``consider_attn_constant`` option;
their default also sends relevance through the queries and keys): relevance reaches the keys' layer
only through the values.

The relevance of head h of encoder layer l is the sum of the relevance that reaches the concatenated head
outputs of that layer (the input of its output projection, where the authors split it by head) over the
head's channels and the source positions. Per layer the heads' relevances are normalised to sum to 1 and
averaged over sentences.

The propagation re-computes the forward pass of fairseq's standard post-norm transformer (``transformer``
and this plugin's models in that layout) from the model's own modules and checks it against the model's
logits; a model whose forward differs (pre-norm, layer-norm on embeddings, L0Drop or a pattern, coverage,
another normaliser, a simplified decoder, non-ReLU activations) is refused with the reason.
"""
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

ALPHA = BETA = 0.5
EPS = 1e-5


# ----------------------------------------------------------------------------------------------
# the rules


def alpha_beta(impact: Tensor, relevance: Tensor) -> Tensor:
    """Input relevance from impacts z [N, out, in] and output relevance [N, out] (not rescaled)."""
    pos, neg = impact.clamp(min=0), impact.clamp(max=0)
    transition = ALPHA * pos / (pos.sum(-1, keepdim=True) + EPS) + BETA * neg / (neg.sum(-1, keepdim=True) - EPS)
    return torch.einsum("no,noi->ni", relevance, transition)


def rescale(reference: Tensor, *inputs: Tensor) -> List[Tensor]:
    """``inputs`` scaled so that their total |R| equals that of ``reference`` (conservation)."""
    total = sum(x.abs().sum() for x in inputs) + EPS
    scale = reference.abs().sum() / total
    return [x * scale for x in inputs]


def relprop_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], relevance: Tensor) -> Tensor:
    """y = x W^T + b, one row per position: x [N, in], weight [out, in], relevance [N, out] -> [N, in]."""
    impact = x[:, None, :] * weight[None]
    if bias is not None:
        impact = impact + bias[None, :, None] / x.size(-1)
    return rescale(relevance, alpha_beta(impact, relevance))[0]


def relprop_layer_norm(x: Tensor, norm: torch.nn.LayerNorm, relevance: Tensor) -> Tensor:
    """LayerNorm with its statistics frozen: y = gamma (x - mean) / std + beta, linear in x per position."""
    d = x.size(-1)
    std = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)  # [N, 1]
    centre = torch.eye(d, dtype=x.dtype) - 1.0 / d  # d(x - mean)/dx
    jac = (norm.weight[None, :, None] / std[:, :, None]) * centre[None]  # [N, out, in]
    impact = jac * x[:, None, :] + norm.bias[None, :, None] / d
    return rescale(relevance, alpha_beta(impact, relevance))[0]


def relprop_add(a: Tensor, b: Tensor, relevance: Tensor) -> List[Tensor]:
    """y = a + b elementwise: each output element's relevance split over its two summands."""
    impact = torch.stack([a, b], dim=-1).reshape(-1, 1, 2)
    r = alpha_beta(impact, relevance.reshape(-1, 1)).reshape(a.shape + (2,))
    return rescale(relevance, r[..., 0], r[..., 1])


def relprop_relu(x: Tensor, relevance: Tensor) -> Tensor:
    """y = max(x, 0): the relevance of active units passes to their inputs."""
    return rescale(relevance, relevance * (x > 0).to(relevance.dtype))[0]


def relprop_weighted_values(weights: Tensor, values: Tensor, relevance: Tensor) -> Tensor:
    """out[t, h, c] = sum_s a[h, t, s] v[s, h, c] with the weights constant: weights [H, T, S], values [S, H, c],
    relevance [T, H, c] -> relevance of the values [S, H, c]."""
    impact = torch.einsum("hts,shc->thcs", weights, values)  # z of output (t, h, c) from input (s, h, c)
    T, H, C, S = impact.shape
    r = alpha_beta(impact.reshape(T * H * C, 1, S), relevance.reshape(T * H * C, 1))  # [T*H*C, S]
    r = r.reshape(T, H, C, S).sum(0).permute(2, 0, 1)  # [S, H, c]
    return rescale(relevance, r)[0]


# ----------------------------------------------------------------------------------------------
# the forward pass, recorded


class UnsupportedModel(ValueError):
    """The checkpoint's forward is not the standard post-norm transformer this propagation re-computes."""


def check_supported(model) -> None:
    """UnsupportedModel naming the first feature the propagation does not re-compute."""
    enc, dec = getattr(model, "encoder", None), getattr(model, "decoder", None)
    if enc is None or dec is None or not hasattr(enc, "layers") or not hasattr(dec, "layers"):
        raise UnsupportedModel(f"{type(model).__name__} is no fairseq encoder-decoder transformer")
    for what, obj in (("encoder", enc), ("decoder", dec)):
        if getattr(obj, "layernorm_embedding", None) is not None:
            raise UnsupportedModel(f"the {what} has a layer norm on its embeddings")
        if getattr(obj, "layer_norm", None) is not None:
            raise UnsupportedModel(f"the {what} is pre-norm (--{what}-normalize-before)")
    if getattr(enc, "l0drop", None) is not None or getattr(enc, "pattern", None) is not None:
        raise UnsupportedModel("the encoder output is gated (L0Drop or a rule-based pattern)")
    if getattr(dec, "project_in_dim", None) is not None or getattr(dec, "project_out_dim", None) is not None:
        raise UnsupportedModel("the decoder projects its input or output dimension")
    for what, layers in (("encoder", enc.layers), ("decoder", dec.layers)):
        for layer in layers:
            if layer.normalize_before:
                raise UnsupportedModel(f"the {what} layers are pre-norm")
            if getattr(layer, "activation_fn", None) is not F.relu and \
                    getattr(layer.activation_fn, "__name__", "") != "relu":
                raise UnsupportedModel(f"the {what} FFN activation is not ReLU")
            blocks = getattr(layer, "blocks", ("self", "cross", "ffn") if what == "decoder" else None)
            if what == "decoder" and tuple(blocks) != ("self", "cross", "ffn"):
                raise UnsupportedModel(f"the decoder layout is {','.join(blocks)}, not the standard one")
            for name in ("self_attn", "encoder_attn"):
                mha = getattr(layer, name, None)
                if mha is None:
                    continue
                if type(mha).__name__ not in ("MultiheadAttention", "CountAwareAttention"):
                    raise UnsupportedModel(f"the {what} {name} is {type(mha).__name__}")
                if getattr(mha, "head_gates", None) is not None:
                    raise UnsupportedModel(f"the {what} {name} has head gates (prune them first)")


def _attention(mha, query: Tensor, key: Tensor, causal: bool = False) -> Dict[str, Tensor]:
    """fairseq's MultiheadAttention on one sentence ([T, d], [S, d]), with what the relevance needs."""
    H, hd = mha.num_heads, mha.head_dim
    q = (mha.q_proj(query) * mha.scaling).view(-1, H, hd).transpose(0, 1)  # [H, T, hd]
    k = mha.k_proj(key).view(-1, H, hd).transpose(0, 1)
    v = mha.v_proj(key)  # [S, H * hd]
    logits = q @ k.transpose(1, 2)  # [H, T, S]
    if causal:
        T = query.size(0)
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    weights = torch.softmax(logits.float(), -1).to(v.dtype)
    heads = torch.einsum("hts,shc->thc", weights, v.view(-1, H, hd)).reshape(query.size(0), H * hd)
    return {"key": key, "v": v, "weights": weights, "heads": heads, "out": mha.out_proj(heads)}


def _block(x: Tensor, sub: Tensor, norm) -> Dict[str, Tensor]:
    s = x + sub
    return {"x": x, "sub": sub, "sum": s, "y": norm(s)}


def _ffn(layer, x: Tensor) -> Dict[str, Tensor]:
    h = layer.fc1(x)
    return {"x": x, "h": h, "a": F.relu(h), "out": layer.fc2(F.relu(h))}


def record_forward(model, src: Tensor, prev: Tensor) -> dict:
    """The forward pass of one sentence (src [S], prev [T] without padding), every intermediate kept."""
    enc, dec = model.encoder, model.decoder
    x = enc.forward_embedding(src[None])[0][0]
    enc_layers = []
    for layer in enc.layers:
        att = _attention(layer.self_attn, x, x)
        b1 = _block(x, att["out"], layer.self_attn_layer_norm)
        ffn = _ffn(layer, b1["y"])
        b2 = _block(b1["y"], ffn["out"], layer.final_layer_norm)
        enc_layers.append({"att": att, "b1": b1, "ffn": ffn, "b2": b2})
        x = b2["y"]
    memory = x
    y = dec.embed_scale * dec.embed_tokens(prev[None])[0]
    if dec.embed_positions is not None:
        y = y + dec.embed_positions(prev[None])[0]
    dec_layers = []
    for layer in dec.layers:
        self_att = _attention(layer.self_attn, y, y, causal=True)
        b1 = _block(y, self_att["out"], layer.self_attn_layer_norm)
        cross = _attention(layer.encoder_attn, b1["y"], memory)
        b2 = _block(b1["y"], cross["out"], layer.encoder_attn_layer_norm)
        ffn = _ffn(layer, b2["y"])
        b3 = _block(b2["y"], ffn["out"], layer.final_layer_norm)
        dec_layers.append({"self": self_att, "b1": b1, "cross": cross, "b2": b2, "ffn": ffn, "b3": b3})
        y = b3["y"]
    logits = dec.output_layer(y[None])[0]
    return {"enc": enc_layers, "dec": dec_layers, "memory": memory, "features": y, "logits": logits}


# ----------------------------------------------------------------------------------------------
# the propagation


def _back_block(block: dict, norm, relevance: Tensor):
    """Through y = LN(x + sub): relevance of x and of sub."""
    r_sum = relprop_layer_norm(block["sum"], norm, relevance)
    return relprop_add(block["x"], block["sub"], r_sum)


def _back_ffn(layer, ffn: dict, relevance: Tensor) -> Tensor:
    r = relprop_linear(ffn["a"], layer.fc2.weight, layer.fc2.bias, relevance)
    r = relprop_relu(ffn["h"], r)
    return relprop_linear(ffn["x"], layer.fc1.weight, layer.fc1.bias, r)


def _back_attention(mha, att: dict, relevance: Tensor):
    """Through the output projection and the weighted values to the key input: (relevance of the concatenated
    head outputs [T, H * hd], relevance of the key/value input [S, d])."""
    H, hd = mha.num_heads, mha.head_dim
    r_heads = relprop_linear(att["heads"], mha.out_proj.weight, mha.out_proj.bias, relevance)
    r_v = relprop_weighted_values(att["weights"], att["v"].view(-1, H, hd), r_heads.view(-1, H, hd))
    r_key = relprop_linear(att["key"], mha.v_proj.weight, mha.v_proj.bias, r_v.reshape(-1, H * hd))
    return r_heads, r_key


def propagate(model, record: dict, targets: Optional[Tensor] = None) -> dict:
    """Relevance of the top-1 logit of every target position (or of ``targets``), 1 each, propagated to the
    encoder heads: {"heads": [per encoder layer, relevance per head], "input": relevance of the encoder input
    embeddings [S, d], "decoder_input": of the decoder input embeddings [T, d], "total": initial total}."""
    dec, enc = model.decoder, model.encoder
    logits, y = record["logits"], record["features"]
    top = logits.argmax(-1) if targets is None else targets
    weight = dec.output_projection.weight[top]  # [T, d]: only the chosen logit carries relevance
    impact = (y * weight)[:, None, :]
    r_y = rescale(torch.ones(len(top)), alpha_beta(impact, torch.ones(len(top), 1)))[0]
    r_memory = torch.zeros_like(record["memory"])
    for layer, rec in zip(reversed(dec.layers), reversed(record["dec"])):
        r_b2, r_ffn = _back_block(rec["b3"], layer.final_layer_norm, r_y)
        r_b2 = r_b2 + _back_ffn(layer, rec["ffn"], r_ffn)
        r_b1, r_cross = _back_block(rec["b2"], layer.encoder_attn_layer_norm, r_b2)
        _, r_mem = _back_attention(layer.encoder_attn, rec["cross"], r_cross)
        r_memory = r_memory + r_mem
        r_x, r_self = _back_block(rec["b1"], layer.self_attn_layer_norm, r_b1)
        r_y = r_x + _back_attention(layer.self_attn, rec["self"], r_self)[1]
    heads: List[Tensor] = [None] * len(enc.layers)
    r = r_memory
    for k in reversed(range(len(enc.layers))):
        layer, rec = enc.layers[k], record["enc"][k]
        r_b1, r_ffn = _back_block(rec["b2"], layer.final_layer_norm, r)
        r_b1 = r_b1 + _back_ffn(layer, rec["ffn"], r_ffn)
        r_x, r_att = _back_block(rec["b1"], layer.self_attn_layer_norm, r_b1)
        r_heads, r_key = _back_attention(layer.self_attn, rec["att"], r_att)
        H = layer.self_attn.num_heads
        heads[k] = r_heads.view(r_heads.size(0), H, -1).sum((0, 2))
        r = r_x + r_key
    return {"heads": heads, "input": r, "decoder_input": r_y, "total": float(len(top))}


class HeadRelevance:
    """Per encoder layer, each head's share of the layer's head relevance, summed over sentences."""

    def __init__(self):
        self.sums: Optional[List[Tensor]] = None
        self.sentences = 0

    def add(self, heads: Sequence[Tensor]):
        shares = [h / h.sum() if float(h.sum()) != 0 else torch.zeros_like(h) for h in heads]
        self.sums = shares if self.sums is None else [a + b for a, b in zip(self.sums, shares)]
        self.sentences += 1

    def mean(self) -> List[List[float]]:
        return [(s / max(self.sentences, 1)).tolist() for s in (self.sums or [])]


def head_relevance(model, sentences, max_logit_difference: float = 1e-3) -> HeadRelevance:
    """LRP head relevance over ``sentences``: (source tokens [S], previous target tokens [T]) pairs, no padding.
    The re-computed forward pass must match the model's logits within ``max_logit_difference``."""
    check_supported(model)
    stats = HeadRelevance()
    model.eval()
    for k, (src, prev) in enumerate(sentences):
        with torch.no_grad():
            record = record_forward(model, src, prev)
            if k == 0:
                ref = model(src[None], torch.tensor([src.numel()]), prev[None])[0][0]
                diff = float((ref - record["logits"]).abs().max())
                if diff > max_logit_difference:
                    raise UnsupportedModel(f"its forward pass is not the standard post-norm transformer's (logits "
                                           f"differ by {diff:.2g})")
            stats.add(propagate(model, record)["heads"])
    return stats
