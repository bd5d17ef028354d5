"""fairseq-sparse-export's refusals, read from a checkpoint's model options before anything is built (the
exports themselves, which script and decode, are in tests/e2e/test_export_e2e.py)."""
import pytest

from fairseq_sparse.export import refusal


@pytest.mark.parametrize("options", [
    {"arch": "transformer"},
    {"_name": "transformer_wmt_en_de"},
    {"arch": "transformer_head_gates", "head_gates": "", "kept_heads": '{"enc": [[0, 1]]}'},
    {"arch": "transformer_simplified_decoder", "head_gates": "", "encdec_attention_normaliser": "softmax"},
    {"arch": "transformer_l0drop", "l0drop_between_layers": False, "encoder_output_pattern": "none"},
    {"arch": "transformer_l0drop_iwslt_de_en"},
    {"arch": "transformer_l0drop", "encoder_output_pattern": "group", "encoder_output_pattern_every": 2},
])
def test_exportable(options):
    assert refusal(options) is None


@pytest.mark.parametrize("options, reason", [
    ({"arch": "transformer_l0drop", "encoder_output_pattern": "pos"}, "part-of-speech tags"),
    ({"arch": "transformer_head_gates", "head_gates": "enc,dec,encdec"}, "fairseq-sparse-prune-heads"),
    ({"arch": "transformer", "encdec_attention_normaliser": "sparsemax"}, "only softmax attention"),
    ({"arch": "transformer_head_gates", "encdec_attention_coverage": True}, "coverage model"),
    ({"arch": "lstm"}, "only fairseq transformer checkpoints"),
    ({}, "only fairseq transformer checkpoints"),
])
def test_refused_with_the_reason(options, reason):
    assert reason in (refusal(options) or "")
