"""transformer_l0drop under torch.jit.script (fairseq-sparse-export): the encoder's scripted path
(``forward_test_time``) gives the memory of the eager generators' path, and the scripted beam search the eager
one's hypotheses, for gates on the output and between layers, the rule-based patterns (group, freq), merged
outputs (--encoder-output-merge), states
dropped as zeros or masked, pruned decoding on and off. In-process models with random gates (no training); trained checkpoints: tests/e2e/test_export_e2e.py."""
import copy

import pytest
import torch
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_sparse import export
from helpers.models import build_l0drop_model, mixed_length_batch

GROUP = ["--encoder-output-pattern", "group", "--encoder-output-pattern-every", "2"]
FREQ = ["--encoder-output-pattern", "freq", "--encoder-output-pattern-top-k", "6"]
MERGE_MEAN, MERGE_ATTENTION = (["--encoder-output-merge", kind] for kind in ("mean", "attention"))
#: (dropped_as, between, pruned_decoding, pattern and merge options)
CASES = [("zero", False, True, []), ("mask", False, True, []), ("zero", False, False, []), ("zero", True, True, []),
         ("mask", True, True, []), ("zero", False, True, GROUP), ("mask", False, True, FREQ),
         ("zero", False, True, MERGE_ATTENTION), ("mask", False, True, FREQ + MERGE_MEAN),
         ("zero", False, True, FREQ + ["--encoder-output-pattern-whole-words"])]


def gated_model(dropped_as, between, pruned_decoding, pattern):
    """Eval-mode transformer_l0drop whose gates (each a random direction, bias -3) close a quarter to a half of
    the states at each gate; or a rule-based pattern instead of the output gates."""
    extra = ["--l0drop-dropped-as", dropped_as] + (["--l0drop-between-layers"] if between else []) + pattern
    model, _ = build_l0drop_model(*extra)
    model.eval()
    model.encoder.pruned_decoding = pruned_decoding
    g = torch.Generator().manual_seed(0)
    gates = [] if "--encoder-output-pattern" in pattern else [model.encoder.l0drop]
    with torch.no_grad():
        for gate in gates + (list(model.encoder.layer_l0drops) if between else []):
            gate.log_alpha_proj.weight.copy_(torch.randn(gate.log_alpha_proj.weight.shape, generator=g))
            gate.log_alpha_proj.bias.fill_(-3.0)
        if model.encoder.merge is not None and model.encoder.merge.score is not None:
            model.encoder.merge.score.weight.copy_(torch.randn(model.encoder.merge.score.weight.shape, generator=g))
    return model


@pytest.mark.parametrize("dropped_as, between, pruned_decoding, pattern", CASES)
def test_scripted_path_gives_the_generators_memory(dropped_as, between, pruned_decoding, pattern):
    model = gated_model(dropped_as, between, pruned_decoding, pattern)
    src, lengths = mixed_length_batch()
    scripted_path = copy.deepcopy(model)
    with torch.no_grad():
        want = model.encoder.forward_torchscript({"src_tokens": src, "src_lengths": lengths})
        got = scripted_path.encoder.forward_test_time(src, lengths)
    real = src.ne(1)
    assert 0 < int(((want["l0drop_gates"][0] == 0) & real).sum()) < int(real.sum())  # some states pruned, not all
    keys = ["encoder_out", "encoder_padding_mask", "l0drop_gates"]
    if pruned_decoding or between:  # between layers, the scripted encoder always compacts (exact either way)
        keys += ["l0drop_log_count", "l0drop_kept_index", "l0drop_pruned"]
    for key in keys:
        assert got[key][0].shape == want[key][0].shape, key
        torch.testing.assert_close(got[key][0].float(), want[key][0].float(), atol=1e-5, rtol=0, msg=key)


