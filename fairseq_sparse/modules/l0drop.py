"""L0Drop (Zhang, Titov & Sennrich 2021, "On sparsifying encoder outputs in sequence-to-sequence
models"): input-dependent HardConcrete gates on encoder states, and the compressed memory that
decodes exactly like the gated one (Algorithm 1).

Dropped states (gate exactly 0) can mean one of two things, chosen with ``dropped_as``:

* ``"zero"``: a dropped state is the zero vector and stays visible to the decoder. Its key and value
  are the projection biases, so all dropped states of a sentence get the same attention logit: the
  compressed memory replaces them by one zero state whose logit is raised by log(count)
  (Algorithm 1; what the reference code does at test time).
* ``"mask"``: dropped states are removed from the decoder's attention (what the reference code does
  in training). A sentence whose states are all dropped attends to a single zero state (the limit of
  masking everything; it avoids a softmax over nothing).

Training and decoding use the same semantics, so the compressed memory is exact for both.
"""
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from .hard_concrete import HardConcrete
from .sparsity import SparsityCount, SparsityModule, SparsityTerm, mark_input_weight

DROPPED_AS_CHOICES = ("zero", "mask")


class L0Drop(SparsityModule):
    """Gates g_i ~ HardConcrete(log alpha_i) on encoder states x_i, log alpha_i = x_i . w + b (Eq. 9).

    Args:
        embed_dim: size of the states x_i
        hard_concrete: the gate distribution (beta, gamma, zeta)
        init_bias: initial b. w starts at 0, so every gate starts input-independent at
            g_hat = clamp(sigmoid(b) * (zeta - gamma) + gamma, 0, 1); the default 3.0 gives g_hat = 1
            and P(g != 0) = 0.99, i.e. a converged model's function is unchanged at the start of
            fine-tuning (the paper's main recipe).
        name: prefix of the logged statistics (``l0drop`` for the gates on the encoder output)
        penalty_scale: factor of the recorded penalty (1 / number of gated layers averages the penalties
            of ``--l0drop-between-layers`` instead of summing them)
    """

    penalty_group = "l0drop"

    def __init__(self, embed_dim: int, hard_concrete: HardConcrete, init_bias: float = 3.0, name="l0drop",
                 penalty_scale: float = 1.0):
        super().__init__()
        self.hard_concrete = hard_concrete
        self.log_alpha_proj = nn.Linear(embed_dim, 1)
        mark_input_weight(self.log_alpha_proj.weight)
        self.init_bias = init_bias
        self.name = name
        self.penalty_scale = penalty_scale
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.zeros_(self.log_alpha_proj.weight)
        nn.init.constant_(self.log_alpha_proj.bias, self.init_bias)

    def log_alpha(self, x: Tensor) -> Tensor:
        """log alpha for states x (T x B x C), as B x T, in float32."""
        return self.log_alpha_proj(x).squeeze(-1).transpose(0, 1).float()

    def test_time_gates(self, x: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """(gated x, g_hat B x T) of the states x (T x B x C) in eval mode, Eq. 13, without statistics: what
        :meth:`forward` computes in eval mode, for TorchScript (fairseq-sparse-export)."""
        gates = self.hard_concrete.deterministic(self.log_alpha(x)) * ~padding_mask
        return x * gates.transpose(0, 1).unsqueeze(-1).to(x.dtype), gates

    @torch.jit.unused  # records statistics in Python; TorchScript takes test_time_gates
    def forward(self, x: Tensor, padding_mask: Optional[Tensor], alive: Optional[Tensor] = None,
                dropped_before: int = 0):
        """Gate the states x (T x B x C); padding_mask (B x T, True = pad) may be None.

        ``alive`` (B x T) marks states not dropped by an earlier L0Drop layer; those stay dropped.
        ``dropped_before``: real states of the batch that an earlier layer dropped and that are no longer
        among x (a compacted encoder); the statistics count them as pruned tokens.
        Returns (gated x, gates B x T): sampled gates in training, g_hat (Eq. 13) in eval mode.
        Records, in training only, the expected-L0 penalty: ``penalty_scale`` times the mean over
        sentences of sum_i P(g_i != 0) / n_real (the reference code's per-sentence normalisation); and
        in both modes the expected L0 and the sparsity rate of g_hat per real source token.
        """
        log_alpha = self.log_alpha(x)
        real = torch.ones_like(log_alpha, dtype=torch.bool) if padding_mask is None else ~padding_mask
        n_real = real.sum(1).clamp(min=1)
        candidates = real if alive is None else real & alive
        gates = self.hard_concrete(log_alpha) * candidates
        x = x * gates.transpose(0, 1).unsqueeze(-1).to(x.dtype)

        p_open = self.hard_concrete.prob_open(log_alpha) * candidates
        penalty = self.penalty_scale * (p_open.sum(1) / n_real).mean() if self.training else None
        g_hat = gates if not self.training else self.hard_concrete.deterministic(log_alpha) * candidates
        tokens = real.sum().detach() + dropped_before
        pruned = (real & (g_hat == 0)).sum().detach() + dropped_before
        self.record(SparsityTerm(
            group=self.penalty_group,
            penalty=penalty,
            stats={
                f"{self.name}_expected_l0": (p_open.sum().detach(), tokens),
                f"{self.name}_sparsity": (pruned, tokens),
            },
            sparsity={self.name: SparsityCount(tokens - p_open.sum(), pruned, tokens)},
        ))
        return x, gates


def decoder_padding_mask(gates: Tensor, padding_mask: Optional[Tensor], dropped_as: str) -> Optional[Tensor]:
    """The key padding mask of the uncompressed gated memory: padding, plus (``mask``) the dropped
    states, except in sentences where every state was dropped (those attend to their zero states,
    which is the same as attending to one zero state)."""
    if dropped_as == "zero":
        return padding_mask
    real = torch.ones_like(gates, dtype=torch.bool) if padding_mask is None else ~padding_mask
    dropped = real & (gates == 0)
    all_dropped = (dropped == real).all(dim=1, keepdim=True)
    mask = ~real | (dropped & ~all_dropped)
    return mask


class CompressedMemory(NamedTuple):
    """The encoder memory of Algorithm 1: [dummy zero state, kept states...], right-padded.

    memory: T' x B x C, T' = 1 + max_b N'_b; row 0 is the dummy zero state.
    padding_mask: B x T' (True = not attended); the dummy is masked where its count is 0.
    log_count: B x T' float, log(count) of the dummy (0 where masked) and 0 for kept states;
        added to the attention logits (count-aware softmax, Algorithm 1 line 7).
    kept_index: B x T', original position of each kept state (0 for the dummy and padding).
    pruned: B x T, real states represented by the dummy (they share its attention evenly).
    count: B, how many states the dummy stands for (0: masked).
    """

    memory: Tensor
    padding_mask: Tensor
    log_count: Tensor
    kept_index: Tensor
    pruned: Tensor
    count: Tensor


def compress(x: Tensor, gates: Tensor, padding_mask: Optional[Tensor], dropped_as: str,
             dropped_before: Optional[Tensor] = None) -> CompressedMemory:
    """Algorithm 1, step 1: drop the states whose gate is 0 and add one counted dummy zero state.

    x: gated states T x B x C (kept states already scaled by their gate), gates: B x T.
    The count of the dummy is N - N' (``zero``) or 1 for a sentence with nothing kept (``mask``).
    ``dropped_before`` (B): states of each sentence dropped before x (a compacted encoder: they are
    not among x's real states); with ``zero`` the dummy stands for them too.
    """
    T, B, C = x.shape
    real = torch.ones_like(gates, dtype=torch.bool) if padding_mask is None else ~padding_mask
    kept = real & (gates != 0)
    n_kept = kept.sum(1)
    pruned = real & ~kept
    if dropped_as == "zero":
        count = pruned.sum(1)
        if dropped_before is not None:
            count = count + dropped_before
    else:
        count = (n_kept == 0).long()
    width = int(n_kept.max()) if B > 0 else 0
    # stable sort puts kept positions first, in their original order
    order = torch.sort((~kept).to(torch.uint8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=x.device).unsqueeze(0) < n_kept.unsqueeze(1)
    kept_states = x.gather(0, order.t().unsqueeze(-1).expand(width, B, C))
    kept_states = kept_states * valid.t().unsqueeze(-1).to(x.dtype)
    memory = torch.cat([x.new_zeros(1, B, C), kept_states], dim=0)
    mask = torch.cat([(count == 0).unsqueeze(1), ~valid], dim=1)
    log_count = torch.zeros(B, width + 1, device=x.device, dtype=torch.float32)
    log_count[:, 0] = count.clamp(min=1).float().log()
    kept_index = torch.cat([order.new_zeros(B, 1), order * valid], dim=1)
    return CompressedMemory(memory, mask, log_count, kept_index, pruned, count)


class CompactedEncoder:
    """The encoder states of a batch while L0Drop between layers compacts them (Zhang, Titov & Sennrich
    2021 Sec. 6 "prune encodings earlier", made physical): after each gated layer the dropped states
    leave the sequence, so later layers' self-attention and FFN run over N' + 1 rows. Exact: with
    ``zero`` the dropped states of a sentence are identical zero vectors in every later layer (the next
    gate zeroes them again), so they are one counted dummy key (logit + log count, as Algorithm 1 does
    for the decoder); with ``mask`` they are absent, and the dummy is seen only where nothing is kept.

    ``index`` (B x T') maps each row to its original position; ``live_pad`` marks rows that are not live
    states (padding and the dummy): the next L0Drop's padding mask.
    """

    def __init__(self, padding_mask: Tensor):
        self.original_pad = padding_mask
        self.n_real = int((~padding_mask).sum())
        # None until the first gated layer (the annotation: TorchScript compiles this class for the exported encoder)
        self.memory = torch.jit.annotate(Optional[CompressedMemory], None)
        self.index = torch.arange(padding_mask.size(1), device=padding_mask.device).expand_as(padding_mask)
        self.live_pad = padding_mask

    def dropped(self) -> Optional[Tensor]:
        """Per sentence, the count of the current dummy (``zero``: the states dropped so far); None before
        the first compaction."""
        mem = self.memory
        return None if mem is None else mem.count

    def layer_inputs(self) -> Tuple[Tensor, Optional[Tensor]]:
        """(padding mask, log counts) for the next encoder layer's self-attention over the rows."""
        mem = self.memory
        return (self.original_pad, None) if mem is None else (mem.padding_mask, mem.log_count)

    def dropped_before(self) -> int:
        """Real states of the batch no longer among the rows (for L0Drop's statistics)."""
        return self.n_real - int((~self.live_pad).sum())

    def compact(self, x: Tensor, gates: Tensor, dropped_as: str) -> Tensor:
        """Keep the rows whose gate is open, behind a fresh zero dummy; returns the new states. A gate that
        closed nothing leaves the rows as they are (x is already gated: the dummy row, never a candidate, is 0),
        so an open gate costs no extra row."""
        if not bool(((gates == 0) & ~self.live_pad).any()):
            return x
        mem = compress(x, gates, self.live_pad, dropped_as, self.dropped())
        self.memory = mem
        self.index = self.index.gather(1, mem.kept_index)
        live_pad = mem.padding_mask.clone()
        live_pad[:, 0] = True
        self.live_pad = live_pad
        return mem.memory

    def original_gates(self, gates: Tensor) -> Tensor:
        """Gates of the live rows (B x T') at the original positions (B x T), 0 for dropped states."""
        full = gates.new_zeros(self.original_pad.shape)
        return full.scatter_add_(1, self.index, gates * ~self.live_pad)

    def original_memory(self, mem: CompressedMemory) -> CompressedMemory:
        """``mem`` (compressed from the rows) with kept_index and pruned at the original positions."""
        kept_index = self.index.gather(1, mem.kept_index) * ~mem.padding_mask
        kept_index[:, 0] = 0
        kept = kept_index.new_zeros(self.original_pad.shape).scatter_add_(
            1, kept_index[:, 1:], (~mem.padding_mask[:, 1:]).long()) > 0  # padding slots add 0 at position 0
        return CompressedMemory(mem.memory, mem.padding_mask, mem.log_count, kept_index, ~self.original_pad & ~kept,
                                mem.count)


def expand_attention(attn: Tensor, kept_index: Tensor, pruned: Tensor) -> Tensor:
    """Map attention over a compressed memory (B x T_tgt x T') back to the original source positions
    (B x T_tgt x T): kept states get their own weight, the dummy's weight is shared evenly by the
    states it stands for. Equals the attention of the uncompressed gated model."""
    B, T_tgt, _ = attn.shape
    full = attn.new_zeros(B, T_tgt, pruned.size(1))
    # padding slots of kept_index point at position 0 with weight 0; scatter_add keeps them harmless
    full.scatter_add_(2, kept_index[:, 1:].unsqueeze(1).expand(B, T_tgt, -1), attn[:, :, 1:])
    share = pruned.to(attn.dtype) / pruned.sum(1, keepdim=True).clamp(min=1).to(attn.dtype)
    return full + attn[:, :, :1] * share.unsqueeze(1)
