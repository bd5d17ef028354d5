"""Bytes and FLOPs of beam-search decoding with a fairseq encoder-decoder transformer: a roofline model of
decoding time (Williams, Waterman & Patterson 2009, "Roofline: an insightful visual performance model for
multicore architectures", CACM 52(4)): a stage that reads ``b`` bytes and does ``f`` FLOPs takes at least
``max(b / bandwidth, f / peak FLOPs)``; whichever term is larger is the bound that dominates.

One decoding step of beam search (``sentences`` x ``beam`` hypotheses, all alive: the output length is
forced) reads:

* **weights**: every decoder parameter once (self-attention, the encoder-decoder attention's query and output
  projections, FFN, layer norms, the output projection), not the encoder-decoder key/value projections (the
  memory is projected once, at the first step) nor an input embedding that is not the output projection (a
  lookup reads one row per hypothesis). Pruned heads shrink the attention projections, a removed FFN takes
  its weights away;
* **cross-attention keys/values**: per decoder layer 2 x memory length x kept heads x head dim x sentences x
  (beam, or 1 where the memory is shared per sentence, as transformer_l0drop stores it: fairseq's beamable
  encoder-decoder attention);
* **self-attention keys/values**: per decoder layer 2 x (t + 1) x kept heads x head dim x sentences x beam
  at step t (0-based), so (steps + 1) / 2 positions on average over the output;
* **logits**: the output scores of every hypothesis: written and read once at the element size, then
  fairseq's log-softmax in float32 written, the running scores added (read and written) and read by top-k:
  hypotheses x vocabulary x (2 x element size + 16) bytes; the same for every variant of one vocabulary.

These are the **reads** any implementation must do. fairseq's own generator also copies at every step after
the first (``copies=True``): each self-attention cache is concatenated with the new position (read and
written) and reordered by ``index_select`` (read and written); without a shared memory every
encoder-decoder key/value cache is reordered too, and so are the encoder output and embeddings that the
stock encoder's ``reorder_encoder_out`` carries (2 tensors of memory length x hypotheses x dim).

FLOPs of a step: 2 per weight per hypothesis, and 4 per cached key/value position per head dimension per
hypothesis (scores and weighted sum; each hypothesis has its own query, so a shared memory saves bytes, not
FLOPs). Element-wise work (softmax, norms, beam search) is left out of the FLOPs.

Before the first step, once per generate (**prefill**): every encoder layer over the rows it runs on (fewer
after L0Drop's compaction), its weights read once, the input and output of every linear map read and
written, the attention scores written and read twice; then the memory projected to keys and values for
every decoder layer (per hypothesis, or per sentence where shared), and, with ``copies``, the encoder
output and embeddings expanded to every hypothesis (stock fairseq). Each encoder layer and the projection is
one roofline stage.

Assumptions: no cache holds the working set across steps (weights and caches come from memory every
step: on a CPU a small model's weights may stay in the last-level cache, which this model ignores); every
kernel runs at the memory bandwidth or the peak FLOPs, whichever binds, with no per-operation overhead
(kernel launches, Python, the beam search's bookkeeping: at batch 1 on a CPU or a GPU that overhead can
be most of the time, and the model then predicts too little time and ratios too far from 1); biases,
layer norms and L0Drop's gate parameters are counted as weights where they are read; keys and values are
stored at the model's element size (2 bytes in fp16, 4 in fp32), log-probabilities in float32.

Pure Python, no torch: the benchmarks and the tests call it with the shapes they read off a model.
"""
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

#: bytes per hypothesis per vocabulary entry of a step's scores beyond 2 x the element size (float32
#: log-probs written, read and written when the running scores are added, read by top-k)
LOGIT_FLOAT32_BYTES = 16


@dataclass(frozen=True)
class ModelShape:
    """The sizes that decide a fairseq transformer's traffic. Per-layer tuples: kept heads of every attention
    (``enc_heads``: encoder self-attention; ``dec_heads``: decoder self-attention; ``cross_heads``:
    encoder-decoder attention) and FFN inner dims (0: no FFN, as in the simplified decoder)."""

    dim: int
    head_dim: int
    vocab: int
    enc_heads: Tuple[int, ...]
    enc_ffn: Tuple[int, ...]
    dec_heads: Tuple[int, ...]
    cross_heads: Tuple[int, ...]
    dec_ffn: Tuple[int, ...]
    tied_output: bool = True  # the output projection is the decoder's embedding matrix
    dec_final_norm: bool = False  # decoder.layer_norm (pre-norm models)
    enc_final_norm: bool = False

    def __post_init__(self):
        if min(self.dim, self.head_dim, self.vocab) < 1:
            raise ValueError("dim, head_dim and vocab must be positive")
        if len(self.enc_heads) != len(self.enc_ffn):
            raise ValueError("enc_heads and enc_ffn need one value per encoder layer")
        if not len(self.dec_heads) == len(self.cross_heads) == len(self.dec_ffn):
            raise ValueError("dec_heads, cross_heads and dec_ffn need one value per decoder layer")
        if min((*self.enc_heads, *self.enc_ffn, *self.dec_heads, *self.cross_heads, *self.dec_ffn), default=0) < 0:
            raise ValueError("heads and FFN dims must be >= 0")

    @classmethod
    def uniform(cls, layers, dim, heads, ffn, vocab, dec_ffn=True, kept_heads=None, **kw):
        """Every layer alike: ``layers`` per side, ``heads`` of dim / heads each (``kept_heads`` of them kept in
        every attention if given), FFN ``ffn`` (none in the decoder if not ``dec_ffn``)."""
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        k = heads if kept_heads is None else kept_heads
        return cls(dim, dim // heads, vocab, (k,) * layers, (ffn,) * layers, (k,) * layers, (k,) * layers,
                   ((ffn if dec_ffn else 0),) * layers, **kw)


