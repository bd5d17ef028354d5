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
    # a remedy (prune the heads) only where it leads to an export (issue 55: the pruned coverage model was refused)
    ({"arch": "transformer_head_gates", "head_gates": "enc", "encdec_attention_coverage": True}, "coverage model"),
    ({"arch": "transformer_head_gates", "head_gates": "dec", "encdec_attention_normaliser": "entmax15"},
     "only softmax attention"),
    ({"arch": "lstm"}, "only fairseq transformer checkpoints"),
    ({}, "only fairseq transformer checkpoints"),
])
def test_refused_with_the_reason(options, reason):
    assert reason in (refusal(options) or "")


@pytest.mark.parametrize("bias", [False, True])
def test_flat_linear_is_the_linear_layer_eager_and_scripted(bias):
    """The output projection the export scripts (one 2-D product) gives the nn.Linear's values on B x T x C
    states, shares its weight, and a model without a float projection is left as it is."""
    import torch
    from torch import nn

    from fairseq_sparse.export import FlatLinear, flatten_output_projection

    torch.manual_seed(0)
    linear = nn.Linear(16, 50, bias=bias)
    flat = FlatLinear(linear)
    x = torch.randn(6, 1, 16)
    assert flat.weight is linear.weight
    assert torch.allclose(flat(x), linear(x), atol=1e-6) and flat(x).shape == (6, 1, 50)
    assert torch.allclose(torch.jit.script(flat)(x), linear(x), atol=1e-6)
    model = nn.Module()
    model.decoder = nn.Module()
    model.decoder.output_projection = linear
    flatten_output_projection(model)
    assert isinstance(model.decoder.output_projection, FlatLinear)
    quantised = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(16, 50)), {nn.Linear}, torch.qint8)
    model.decoder.output_projection = quantised[0]
    flatten_output_projection(model)
    assert model.decoder.output_projection is quantised[0]  # int8 flattens its input itself


def test_a_failed_write_leaves_no_artefact_at_the_output(tmp_path, monkeypatch):
    """export.save writes beside the output and renames: a write that fails (a full disk) leaves neither a half
    artefact at the output nor the temporary file; an earlier artefact there is kept."""
    import torch

    from fairseq_sparse import export
    from helpers.faults import full_disk_open

    out = tmp_path / "model.pt"
    out.write_bytes(b"the earlier artefact")

    def serialised(obj, f, _extra_files=None):  # the artefact serialised in memory, as export.save does first
        f.write(b"a whole artefact")

    monkeypatch.setattr(torch.jit, "save", serialised)
    monkeypatch.setattr(export, "open", full_disk_open(), raising=False)
    with pytest.raises(OSError):
        export.save(object(), str(out), {"format": 1})
    assert out.read_bytes() == b"the earlier artefact" and sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
