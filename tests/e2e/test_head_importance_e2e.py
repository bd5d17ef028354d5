"""Head importance, ablation and pruning curves (paper 003, Michel et al. 2019): the library
(fairseq_sparse.analysis.head_importance) on a real loaded checkpoint, and the console tool fairseq-sparse-head-importance.

Checks: dL/dxi_h from autograd equals a central finite difference (batch and per-sentence masks); the
per-sentence estimate is independent of the batch size; per-layer l2 normalisation; masking none
leaves the model as it is and masking a head changes it; the pruning order and 10% step counts; the
console script end to end (files, curve at 0% = the unmasked model's BLEU, a usable written mask);
and clear errors without output files on bad input.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_head_importance.py.
"""
import argparse
import copy
import json
import os

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the plugin, allowlists fairseq checkpoint classes)
from conftest import console, run
from fairseq_sparse.analysis import head_importance as hi
from fairseq_sparse.cli import head_importance as cli
from fairseq_sparse.modules.head_gates import check_head_mask, masks_from_matrix, set_head_masks

# tiny, fast evaluation settings shared by the in-process reference and the console runs
EVAL = ["--max-sentences", "20", "--beam", "2", "--batch-size", "32", "--sacrebleu-tokenize", "none"]


@pytest.fixture(scope="module")
def loaded(corpus, stock_transformer_ckpt):
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [stock_transformer_ckpt], arg_overrides={"data": corpus["bin"]})
    for split in ("valid", "test"):
        task.load_dataset(split, task_cfg=cfg.task)
    return models[0].eval(), task


def _fresh(loaded):
    model, task = loaded
    return copy.deepcopy(model).eval(), task


def _batch(task, split, ids):
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in ids])


# ----------------------------------------------------------------------------------------------
# (a) importance = |dL/dxi|: autograd vs finite differences


