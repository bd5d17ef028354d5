"""LRP head relevance (Voita et al. 2019 Sec. 4): the alpha-beta rule against closed forms, relevance
conservation through a trained model, the refusal of models whose forward pass it does not re-compute, and
fairseq-sparse-head-analysis --lrp end to end."""
import json
import os

import pytest
import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.analysis import lrp


def test_alpha_beta_rule_closed_form():
    """y = w1 x1 + w2 x2 + b with impacts z_i = w_i x_i + b/2; alpha = beta = 1/2 normalise each sign."""
    x, w, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]]), torch.tensor([0.5])
    r = lrp.relprop_linear(x, w, b, torch.tensor([[2.0]]))
    z = torch.tensor([3.0 + 0.25, -2.0 + 0.25])  # 3.25 (positive), -1.75 (negative)
    expected = 2.0 * torch.tensor([0.5 * 3.25 / (3.25 + lrp.EPS), 0.5 * -1.75 / (-1.75 - lrp.EPS)])
    expected = expected * 2.0 / expected.abs().sum()  # rescaled: total |R| conserved
    assert torch.allclose(r, expected[None], atol=1e-6)
    a, c = lrp.relprop_add(torch.tensor([[1.0, -1.0]]), torch.tensor([[3.0, 1.0]]), torch.tensor([[1.0, 1.0]]))
    # element 0: both positive: 1/4 and 3/4 of alpha; element 1: -1 and 1 split by sign
    raw_a, raw_c = torch.tensor([0.5 * 0.25, 0.5]), torch.tensor([0.5 * 0.75, 0.5])
    scale = 2.0 / (raw_a.abs().sum() + raw_c.abs().sum())
    assert torch.allclose(a[0], raw_a * scale, atol=1e-4) and torch.allclose(c[0], raw_c * scale, atol=1e-4)


@pytest.mark.parametrize("rule", ["linear", "layer_norm", "relu", "values"])
def test_every_rule_conserves_relevance(rule):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=g)
    r_out = torch.randn(5, 8, generator=g)
    if rule == "linear":
        r = lrp.relprop_linear(x, torch.randn(8, 8, generator=g), torch.randn(8, generator=g), r_out)
    elif rule == "layer_norm":
        norm = torch.nn.LayerNorm(8)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_()
        r = lrp.relprop_layer_norm(x, norm, r_out)
    elif rule == "relu":
        r = lrp.relprop_relu(x, r_out)
    else:
        weights = torch.softmax(torch.randn(2, 5, 3, generator=g), -1)
        r = lrp.relprop_weighted_values(weights, torch.randn(3, 2, 4, generator=g), r_out.view(5, 2, 4))
    assert float(r.abs().sum()) == pytest.approx(float(r_out.abs().sum()), rel=1e-5)


@pytest.fixture(scope="module")
def stock(stock_transformer_ckpt, corpus):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([stock_transformer_ckpt],
                                                                    arg_overrides={"data": corpus["bin"]})
    task.load_dataset("test")
    return models[0].eval(), task


def sentence(task, i):
    ds = task.dataset("test")
    eos = task.target_dictionary.eos()
    return ds[i]["source"], torch.cat([torch.tensor([eos]), ds[i]["target"][:-1]])


def test_forward_is_recomputed_and_relevance_conserved(stock, monkeypatch):
    """The recorded forward pass gives the model's logits; with the z+ rule (alpha 1, beta 0) every relevance
    stays non-negative, so the relevance reaching the two input embeddings is all of it (T, one per target
    position); with alpha = beta = 1/2 the heads' shares are finite and sum to 1 per layer."""
    model, task = stock
    src, prev = sentence(task, 3)
    with torch.no_grad():
        record = lrp.record_forward(model, src, prev)
        ref = model(src[None], torch.tensor([src.numel()]), prev[None])[0][0]
    assert torch.allclose(record["logits"], ref, atol=1e-4)
    monkeypatch.setattr(lrp, "ALPHA", 1.0)
    monkeypatch.setattr(lrp, "BETA", 0.0)
    with torch.no_grad():
        out = lrp.propagate(model, record)
    assert (out["input"] >= -1e-6).all() and (out["decoder_input"] >= -1e-6).all()
    total = float(out["input"].sum() + out["decoder_input"].sum())
    assert total == pytest.approx(prev.numel(), rel=1e-3)
    assert all((h >= -1e-6).all() and float(h.sum()) > 0 for h in out["heads"])
    monkeypatch.undo()
    stats = lrp.head_relevance(model, [sentence(task, i) for i in range(5)])
    assert stats.sentences == 5
    for layer in stats.mean():
        assert len(layer) == 4 and sum(layer) == pytest.approx(1.0, abs=1e-5)


def test_unsupported_models_are_refused(l0drop_ckpt, corpus):
    from fairseq import checkpoint_utils

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([l0drop_ckpt], arg_overrides={"data": corpus["bin"]})
    with pytest.raises(lrp.UnsupportedModel, match="gated"):
        lrp.check_supported(models[0])


def test_head_analysis_with_lrp(stock_transformer_ckpt, l0drop_ckpt, corpus, tmp_path):
    from conftest import USER_DIR, console, run

    out = tmp_path / "heads"
    proc = run([console("fairseq-sparse-head-analysis"), corpus["bin"], "--user-dir", USER_DIR, "--path",
                stock_transformer_ckpt, "--output-dir", str(out), "--max-sentences", "40", "--lrp", "--lrp-sentences",
                "10", "--cpu", "--no-progress-bar"])
    assert "LRP on 10 sentences" in proc.stdout and "most relevant head" in proc.stdout
    result = json.loads((out / "heads.json").read_text())
    assert result["lrp"]["sentences"] == 10 and len(result["lrp"]["layers"]) == 2
    for layer in range(2):
        assert sum(h["lrp"] for h in result["heads"] if h["layer"] == layer) == pytest.approx(1.0, abs=1e-4)
    assert "lrp" in (out / "heads.tsv").read_text().splitlines()[0].split("\t")
    assert os.path.getsize(out / "lrp.png") > 0
    bad = run([console("fairseq-sparse-head-analysis"), corpus["bin"], "--user-dir", USER_DIR, "--path", l0drop_ckpt,
               "--output-dir", str(tmp_path / "bad"), "--lrp", "--cpu"], check=False)
    assert bad.returncode == 2 and "--lrp cannot read" in bad.stderr and "gated" in bad.stderr
    assert not (tmp_path / "bad").exists()
