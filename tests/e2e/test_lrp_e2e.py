"""LRP head relevance (Voita et al. 2019 Sec. 4): the alpha-beta rule against closed forms, relevance
conservation through a trained model, the refusal of models whose forward pass it does not re-compute, and
fairseq-sparse-head-analysis --lrp end to end.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_lrp.py."""
import json
import os

import pytest
import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.analysis import lrp


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
