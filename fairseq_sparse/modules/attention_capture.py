"""Record the per-head attention weights of fairseq attention modules during a forward pass.

fairseq's MultiheadAttention returns per-head weights only with ``need_head_weights`` and only on its
own (slow) code path: PyTorch's fused fast path, which encoder self-attention takes, averages the
heads. The recorder forces both for the modules it watches and restores them afterwards.
"""
from typing import List, Optional, Sequence

import torch


class HeadAttentionRecorder:
    """Context manager: while active, ``weights[k]`` holds the per-head attention of ``modules[k]`` in
    the last forward pass, [heads, batch, tgt, src] on CPU (None: no module, or a layer without heads)."""

    def __init__(self, modules: Sequence[Optional[torch.nn.Module]]):
        self.modules = list(modules)
        self.weights: List[Optional[torch.Tensor]] = [None] * len(self.modules)
        self._handles, self._saved = [], []

    def __enter__(self):
        for k, mha in enumerate(self.modules):
            # None: the module had no such attribute (not a fairseq attention module): removed again on exit
            self._saved.append(None if mha is None else getattr(mha, "skip_embed_dim_check", None))
            if mha is None:
                continue
            mha.skip_embed_dim_check = True  # fairseq's slow path: PyTorch's fast path averages the heads
            self._handles.append(mha.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            self._handles.append(mha.register_forward_hook(self._make_hook(k)))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        for mha, saved in zip(self.modules, self._saved):
            if mha is None:
                continue
            if saved is None:
                mha.__dict__.pop("skip_embed_dim_check", None)
            else:
                mha.skip_embed_dim_check = saved
        self._handles, self._saved = [], []
        return False

    def reset(self):
        self.weights = [None] * len(self.modules)

    @staticmethod
    def _pre_hook(module, args, kwargs):
        # MultiheadAttention.forward(query, key, value, key_padding_mask, incremental_state,
        #                            need_weights, static_kv, attn_mask, before_softmax, need_head_weights)
        args = list(args)
        for position, name in ((5, "need_weights"), (9, "need_head_weights")):
            if len(args) > position:
                args[position] = True
            else:
                kwargs[name] = True
        return tuple(args), kwargs

    def _make_hook(self, k):
        def hook(module, args, output):
            w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if w is not None and w.dim() != 4:
                raise RuntimeError(f"attention module {k}: weights of shape {tuple(w.shape)}, expected "
                                   f"[heads, batch, tgt, src]; {type(module).__name__} ignores need_head_weights")
            self.weights[k] = None if w is None else w.detach().float().cpu()

        return hook
