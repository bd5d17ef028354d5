"""Methods trained from scratch beside the baseline (the *_scratch rows, --scratch-budget-points, the held-back
pressure), --train-fraction, and the gap analysis's pure functions (closed forms on hand-made sentences)."""
import pytest

from fairseq_sparse.analysis import gap
from fairseq_sparse.recipe import commands, methods
from fairseq_sparse.recipe.option_checks import parse_args
from fairseq_sparse.recipe.options import get_parser


def options(*extra):
    return get_parser().parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w"] + list(extra))


def value(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_a_pattern_from_scratch_is_the_baseline_command_plus_its_rule():
    a = options("--baseline-updates", "3400", "--baseline-patience", "0")
    base = commands.train_from_scratch(a, "bin", methods.BY_NAME["baseline"])
    freq = commands.train_from_scratch(a, "bin", methods.BY_NAME["pattern_freq_scratch"])
    assert freq[-4:] == ["--encoder-output-pattern", "freq", "--encoder-output-pattern-rate", "0.5"]
    differ = [(x, y) for x, y in zip(base, freq[:len(base)]) if x != y]
    assert differ == [("transformer", "transformer_l0drop"), ("baseline", "pattern_freq_scratch")]
    assert len(freq) == len(base) + 4
    m = methods.BY_NAME["pattern_freq_scratch"]
    assert m.start is None and m.control == "baseline" and m.opt_in and m.decoding == "last"


def test_a_gated_method_from_scratch_holds_its_pressure_back_then_ramps_it_in():
    a = options("--baseline-updates", "3000")
    cmd = commands.train_from_scratch(a, "bin", methods.BY_NAME["l0drop_scratch"])
    assert value(cmd, "--criterion") == "label_smoothed_cross_entropy_with_sparsity"
    assert value(cmd, "--optimizer") == "adam_sparsity" and value(cmd, "--lr-scheduler") == "inverse_sqrt"
    assert value(cmd, "--sparsity-start-update") == "1000"  # a third of the budget by default
    assert value(cmd, "--sparsity-target-warmup-updates") == "1000"
    assert "--finetune-from-model" not in cmd
    a = options("--baseline-updates", "3000", "--scratch-pressure-start", "1500", "--scratch-pressure-ramp", "300",
                "--l0drop-lambda", "0.3")
    cmd = commands.train_from_scratch(a, "bin", methods.BY_NAME["l0drop_scratch"])
    assert value(cmd, "--sparsity-start-update") == "1500" and value(cmd, "--sparsity-warmup-updates") == "300"
    heads = commands.train_from_scratch(a, "bin", methods.BY_NAME["heads_all_scratch"])
    assert value(heads, "--head-gates") == "enc,dec,encdec" and value(heads, "--sparsity-start-update") == "1500"
    assert methods.BY_NAME["heads_all_scratch"].decoding == "heads_pruned"


def test_scratch_budget_points_keep_a_checkpoint_at_each():
    a = options("--scratch-budget-points", "1700,3400", "--baseline-updates", "3400")
    cmd = commands.train_from_scratch(a, "bin", methods.BY_NAME["baseline"])
    assert value(cmd, "--save-interval-updates") == "1700" and value(cmd, "--keep-interval-updates") == "-1"
    a = options("--scratch-budget-points", "1000,3000", "--validate-interval-updates", "400")
    cmd = commands.train_from_scratch(a, "bin", methods.BY_NAME["baseline"])
    assert cmd.count("--save-interval-updates") == 1 and value(cmd, "--save-interval-updates") == "200"
    assert "--save-interval-updates" not in commands.train_from_scratch(options(), "bin", methods.BY_NAME["baseline"])


@pytest.mark.parametrize("extra, message", [
    (["--steps", "pattern_freq_scratch"], "--baseline-patience 0"),
    (["--steps", "l0drop_scratch", "--baseline-patience", "0", "--baseline-minutes", "3"], "--baseline-patience 0"),
    (["--scratch-budget-points", "100,50"], "--scratch-budget-points must rise"),
    (["--scratch-budget-points", "100,9999"], "at most --baseline-updates"),
    (["--scratch-budget-points", "1x"], "comma list"),
    (["--scratch-pressure-start", "-1"], "must not be negative"),
    (["--baseline-updates", "100", "--scratch-pressure-start", "100"], "would never feel its sparsity pressure"),
    (["--train-fraction", "0"], "--train-fraction must lie in (0, 1]"),
    (["--train-fraction", "nan"], "--train-fraction must lie in (0, 1]"),
])
def test_bad_scratch_and_data_size_options_are_refused_in_one_line(tmp_path, capsys, extra, message):
    corpus = tmp_path / "c"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("a b\n")
    with pytest.raises(SystemExit):
        parse_args(["--corpus", str(corpus), "-s", "en", "-t", "de", "--work-dir", str(tmp_path / "w")] + extra)
    assert message in capsys.readouterr().err


def test_length_buckets_and_source_words():
    assert [gap.length_bucket(n) for n in (1, 10, 11, 20, 21, 40, 41)] == [
        "1-10", "1-10", "11-20", "11-20", "21-40", "21-40", "41+"]
    words = gap.source_words(["lib@@", "foo", "is", "a", "to@@", "ol"], [True, False, True, False, True, True])
    assert words == [("libfoo", "partly"), ("is", "pruned"), ("a", "kept"), ("tool", "pruned")]
    assert gap.source_words(["a@@", "b"]) == [("ab", None)]


def test_copy_recall_counts_copied_reference_words_by_what_happened_to_their_source():
    sources = [[("libfoo", "pruned"), ("is", "kept"), ("cool", "kept")], [("xyz", "kept")]]
    refs = ["libfoo ist cool cool", "xyz"]
    hyps = ["ist cool", "xyz xyz"]
    r = gap.copy_recall(sources, refs, hyps, tokenize=str.split)
    # copied words: libfoo (pruned, missed), cool x2 (kept, 1 recalled: clipped), xyz (kept, recalled once)
    assert r["all"] == {"words": 4, "recalled": 2, "recall": 0.5}
    assert r["pruned"] == {"words": 1, "recalled": 0, "recall": 0.0}
    assert r["kept"] == {"words": 3, "recalled": 2, "recall": round(2 / 3, 4)}
    assert list(r) == ["all", "pruned", "kept"] or list(r)[0] == "all"


def test_repeated_ngrams_chrf_and_the_copy_share_buckets():
    from sacrebleu.metrics import CHRF

    # "a b a b a": trigrams aba, bab, aba -> one of three repeats; "x y" has none
    assert gap.repeated_ngrams(["a b a b a", "x y"], tokenize=str.split) == round(1 / 3, 4)
    assert gap.repeated_ngrams(["x y"], tokenize=str.split) is None
    assert gap.repeated_ngrams(["a a a a"], n=1, tokenize=str.split) == 0.75
    hyps, refs = ["das ist gut", "hallo welt"], ["das ist sehr gut", "hallo welt"]
    assert gap.chrf(hyps, refs) == round(CHRF().corpus_score(hyps, [refs]).score, 2)
    words = [("libfoo", "pruned"), ("is", "kept"), ("a", "kept")]
    assert gap.copy_share_bucket(words, "libfoo ist ein Werkzeug", tokenize=str.split) == "up to 25%"
    assert gap.copy_share_bucket(words, "libfoo libfoo", tokenize=str.split) == "over 25%"
    assert gap.copy_share_bucket(words, "nichts davon", tokenize=str.split) == "none"
    assert gap.copy_share_bucket(words, "", tokenize=str.split) == "none"


def test_gap_by_group_and_brevity_are_sacrebleus_numbers():
    from sacrebleu.metrics import BLEU

    refs = ["the cat sat on the mat", "a dog runs in the park today", "hello world"]
    control = ["the cat sat on the mat", "a dog runs in the park", "hello world"]
    method = ["the cat sat on mat", "a dog runs", "hello world"]
    out = gap.by_group(["x", "y", "x"], control, method, refs)
    assert list(out) == ["x", "y"] and out["x"]["sentences"] == 2
    want = BLEU().corpus_score([method[1]], [[refs[1]]])
    assert out["y"]["method"] == round(want.score, 2)
    assert out["y"]["method_ratio"] == round(want.sys_len / want.ref_len, 4)
    assert out["x"]["gap"] == round(out["x"]["method"] - out["x"]["control"], 2)
    b = gap.brevity(method, refs)
    assert b["ratio"] < 1 and 0 < b["bp"] < 1 and b["ref_len"] == 15


def test_no_pressure_before_the_start_update_then_the_ramp_counts_from_it():
    """--sparsity-start-update: no penalty and no controller before it; the lambda's ramp starts there."""
    import torch

    from helpers.criterion import sparsity_criterion
    from helpers.models import build_l0drop_model, mixed_length_batch

    model, _ = build_l0drop_model()
    model.train()
    src, lengths = mixed_length_batch()
    c = sparsity_criterion(None, False, 0.1, l0drop_lambda=0.4, sparsity_warmup_updates=100, sparsity_start_update=500)

    def penalty_at(updates):
        model.set_num_updates(updates)
        model.encoder(src, src_lengths=lengths)
        penalty, log = c.compute_sparsity_loss(model)
        return float(penalty), log

    before, log = penalty_at(499)
    assert before == 0.0 and log["sparsity/l0drop_lambda"] == 0.0 and "sparsity/l0drop_penalty" in log
    half, log = penalty_at(550)
    assert log["sparsity/l0drop_lambda"] == pytest.approx(0.2)  # 50 of the 100-update ramp, from update 500
    assert half == pytest.approx(0.2 * float(log["sparsity/l0drop_penalty"]))
    with pytest.raises(ValueError, match="--sparsity-start-update 500 holds back a sparsity pressure, and none"):
        sparsity_criterion(None, False, 0.1, sparsity_start_update=500)
    with pytest.raises(ValueError, match="--sparsity-start-update must be an update count >= 0"):
        sparsity_criterion(None, False, 0.1, l0drop_lambda=0.4, sparsity_start_update=-1)


def test_a_continued_start_keeps_adams_state_and_counts_updates_from_zero():
    from fairseq_sparse.optim.continued import continued_start

    state = {"model": {}, "last_optimizer_state": {"state": {0: {}}, "param_groups": [{"params": [0]}]},
             "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                    "lr_scheduler_state": {"best": 3.0}, "num_updates": 3393}]}
    out = continued_start(state)
    assert out["optimizer_history"][-1] == {"criterion_name": "LabelSmoothedCrossEntropyWithSparsity",
                                            "optimizer_name": "FairseqAdamSparsity",
                                            "lr_scheduler_state": {"best": 3.0}, "num_updates": 0}
    assert out["last_optimizer_state"] is state["last_optimizer_state"]
    assert state["optimizer_history"][-1]["num_updates"] == 3393  # the start itself untouched
    for bad, message in ((dict(state, last_optimizer_state=None), "no optimiser state"),
                         (dict(state, optimizer_history=[{"criterion_name": "CrossEntropyCriterion",
                                                          "optimizer_name": "FairseqAdam"}]), "CrossEntropyCriterion")):
        with pytest.raises(ValueError, match=message):
            continued_start(bad)


def test_the_continued_rate_is_inverse_sqrt_later():
    from fairseq.optim import FairseqOptimizer

    from fairseq_sparse.optim.continued import InverseSquareRootContinuedConfig, InverseSquareRootContinuedSchedule

    class Recorder(FairseqOptimizer):
        lr = None

        def set_lr(self, lr):
            self.lr = lr

    opt = Recorder(None)
    cfg = InverseSquareRootContinuedConfig(warmup_updates=500, warmup_init_lr=-1, lr=[2e-3], lr_offset_updates=3400)
    sched = InverseSquareRootContinuedSchedule(cfg, opt)
    assert opt.lr == pytest.approx(2e-3 * (500 / 3400) ** 0.5)
    sched.step_update(600)
    assert opt.lr == pytest.approx(2e-3 * (500 / 4000) ** 0.5)
    with pytest.raises(ValueError, match="--lr-offset-updates must be an update count"):
        InverseSquareRootContinuedSchedule(InverseSquareRootContinuedConfig(
            warmup_updates=5, warmup_init_lr=-1, lr=[1e-3], lr_offset_updates=-2), opt)


def test_adam_sparsity_takes_a_one_group_adam_state_as_its_first_group():
    import torch

    from fairseq_sparse.optim.adam_sparsity import with_new_groups

    a, b, gate = torch.zeros(3, 2), torch.zeros(4), torch.zeros(1)
    saved = {"state": {0: {"exp_avg": torch.ones(3, 2), "step": torch.tensor(7.)}, 1: {"exp_avg": torch.ones(4)}},
             "param_groups": [{"params": [0, 1], "lr": 1e-3}]}
    groups = [{"params": [a, b], "lr": 5e-4}, {"params": [gate], "lr": 0.05, "sparsity_control": True}]
    out = with_new_groups(saved, groups)
    assert out["param_groups"][0] == saved["param_groups"][0]
    assert out["param_groups"][1] == {"lr": 0.05, "sparsity_control": True, "params": [2]}
    assert out["state"] is saved["state"]
    with pytest.raises(ValueError, match="holds 2 tensors, the model's parameters outside the gates are 1"):
        with_new_groups(saved, [{"params": [a]}, groups[1]])
    with pytest.raises(ValueError, match=r"shape \(3, 2\), the model's has \(2, 3\)"):
        with_new_groups(saved, [{"params": [torch.zeros(2, 3), b]}, groups[1]])


def test_continue_protocol_commands():
    a = options("--finetune-protocol", "continue")
    cmd = commands.finetune(a, "bin", methods.BY_NAME["l0drop"], start_updates=3393)
    assert value(cmd, "--lr-scheduler") == "inverse_sqrt_continued" and value(cmd, "--lr-offset-updates") == "3393"
    assert value(cmd, "--lr") == str(a.lr) and value(cmd, "--warmup-updates") == "500"
    assert value(cmd, "--continue-once") == "baseline/checkpoint_continue.pt" and "--reset-dataloader" in cmd
    assert "--finetune-from-model" not in cmd
    resumed = commands.finetune(a, "bin", methods.BY_NAME["l0drop"], resume=True, start_updates=3393)
    assert "--continue-once" not in resumed and "--reset-dataloader" not in resumed
    fresh = commands.finetune(options(), "bin", methods.BY_NAME["l0drop"])
    assert value(fresh, "--lr-scheduler") == "fixed" and value(fresh, "--lr") == "0.0005"


def test_budget_points_without_checkpoints_are_said_not_silently_left_out(monkeypatch, capsys):
    """Issue 62 item 4: --scratch-budget-points given after the baseline had trained without them gave an empty
    budget section and no word about it."""
    from fairseq_sparse.recipe import budget

    a = options("--baseline-updates", "20", "--scratch-budget-points", "10,20", "--steps", "pattern_freq_scratch")
    monkeypatch.setattr(budget, "checkpoints_by_updates",
                        lambda wd, name: {20: f"{name}/checkpoint_last.pt"} if name == "pattern_freq_scratch" else {})
    out = budget.budget_rows(a, dec=type("Decoding", (), {"wd": None})(), rows={"baseline": {}, "pattern_freq_scratch": {}})
    err = capsys.readouterr().err
    assert out == {}
    assert "budget point 10 of pattern_freq_scratch not compared: pattern_freq_scratch and baseline kept no checkpoint" in err
    assert "budget point 20 of pattern_freq_scratch not compared: baseline kept no checkpoint at update 20" in err


def test_a_training_from_scratch_keeps_only_its_budget_points_checkpoints(tmp_path):
    """fairseq saves a checkpoint at every epoch's end and every save interval; with --scratch-budget-points the run
    keeps those at its budget points, its last and its best (issue 62: every epoch checkpoint was kept)."""
    import torch

    from fairseq_sparse.recipe.budget import keep_budget_checkpoints
    from fairseq_sparse.recipe.workdir import WorkDir

    run = tmp_path / "baseline"
    run.mkdir()
    saved = {"checkpoint1.pt": 70, "checkpoint2.pt": 140, "checkpoint_2_100.pt": 100, "checkpoint_3_200.pt": 200,
             "checkpoint3.pt": 210, "checkpoint_last.pt": 210, "checkpoint_best.pt": 140}
    for name, updates in saved.items():
        torch.save({"optimizer_history": [{"num_updates": updates}]}, run / name)
    removed = keep_budget_checkpoints(WorkDir(str(tmp_path)), "baseline", [100, 140])
    assert sorted(removed) == ["checkpoint1.pt", "checkpoint3.pt", "checkpoint_3_200.pt"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint2.pt", "checkpoint_2_100.pt", "checkpoint_best.pt",
                                                     "checkpoint_last.pt"]
