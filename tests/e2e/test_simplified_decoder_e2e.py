"""Decoder sub-layer orders and the simplified decoder (paper 004, Yang et al. 2020).

Unit tests of :class:`SublayerDecoderLayer` against fairseq's own decoder layer and against the closed
forms of paper 004 Sec. 2.2 / 3.3 (module representations recorded with ``layer.record``), parameter
counts (Table 3), incremental beam search == a full teacher-forced pass for every layout, and exact
L0Drop pruned decoding with the new layouts. The console-script tests are in
test_simplified_decoder_cli.py.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_simplified_decoder.py.
"""
import copy

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the models)
from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel, transformer_l0drop
from fairseq_sparse.modules.decoder_layer import decoder_blocks
from helpers.checkpoints import drop_fraction, load, mixed_batch, pruned_vs_unpruned, sparsity


# ----------------------------------------------------------------------------------------------
# L0Drop with the new layouts: pruned decoding stays exact


@pytest.fixture(scope="module")
def stock_loaded(stock_transformer_ckpt, corpus):
    return load(stock_transformer_ckpt, corpus["bin"])


def l0drop_model(stock_loaded, **layout):
    """transformer_l0drop with the stock checkpoint's weights in the given decoder layout: the full state
    dict loads strictly (absent FFN / self-attention weights are left out, gates initialised)."""
    stock, cfg, task = stock_loaded
    args = copy.deepcopy(cfg.model)
    args.arch = args._name = "transformer_l0drop"
    for k, v in layout.items():
        setattr(args, k, v)
    transformer_l0drop(args)
    model = L0DropTransformerModel.build_model(args, task)
    model.load_state_dict(copy.deepcopy(stock.state_dict()), strict=True)
    return model.eval(), task


@pytest.mark.parametrize("layout,dropped_as", [(dict(simplified_decoder=True), "zero"),
                                               (dict(decoder_sublayer_order="sem-tem-ifm"), "mask")],
                         ids=["simplified-zero", "sem-tem-ifm-mask"])
def test_l0drop_pruned_decoding_is_exact_with_the_layouts(stock_loaded, layout, dropped_as):
    """Beam 4 with the compressed memory (pruned decoding) == with the full gated memory."""
    model, task = l0drop_model(stock_loaded, **layout)
    layer = model.decoder.layers[0]
    assert layer.blocks == decoder_blocks(layout.get("decoder_sublayer_order"), layout.get("simplified_decoder", False))
    if layout.get("simplified_decoder"):
        assert layer.fc1 is None
    # the stock weights were loaded (the encoder is untouched by the layout)
    stock = stock_loaded[0]
    assert torch.equal(model.encoder.layers[0].fc1.weight, stock.encoder.layers[0].fc1.weight)
    assert torch.equal(layer.encoder_attn.q_proj.weight, stock.decoder.layers[0].encoder_attn.q_proj.weight)
    sample = mixed_batch(task)
    drop_fraction(model, model.encoder.l0drop, sample, 0.4)
    assert 0.0 < sparsity(model, sample) < 1.0
    pruned, full = pruned_vs_unpruned(model, task, sample, 4, dropped_as)
    assert len({len(h[0]["tokens"]) for h in full}) > 1
