"""transformer_simplified_decoder: decoder layers without FFN (Yang et al. 2020, Sec. 3.3).

The information-fusion module is one Add&Norm. Head gates, sub-layer orders and attention normalisers
combine as on every model of ours (:mod:`.sparse_transformer`; no head gates by default).
"""
from fairseq.models import register_model

from .sparse_transformer import SparseTransformerModel, register_architectures


@register_model("transformer_simplified_decoder")
class SimplifiedDecoderTransformerModel(SparseTransformerModel):
    """Transformer whose decoder layers have no FFN (Yang et al. 2020)."""

    simplified_decoder = True


register_architectures("transformer_simplified_decoder", SimplifiedDecoderTransformerModel)