def _nll64(model, sample):
    """hi.sentence_nll in float64 throughout (fairseq's get_normalized_probs computes in float32)."""
    logits = model(**sample["net_input"])[0].double()
    target = sample["target"]
    nll = -logits.log_softmax(-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return nll.masked_fill(target.eq(model.decoder.dictionary.pad()), 0.0).sum(-1)


def _loss_at(model, sample, key, head, value, layout, sentence=None):
    masks = {k: torch.ones(n, dtype=torch.float64) for k, n in layout.items()}
    masks[key][head] = value
    set_head_masks(model, masks)
    with torch.no_grad():
        losses = _nll64(model, sample)
    set_head_masks(model, None)
    return float(losses.sum() if sentence is None else losses[sentence])


def test_mask_gradient_equals_finite_difference(loaded, monkeypatch):
    import fairseq.utils
    import torch.nn.functional as F

    # float64 throughout, so that a central difference is accurate to ~1e-8: fairseq's attention
    # computes its softmax in float32 (utils.softmax casts), which would limit it to ~1e-2
    monkeypatch.setattr(fairseq.utils, "softmax", lambda x, dim, onnx_trace=False: F.softmax(x, dim=dim))
    model, task = _fresh(loaded)
    model.double()
    sample = _batch(task, "valid", [0, 1, 2, 3])
    layout = hi.head_layout(model)
    g_batch, losses = hi.mask_gradients(model, sample, _nll64, per_sentence=False)
    g_sent, _ = hi.mask_gradients(model, sample, _nll64, per_sentence=True)
    torch.testing.assert_close(losses, hi.sentence_nll(model, sample).detach().double(), rtol=1e-5, atol=1e-4)
    eps = 1e-5
    for key, n in layout.items():
        assert g_batch[key].shape == (n,) and g_sent[key].shape == (4, n)
        # per-sentence gradients add up to the batch gradient
        torch.testing.assert_close(g_sent[key].sum(0), g_batch[key], rtol=1e-7, atol=1e-9)
        for h in range(n):
            fd = (_loss_at(model, sample, key, h, 1 + eps, layout) - _loss_at(model, sample, key, h, 1 - eps, layout)) / (2 * eps)
            assert abs(float(g_batch[key][h]) - fd) <= 1e-5 * max(1.0, abs(fd)), (key, h, float(g_batch[key][h]), fd)
    # one sentence's own gradient (row b) is the derivative of that sentence's loss
    key, h, b = ("encdec", 1), 2, 3
    fd = (_loss_at(model, sample, key, h, 1 + eps, layout, b) - _loss_at(model, sample, key, h, 1 - eps, layout, b)) / (2 * eps)
    assert abs(float(g_sent[key][b, h]) - fd) <= 1e-5 * max(1.0, abs(fd))
    # the gradients are not trivially zero (the test could not fail otherwise)
    assert max(float(g.abs().max()) for g in g_batch.values()) > 1e-2
    # nothing left behind: no masks, no parameter gradients, parameters trainable again
    assert all(getattr(m, "head_mask", None) is None for m in hi.attention_modules(model).values())
    assert all(p.grad is None and p.requires_grad for p in model.parameters())


def test_importance_is_mean_abs_per_sentence_gradient(loaded):
    model, task = _fresh(loaded)
    ids = list(range(8))
    one_by_one = [_batch(task, "valid", [i]) for i in ids]
    in_fours = [_batch(task, "valid", ids[:4]), _batch(task, "valid", ids[4:])]
    exact_b1, info1 = hi.head_importance(model, one_by_one, per_sentence=False, normalise=False)
    exact_b4, info4 = hi.head_importance(model, in_fours, per_sentence=True, normalise=False)
    approx_b4, _ = hi.head_importance(model, in_fours, per_sentence=False, normalise=False)
    assert info1["sentences"] == info4["sentences"] == 8 and info4["batches"] == 2
    # by hand: mean over sentences of |dL(x)/dxi_h|
    by_hand = {k: torch.zeros(n) for k, n in hi.head_layout(model).items()}
    for s in one_by_one:
        g, _ = hi.mask_gradients(model, s, per_sentence=False)
        for k in g:
            by_hand[k] += g[k].abs() / 8
    for k in by_hand:
        torch.testing.assert_close(exact_b1[k], by_hand[k], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(exact_b4[k], by_hand[k], rtol=1e-4, atol=1e-6)  # exact at any batch size
        assert bool((approx_b4[k] <= exact_b4[k] + 1e-5).all())  # |sum| <= sum |.|
    assert any(bool((approx_b4[k] < exact_b4[k] - 1e-4).any()) for k in by_hand)  # and really an approximation


# ----------------------------------------------------------------------------------------------
# (b) per-layer l2 normalisation


def test_normalise_by_layer_gives_unit_rows(loaded):
    model, task = _fresh(loaded)
    imp, info = hi.head_importance(model, [_batch(task, "valid", list(range(6)))], normalise=True)
    for k, v in imp.items():
        assert abs(float(v.norm()) - 1.0) < 1e-5, k
        raw = info["raw"][k]
        torch.testing.assert_close(v, raw / raw.norm())
    pure = hi.normalise_by_layer({("enc", 0): torch.tensor([3.0, 4.0]), ("dec", 0): torch.zeros(2),
                                  ("encdec", 0): torch.zeros(0)})
    torch.testing.assert_close(pure[("enc", 0)], torch.tensor([0.6, 0.8]))
    assert pure[("dec", 0)].tolist() == [0.0, 0.0] and pure[("encdec", 0)].numel() == 0


# ----------------------------------------------------------------------------------------------
# (c) masks change the model exactly as intended


def test_masking_none_is_the_model_and_masking_a_head_changes_it(loaded):
    model, task = _fresh(loaded)
    reference = copy.deepcopy(model)  # never masked: fairseq's own (fast) attention path
    sample = _batch(task, "test", list(range(6)))
    layout = hi.head_layout(model)

    def out(m):
        with torch.no_grad():
            return m(**sample["net_input"])[0]

    base = out(reference)
    set_head_masks(model, hi.full_masks(layout))
    ones = out(model)
    set_head_masks(model, None)
    cleared = out(model)
    assert torch.equal(ones, cleared)  # xi = 1 is exactly no mask
    torch.testing.assert_close(ones, base, rtol=0, atol=1e-5)  # only fast vs slow attention path rounding
    for key in [("enc", 1), ("dec", 0), ("encdec", 1)]:
        set_head_masks(model, hi.masks_without(layout, [(key, 2)]))
        assert float((out(model) - base).abs().max()) > 1e-3, key
    # a mask of the wrong shape is refused
    with pytest.raises(ValueError, match="heads"):
        check_head_mask({"enc": [[1, 1, 1], [1, 1, 1, 1]]}, layout)
    set_head_masks(model, None)


# ----------------------------------------------------------------------------------------------
# (e) the console tool end to end


def _reference_bleu(loaded, n=20, beam=2):
    model, task = _fresh(loaded)
    gen = argparse.Namespace(beam=beam, lenpen=1.0, max_len_a=0, max_len_b=200)
    ev = hi.BleuEvaluator(model, task, "test", list(range(n)), gen, batch_size=32, tokenize="none")
    return ev.evaluate(None)["bleu"], ev  # no mask ever set on this model


def test_prune_curve_console_end_to_end(corpus, stock_transformer_ckpt, loaded, tmp_path):
    out, mask = tmp_path / "out", tmp_path / "mask.json"
    run([console("fairseq-sparse-head-importance"), "prune-curve", corpus["bin"], "--path", stock_transformer_ckpt,
         "--output-dir", str(out), "--importance-max-sentences", "24", "--modes", "all", "encdec",
         "--write-mask", str(mask), "--prune-fraction", "0.5", "--no-progress-bar"] + EVAL, console=True)
    for f in ["curve.tsv", "curve.json", "curve.png", "importance.tsv", "importance.json",
              "importance_enc.png", "importance_dec.png", "importance_encdec.png"]:
        assert (out / f).stat().st_size > 0, f
    curve = json.loads((out / "curve.json").read_text())
    bleu0, ev = _reference_bleu(loaded)
    by_mode = {c["mode"]: c["rows"] for c in curve["curves"]}
    assert set(by_mode) == {"all", "encdec"}
    assert [r["n_target"] for r in by_mode["all"]] == [0, 2, 5, 7, 10, 12, 14, 17, 19, 22, 24]
    assert [r["n_target"] for r in by_mode["encdec"]] == [0, 1, 2, 2, 3, 4, 5, 6, 6, 7, 8]
    for rows in by_mode.values():
        assert rows[0]["fraction"] == 0 and rows[0]["bleu"] == pytest.approx(bleu0, abs=1e-9)
        assert rows[-1]["fraction"] == 1 and rows[-1]["n_pruned"] == rows[-1]["n_total"]
    assert bleu0 > 1.0 and by_mode["all"][-1]["bleu"] < bleu0  # the model translates; no heads, no translation
    tsv = (out / "curve.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:4] == ["checkpoint", "mode", "order", "fraction"] and len(tsv) == 1 + 22

    # the written mask: 12 of 24 heads, exactly the 12 least important ones of importance.json
    imp = json.loads((out / "importance.json").read_text())
    matrix = json.loads(mask.read_text())
    model, task = _fresh(loaded)
    masks = masks_from_matrix(model, matrix)
    set_head_masks(model, masks)
    set_head_masks(model, None)
    flat = [(imp["importance"][t][l][h], (t, l, h)) for t in imp["importance"]
            for l in range(len(imp["importance"][t])) for h in range(len(imp["importance"][t][l]))]
    lowest = {x[1] for x in sorted(flat)[:12]}
    zeros = {(t, l, h) for t in matrix for l, row in enumerate(matrix[t]) for h, v in enumerate(row) if v == 0}
    assert zeros == lowest
    # the mask's BLEU (evaluate command, in process) is the curve's 50% point
    res = cli.main(["evaluate", corpus["bin"], "--path", stock_transformer_ckpt, "--head-mask", str(mask),
                    "--output-dir", str(tmp_path / "ev")] + EVAL)
    assert res["heads_masked"] == 12
    assert res["bleu"] == pytest.approx(by_mode["all"][5]["bleu"], abs=1e-9)
    assert len((tmp_path / "ev" / "hypotheses.txt").read_text().splitlines()) == 20


def test_ablate_and_keep_one(corpus, stock_transformer_ckpt, loaded, tmp_path):
    bleu0, ev = _reference_bleu(loaded)
    common = [corpus["bin"], "--path", stock_transformer_ckpt, "--types", "encdec", "--bootstrap-samples", "200"] + EVAL
    res = cli.main(["ablate"] + common + ["--output-dir", str(tmp_path / "abl")])
    assert res["base"] == pytest.approx(bleu0, abs=1e-9)
    assert len(res["rows"]) == 8
    for r in res["rows"]:
        assert r["delta"] == pytest.approx(r["bleu"] - bleu0) and 0 < r["p_value"] <= 1
        assert r["significant"] == (r["p_value"] < 0.01)
    assert any(abs(r["delta"]) > 0 for r in res["rows"])
    # one row, by hand: masking head 1 of encdec layer 0
    layout = hi.head_layout(ev.model)
    assert res["rows"][1]["bleu"] == pytest.approx(ev.evaluate(hi.masks_without(layout, [(("encdec", 0), 1)]))["bleu"])
    for f in ["ablation.tsv", "ablation.json", "ablation_encdec.png"]:
        assert (tmp_path / "abl" / f).stat().st_size > 0
    assert not (tmp_path / "abl" / "ablation_enc.png").exists()

    res = cli.main(["keep-one"] + common + ["--output-dir", str(tmp_path / "k1")])
    assert [(r["type"], r["layer"]) for r in res["rows"]] == [("encdec", 0), ("encdec", 1)]
    for r in res["rows"]:
        tried = r["bleu_per_kept_head"]
        assert len(tried) == 4 and r["bleu"] == max(tried.values()) and r["delta"] == pytest.approx(r["bleu"] - bleu0)
        keep = hi.masks_without(layout, [(("encdec", r["layer"]), h) for h in range(4) if h != r["kept_head"]])
        assert r["bleu"] == pytest.approx(ev.evaluate(keep)["bleu"])
    for f in ["keep_one.tsv", "keep_one.json", "keep_one.png"]:
        assert (tmp_path / "k1" / f).stat().st_size > 0


# ----------------------------------------------------------------------------------------------
# (f) bad input: a clear error before any work, no output files


@pytest.mark.parametrize("case", ["missing_ckpt", "fraction", "unknown_type_arg", "mask_shape", "mask_type",
                                  "unreachable", "step"])
def test_bad_input_errors(case, corpus, stock_transformer_ckpt, tmp_path, capsys):
    out, mask = tmp_path / "out", tmp_path / "m.json"
    base = [corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(out)]
    argv, expect = {
        "missing_ckpt": (["importance", corpus["bin"], "--path", str(tmp_path / "nope.pt"), "--output-dir", str(out)],
                         "checkpoint not found"),
        "fraction": (["importance"] + base + ["--write-mask", str(mask), "--prune-fraction", "1.5"],
                     "--prune-fraction must be in [0, 1]"),
        "unknown_type_arg": (["ablate"] + base + ["--types", "cross"], "invalid choice: 'cross'"),
        "mask_shape": (["evaluate"] + base + ["--head-mask", str(tmp_path / "bad.json")],
                       "has 3 values, the layer has 4 heads"),
        "mask_type": (["evaluate"] + base + ["--head-mask", str(tmp_path / "bad2.json")], "unknown attention type"),
        "unreachable": (["prune-curve"] + base + ["--write-mask", str(mask), "--prune-fraction", "0.9",
                                                  "--min-heads-per-layer", "1"], "only 18 can be masked"),
        "step": (["prune-curve"] + base + ["--step", "0"], "--step must be in (0, 1]"),
    }[case]
    (tmp_path / "bad.json").write_text(json.dumps({"dec": [[1, 1, 1, 1], [1, 0, 1]]}))
    (tmp_path / "bad2.json").write_text(json.dumps({"cross": [[1, 1, 1, 1], [1, 1, 1, 1]]}))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert expect in capsys.readouterr().err
    assert not out.exists() and not mask.exists()


@pytest.mark.parametrize("mask", [{"enc": [[2, -1, 1, 1], [1, 1, 1, 1]]}, {"enc": [[float("nan"), 1, 1, 1], [1, 1, 1, 1]]},
                                  {"enc": [[1, 1, 1, 1], "1111"]}, {"dec": [[1, 1, 1, {"x": 1}], [1, 1, 1, 1]]}])
def test_heads_evaluate_refuses_bad_mask_values(mask, corpus, stock_transformer_ckpt, tmp_path, capsys, monkeypatch):
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(mask))
    monkeypatch.setattr(cli, "Session", None)  # refused before anything is loaded
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", corpus["bin"], "--path", stock_transformer_ckpt, "--head-mask", str(path),
                  "--output-dir", str(tmp_path / "out")] + EVAL)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--head-mask: head mask {path}: head mask for " in err and ("number in [0, 1]" in err or "must be a list" in err)
    assert not (tmp_path / "out").exists()