# ---------------------------------------------------------------------------------------------
# parameter counts
# ---------------------------------------------------------------------------------------------

def attention_parameters(dim, kept_dim, kv=True):
    """fairseq's MultiheadAttention with ``kept_dim`` = kept heads x head dim: q (and k, v if ``kv``)
    projections dim -> kept_dim with bias, the output projection kept_dim -> dim with bias."""
    return (3 if kv else 1) * (dim * kept_dim + kept_dim) + kept_dim * dim + dim


def ffn_parameters(dim, ffn):
    """fc1, fc2 with biases and the FFN's layer norm; 0 when there is no FFN."""
    return 2 * dim * ffn + ffn + dim + 2 * dim if ffn else 0


def encoder_layer_parameters(shape: ModelShape, i):
    d = shape.dim
    return attention_parameters(d, shape.enc_heads[i] * shape.head_dim) + 2 * d + ffn_parameters(d, shape.enc_ffn[i])


def decoder_layer_parameters(shape: ModelShape, i, per_step=False):
    """All parameters of decoder layer i; ``per_step``: those a step reads (no encoder-decoder k, v
    projections)."""
    d, h = shape.dim, shape.head_dim
    return (attention_parameters(d, shape.dec_heads[i] * h) + 2 * d
            + attention_parameters(d, shape.cross_heads[i] * h, kv=not per_step) + 2 * d
            + ffn_parameters(d, shape.dec_ffn[i]))


def decoder_parameters(shape: ModelShape):
    """Every parameter of the decoder (what ``sum(p.numel() for p in model.decoder.parameters())`` counts)."""
    d = shape.dim
    return (sum(decoder_layer_parameters(shape, i) for i in range(len(shape.dec_ffn))) + shape.vocab * d
            * (1 if shape.tied_output else 2) + (2 * d if shape.dec_final_norm else 0))


def step_weight_parameters(shape: ModelShape):
    """The decoder parameters one decoding step reads: all but the encoder-decoder key/value projections and
    an input embedding distinct from the output projection."""
    d = shape.dim
    return (sum(decoder_layer_parameters(shape, i, per_step=True) for i in range(len(shape.dec_ffn)))
            + shape.vocab * d + (2 * d if shape.dec_final_norm else 0))


def encoder_parameters(shape: ModelShape):
    """Every parameter of the encoder: its layers, the embedding matrix, a final norm (no L0Drop gates)."""
    return (sum(encoder_layer_parameters(shape, i) for i in range(len(shape.enc_ffn))) + shape.vocab * shape.dim
            + (2 * shape.dim if shape.enc_final_norm else 0))


# ---------------------------------------------------------------------------------------------
# one step, the prefill, a whole generate
# ---------------------------------------------------------------------------------------------

def step_traffic(shape: ModelShape, t, memory_len, sentences, beam, shared_memory, element_bytes, copies=False):
    """({term: bytes}, FLOPs) of decoding step ``t`` (0-based). Terms: weights, cross_kv, self_kv, logits and,
    with ``copies``, copies (fairseq's per-step concatenation and reordering; none at step 0)."""
    e, h = element_bytes, shape.head_dim
    hyps = sentences * beam
    readers = sentences if shared_memory else hyps  # memory rows read: one per sentence where shared
    params = step_weight_parameters(shape)
    cross = sum(2 * memory_len * k * h for k in shape.cross_heads)  # keys + values of one memory row
    self_kv = sum(2 * (t + 1) * k * h for k in shape.dec_heads)  # of one hypothesis
    terms = {"weights": params * e, "cross_kv": cross * readers * e, "self_kv": self_kv * hyps * e,
             "logits": hyps * shape.vocab * (2 * e + LOGIT_FLOAT32_BYTES)}
    if copies:
        cached = sum(2 * t * k * h for k in shape.dec_heads)  # positions before this step's
        c = (cached + self_kv) * hyps  # cat: read t, write t + 1 positions
        if t > 0:
            c += 2 * cached * hyps  # reorder: read and write the t cached positions
            if not shared_memory:  # the memory's key/value caches and the encoder output + embeddings
                c += 2 * cross * hyps + 2 * 2 * memory_len * shape.dim * hyps
        terms["copies"] = c * e
    flops = 2 * params * hyps + 2 * (cross + self_kv) * hyps  # 2 per weight; 4 per key/value pair element
    return terms, flops


