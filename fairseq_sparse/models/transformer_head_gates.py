"""transformer_head_gates: a fairseq Transformer with per-head L0 gates (Voita et al. 2019).

The head-gate options exist on every model of ours (:mod:`.sparse_transformer`; default: no gates
elsewhere), so one model can combine L0Drop and head gates. ``--kept-heads`` gives a model the shapes
of a physically pruned one; ``fairseq-sparse-prune-heads`` writes it, plain ``fairseq-generate`` reads it.
"""
from fairseq.models import register_model

from ..modules.head_gates import ATTENTION_TYPES
from .sparse_transformer import SparseTransformerModel, register_architectures


@register_model("transformer_head_gates")
class HeadGatesTransformerModel(SparseTransformerModel):
    """Transformer with one HardConcrete gate per attention head (Voita et al. 2019)."""

    default_head_gates = ",".join(ATTENTION_TYPES)


register_architectures("transformer_head_gates", HeadGatesTransformerModel)