def test_existing_outputs_are_refused_without_overwrite(corpus, stock_transformer_ckpt, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "importance.tsv").write_text("old\n")
    (tmp_path / "mask.json").write_text("old\n")
    base = ["importance", corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir", str(out)]
    monkeypatch.setattr(cli, "Session", None)  # refused before anything is loaded
    for argv, expect in [(base, f"{out / 'importance.tsv'} exists; pass --overwrite"),
                         (["importance", corpus["bin"], "--path", stock_transformer_ckpt, "--output-dir",
                           str(tmp_path / "new"), "--write-mask", str(tmp_path / "mask.json"), "--prune-fraction", "0.5"],
                          "--write-mask: " + str(tmp_path / "mask.json") + " exists"),
                         (base + ["--overwrite", "--write-mask", stock_transformer_ckpt, "--prune-fraction", "0.5"],
                          "is an input of this command")]:
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2 and expect in capsys.readouterr().err
    assert (out / "importance.tsv").read_text() == "old\n" and (tmp_path / "mask.json").read_text() == "old\n"
    assert sorted(os.listdir(out)) == ["importance.tsv"] and not (tmp_path / "new").exists()


def test_prune_curve_checks_every_checkpoint_first(corpus, stock_transformer_ckpt, tmp_path, capsys, monkeypatch):
    good, broken = tmp_path / "a.pt", tmp_path / "broken.pt"
    data = open(stock_transformer_ckpt, "rb").read()
    good.write_bytes(data)
    broken.write_bytes(data[: len(data) // 2])  # truncated, e.g. by a full disk
    monkeypatch.setattr(cli, "Session", None)  # refused before the first checkpoint is loaded
    with pytest.raises(SystemExit) as e:
        cli.main(["prune-curve", corpus["bin"], "--checkpoints", str(good), str(broken), "--output-dir",
                  str(tmp_path / "out")] + EVAL)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--checkpoints: cannot read {broken}" in err and "truncated or corrupt" in err
    assert not (tmp_path / "out").exists()