def encoder_stages(shape: ModelShape, rows: Sequence[int], sentences, element_bytes):
    """[(bytes, FLOPs)] of every encoder layer, ``rows[i]`` source positions per sentence in layer i."""
    e, d, out = element_bytes, shape.dim, []
    for i, n in enumerate(rows):
        a, f, tokens = shape.enc_heads[i] * shape.head_dim, shape.enc_ffn[i], sentences * n
        linear_io = 3 * (d + a) + (a + d) + (2 * (d + f) if f else 0)  # read input, write output, per token
        weights = encoder_layer_parameters(shape, i)
        scores = sentences * shape.enc_heads[i] * n * n  # attention probabilities per layer
        out.append(((weights + tokens * linear_io + 4 * scores) * e,
                    2 * weights * tokens + 4 * n * n * a * sentences))
    return out


def memory_projection(shape: ModelShape, memory_len, sentences, beam, shared_memory, element_bytes, copies=False):
    """(bytes, FLOPs) of projecting the memory to every decoder layer's keys and values at the first step (and,
    with ``copies`` and no shared memory, fairseq's expansion of the encoder output and embeddings to
    every hypothesis)."""
    e, d = element_bytes, shape.dim
    rows = memory_len * (sentences if shared_memory else sentences * beam)
    b = f = 0
    for k in shape.cross_heads:
        a = k * shape.head_dim
        b += (2 * (d * a + a) + rows * (d + 2 * a)) * e  # k, v weights; read the memory, write k and v
        f += 2 * 2 * d * a * rows
    if copies and not shared_memory:
        b += 2 * 2 * memory_len * d * sentences * beam * e  # write beam copies of encoder out and embeddings
    return b, f


def roofline(nbytes, flops, bandwidth, peak_flops):
    """(seconds, "memory" or "compute") of one stage."""
    tm, tc = nbytes / bandwidth, flops / peak_flops
    return (tm, "memory") if tm >= tc else (tc, "compute")


def decoding_time(shape: ModelShape, *, enc_rows: Sequence[int], memory_len, sentences, beam, steps, shared_memory,
                  element_bytes, bandwidth, peak_flops, copies=False) -> Dict:
    """The roofline prediction of one generate: the prefill, then ``steps`` decoding steps, each stage at
    max(bytes / ``bandwidth`` (bytes/s), FLOPs / ``peak_flops`` (FLOP/s)). Returns seconds (``time_s``,
    ``prefill_s``, ``steps_s``), the mean bytes of a step by term (``step_bytes``), the share of the steps'
    predicted time that is memory-bound (``memory_bound_share``) and ``bound`` ("memory" or "compute", the
    one behind most of the steps' time)."""
    if steps < 1 or sentences < 1 or beam < 1 or memory_len < 1 or element_bytes <= 0:
        raise ValueError("steps, sentences, beam and memory_len must be >= 1 and element_bytes > 0")
    if bandwidth <= 0 or peak_flops <= 0:
        raise ValueError("bandwidth and peak_flops must be positive")
    prefill = sum(roofline(b, f, bandwidth, peak_flops)[0]
                  for b, f in encoder_stages(shape, enc_rows, sentences, element_bytes))
    prefill += roofline(*memory_projection(shape, memory_len, sentences, beam, shared_memory, element_bytes, copies),
                        bandwidth, peak_flops)[0]
    total, memory_s, mean = 0.0, 0.0, {}
    for t in range(steps):
        terms, flops = step_traffic(shape, t, memory_len, sentences, beam, shared_memory, element_bytes, copies)
        s, bound = roofline(sum(terms.values()), flops, bandwidth, peak_flops)
        total += s
        memory_s += s if bound == "memory" else 0.0
        for k, v in terms.items():
            mean[k] = mean.get(k, 0.0) + v / steps
    return {"time_s": prefill + total, "prefill_s": prefill, "steps_s": total, "step_bytes": mean,
            "memory_bound_share": memory_s / total, "bound": "memory" if memory_s >= total / 2 else "compute"}


def predicted_ratio(base: Dict, variant: Dict) -> float:
    """time(base) / time(variant) of two :func:`decoding_time` results (> 1: the variant is predicted faster)."""
    return base["time_s"] / variant["time_s"]