@pytest.mark.parametrize("dropped_as, between, pruned_decoding, pattern", CASES)
def test_scripted_beam_search_gives_the_eager_hypotheses(dropped_as, between, pruned_decoding, pattern):
    """(--int8 of trained L0Drop checkpoints: tests/e2e/test_export_e2e.py; with random weights int8 rounding
    turns near ties either way.)"""
    model = gated_model(dropped_as, between, pruned_decoding, pattern)
    d = model.encoder.dictionary
    task = TranslationTask(TranslationConfig(), d, d)
    options = dict(export.GENERATION_DEFAULTS, beam=3, max_len_b=8)
    scripted = export.script_translator(model, task, options, {})
    src, lengths = mixed_length_batch()
    with torch.no_grad():
        want = export.build_generator(model, task.target_dictionary, options)(
            {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    got = scripted(src, lengths)
    for w, g in zip(want, got):
        for hyp_w, hyp_g in zip(w, g):
            assert hyp_w["tokens"].tolist() == hyp_g["tokens"].tolist()
            assert abs(float(hyp_w["score"]) - float(hyp_g["score"])) < 1e-4


@pytest.mark.parametrize("arch", ["transformer", "transformer_l0drop"])
def test_scripted_without_beam_attention_gives_the_same_hypotheses(arch):
    """``beam_attention=False`` (fairseq-sparse-export --no-attention), on fairseq's own decoder and the L0Drop
    one with pruned decoding: the same tokens and scores bit for bit, an empty attention in every hypothesis."""
    from helpers.models import build

    from fairseq_sparse.modules.beam_attention import BeamAttentionOption

    model = gated_model("zero", False, True, []) if arch == "transformer_l0drop" else build(arch)[0]
    d = model.encoder.dictionary
    task = TranslationTask(TranslationConfig(), d, d)
    options = dict(export.GENERATION_DEFAULTS, beam=3, max_len_b=8)
    src, lengths = mixed_length_batch()
    want, got = (export.script_translator(model, task, options, {}, beam_attention=b)(src, lengths)
                 for b in (True, False))
    # the caller's model is left as it was (the export works on a copy)
    assert arch != "transformer" or not isinstance(model.decoder, BeamAttentionOption)
    for w, g in zip(want, got):
        for hyp_w, hyp_g in zip(w, g):
            assert hyp_w["tokens"].tolist() == hyp_g["tokens"].tolist()
            assert torch.equal(hyp_w["positional_scores"], hyp_g["positional_scores"])
            assert hyp_w["attention"].numel() > 0 and hyp_g["attention"].numel() == 0


def test_scripted_model_with_other_head_counts_per_layer_gives_the_eager_hypotheses():
    """Heads cut out to a different count in every layer (encoder self-attention 1 / 2 / 0 heads, encoder-decoder
    1 / 2): each CountAwareAttention shape compiles to a type of its own, and every one must get the memory's log
    counts (a trained composed checkpoint once decoded differently from fairseq-generate when only the first
    compiled shape got them)."""
    from fairseq_sparse.modules.head_gates import prune_heads

    model, _ = build_l0drop_model("--l0drop-between-layers", "--decoder-layers", "2")
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for gate in [model.encoder.l0drop] + list(model.encoder.layer_l0drops):
            gate.log_alpha_proj.weight.copy_(torch.randn(gate.log_alpha_proj.weight.shape, generator=g))
            gate.log_alpha_proj.bias.fill_(-3.0)
        if model.encoder.merge is not None and model.encoder.merge.score is not None:
            model.encoder.merge.score.weight.copy_(torch.randn(model.encoder.merge.score.weight.shape, generator=g))
    prune_heads(model, {("enc", 0): [0], ("enc", 2): [], ("encdec", 0): [1]})
    d = model.encoder.dictionary
    task = TranslationTask(TranslationConfig(), d, d)
    options = dict(export.GENERATION_DEFAULTS, beam=3, max_len_b=8)
    scripted = export.script_translator(model, task, options, {})
    src, lengths = mixed_length_batch()
    with torch.no_grad():
        want = export.build_generator(model, task.target_dictionary, options)(
            {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        full = model.encoder.forward_torchscript({"src_tokens": src, "src_lengths": lengths})
    assert bool((full["l0drop_log_count"][0] > 0).any())  # some counted dummies: the counts matter
    got = scripted(src, lengths)
    for w, s in zip(want, got):
        for hyp_w, hyp_s in zip(w, s):
            assert hyp_w["tokens"].tolist() == hyp_s["tokens"].tolist()
            assert abs(float(hyp_w["score"]) - float(hyp_s["score"])) < 1e-4
