"""The coverage model on the encoder-decoder attention (Zhang, Zhao, Li & Zong 2019 Sec. V, Eqs. 21-22):
the recurrence by hand, incremental == full-sequence (forced) decoding with beam search, exact pruned
decoding over L0Drop's compressed memory, options, and fairseq-train with --attention-reg entropy.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_coverage_attention.py."""
import copy
import math

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the models)
from conftest import TINY_MODEL, USER_DIR, console, fairseq_train, run
from helpers.cli import IN_PROCESS_LOADER
from fairseq_sparse.models.transformer_head_gates import HeadGatesTransformerModel
from fairseq_sparse.analysis.sparsity_curve import read_state
from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel
from fairseq_sparse.modules.coverage_attention import CoverageAttention
from helpers.checkpoints import drop_fraction, load, pruned_vs_unpruned, sparsity
from helpers.models import rescore
from helpers.normalisers import batch, generate


def coverage_model(ckpt, corpus, arch="transformer_head_gates", seed=0):
    """The stock checkpoint's weights in ``arch`` with --encdec-attention-coverage and random coverage weights
    (w != 0, so the coverage changes the attention)."""
    stock, cfg, task = load(ckpt, corpus["bin"])
    args = copy.deepcopy(cfg.model)
    args.arch = args._name = arch
    args.head_gates = ""
    args.encdec_attention_coverage = True
    args.encdec_coverage_dim = 4
    cls = HeadGatesTransformerModel if arch == "transformer_head_gates" else L0DropTransformerModel
    model = cls.build_model(args, task)
    missing, unexpected = model.load_state_dict(stock.state_dict(), strict=False)
    assert not unexpected and all("coverage" in k or "l0drop" in k for k in missing)
    torch.manual_seed(seed)
    with torch.no_grad():
        for layer in model.decoder.layers:
            assert isinstance(layer.encoder_attn, CoverageAttention)
            layer.encoder_attn.coverage.logit.weight.normal_(0.0, 2.0)
            layer.encoder_attn.coverage.from_weights.weight.normal_(0.0, 1.0)
    return model.eval(), task


@pytest.mark.parametrize("arch", ["transformer_head_gates", "transformer_l0drop"])
def test_beam_search_equals_forced_decoding(stock_transformer_ckpt, corpus, arch):
    """Beam 4 in fairseq's SequenceGenerator (incremental, cached coverage reordered with the beams; the
    L0Drop model shares one memory per sentence) scores each hypothesis as a full-sequence pass does."""
    model, task = coverage_model(stock_transformer_ckpt, corpus, arch)
    sample = batch(task)
    hypos = generate(model, task, sample, beam=4)
    assert len({len(h[0]["tokens"]) for h in hypos}) > 1  # sentences finish at different steps
    eos = task.target_dictionary.eos()
    for forced, step in rescore(model, sample, hypos, eos):
        assert torch.allclose(forced, step, atol=1e-4), (forced - step).abs().max()
    # and the coverage does change the translation model
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.encoder_attn.coverage.logit.weight.zero_()
    assert any(not torch.allclose(forced, step, atol=1e-3) for forced, step in rescore(model, sample, hypos, eos))


@pytest.mark.parametrize("dropped_as", ["zero", "mask"])
def test_pruned_decoding_with_coverage_is_exact(stock_transformer_ckpt, corpus, dropped_as):
    """Over the compressed memory, the counted dummy tracks one pruned state's coverage: same hypotheses."""
    model, task = coverage_model(stock_transformer_ckpt, corpus, "transformer_l0drop")
    sample = batch(task, 12)
    drop_fraction(model, model.encoder.l0drop, sample, 0.4)
    assert 0.2 < sparsity(model, sample) < 0.6
    for beam in (1, 4):
        pruned_vs_unpruned(model, task, sample, beam, dropped_as)


def test_train_with_entropy_and_generate(corpus, stock_transformer_ckpt, tmp_path):
    """NMT+Cov+Ent: fairseq-train fine-tunes a stock checkpoint with coverage and the entropy regulariser
    (the penalty and the entropy are logged); fairseq-generate decodes every test sentence."""
    save = str(tmp_path / "cov")
    proc = fairseq_train(corpus["bin"], save, [
        "--arch", "transformer_head_gates", "--head-gates", "", "--encdec-attention-coverage",
        "--criterion", "label_smoothed_cross_entropy_with_sparsity", "--label-smoothing", "0.1",
        "--attention-reg", "entropy", "--attention-reg-lambda", "0.1",
        "--finetune-from-model", stock_transformer_ckpt, "--log-format", "json", "--log-interval", "5",
    ] + TINY_MODEL, max_update=10)
    log = proc.stdout + proc.stderr
    assert "attn_entropy" in log
    ckpt = read_state(f"{save}/checkpoint_last.pt")  # torch's safe loader (the plugin allowlists fairseq's classes)
    w = ckpt["model"]["decoder.layers.0.encoder_attn.coverage.logit.weight"]
    assert w.abs().sum() > 0  # the coverage weight moved away from 0
    out = run([console("fairseq-generate"), corpus["bin"], "--user-dir", USER_DIR, "--path",
               f"{save}/checkpoint_last.pt", "--beam", "4", "--batch-size", "16", "--cpu", "--gen-subset",
               "test"] + IN_PROCESS_LOADER).stdout
    assert sum(line.startswith("H-") for line in out.splitlines()) == 60
    assert not math.isnan(float(out.strip().splitlines()[-1].split("BLEU4 = ")[1].split(",")[0]))
