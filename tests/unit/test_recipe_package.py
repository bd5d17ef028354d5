"""The recipe package without running anything: the method table and what follows from it, the pure command
builders, the readers of the tools' JSON outputs, the report as a function of results.json (its size rules: the
package's, test_code_size.py)."""
import json
import os

import pytest

from fairseq_sparse.recipe import commands, methods
from fairseq_sparse.recipe.analyses import layer_sparsity
from fairseq_sparse.recipe.decoding import Decoding
from fairseq_sparse.recipe.options import get_parser
from fairseq_sparse.recipe.report import render
from fairseq_sparse.recipe.workdir import WorkDir, progress_line


def options(*extra):
    return get_parser().parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w"] + list(extra))


def test_every_control_and_start_runs_before_the_model_that_needs_it():
    order = [m.name for m in methods.METHODS]
    for m in methods.METHODS:
        for needed in (m.control, m.start):
            if needed is not None:
                assert needed in order[:order.index(m.name)], (m.name, needed)


def test_steps_controls_and_opt_ins_follow_from_the_table():
    names = [m.name for m in methods.METHODS]
    assert methods.STEPS == ("prepare", names[0], "distill_data", *names[1:], "speed", "gap_analysis", "report")
    scratch = {f"{n}_scratch" for n in methods.SCRATCH_OF}
    merged = {f"{n}_merge_{kind}" for n in ("l0drop", "pattern_freq") for kind in ("mean", "attention")}
    merged.add("pattern_freq_words")
    assert set(methods.OPT_IN_STEPS) == {"speed", "pattern_pos", "l0drop_low", "l0drop_layers", "simplified_control", "composed",
                                         "distill_data", "gap_analysis"} | scratch | merged
    assert methods.CONTROL_OF["l0drop"] == "control" and methods.CONTROL_OF["heads_enc"] == "control_frozen"
    assert "baseline" not in methods.CONTROL_OF and "curve" not in methods.CONTROL_OF
    assert set(methods.STEP_SUMMARY) == set(methods.STEPS)


def test_finetune_command_starts_from_its_model_and_resumes_without_it():
    a = options()
    l0drop = methods.BY_NAME["l0drop"]
    cmd = commands.finetune(a, "bin", l0drop)
    assert cmd[cmd.index("--finetune-from-model") + 1] == "baseline/checkpoint_best.pt"
    assert cmd[cmd.index("--max-update") + 1] == "2100" and "--no-epoch-checkpoints" in cmd
    assert cmd[-4:] == ["--l0drop-target-sparsity", "0.5", "--sparsity-target-warmup-updates", "200"]
    assert "--finetune-from-model" not in commands.finetune(a, "bin", l0drop, resume=True)
    composed = commands.finetune(a, "bin", methods.BY_NAME["composed"])
    assert composed[composed.index("--finetune-from-model") + 1] == "simplified/checkpoint_best.pt"


def test_merged_methods_are_their_dropping_method_with_the_merge_from_scratch_too():
    a = options()
    for name in ("l0drop", "pattern_freq"):
        for kind in ("mean", "attention"):
            for suffix in ("", "_scratch"):
                merged, dropping = (methods.BY_NAME[f"{n}{suffix}"] for n in (f"{name}_merge_{kind}", name))
                flags = merged.flags(a)
                at = flags.index("--encoder-output-merge")
                assert flags[at + 1] == kind and flags[:at] + flags[at + 2:] == dropping.flags(a)
                assert merged.control == dropping.control and merged.start == dropping.start and merged.opt_in


def test_the_composed_model_has_its_own_l0drop_target():
    a = options("--l0drop-target", "0.4")
    target = lambda cmd: cmd[cmd.index("--l0drop-target-sparsity") + 1]
    assert target(commands.finetune(a, "bin", methods.BY_NAME["l0drop"])) == "0.4"
    assert target(commands.finetune(a, "bin", methods.BY_NAME["composed"])) == "0.1"  # the default
    assert "target 0.1" in methods.BY_NAME["composed"].what(a) and "target 0.4" in methods.BY_NAME["l0drop"].what(a)
    a = options("--composed-l0drop-target", "0.3")
    assert target(commands.finetune(a, "bin", methods.BY_NAME["composed"])) == "0.3"
    assert target(commands.finetune(a, "bin", methods.BY_NAME["l0drop_layers"])) == "0.5"


def test_a_fixed_l0drop_lambda_replaces_the_target_in_every_l0drop_model():
    a = options("--l0drop-lambda", "0.3")
    for name in ("l0drop", "l0drop_layers", "composed"):
        cmd = commands.finetune(a, "bin", methods.BY_NAME[name])
        assert cmd[cmd.index("--l0drop-lambda") + 1] == "0.3" and "--l0drop-target-sparsity" not in cmd, name
        assert "lambda 0.3" in methods.BY_NAME[name].what(a)
    composed = commands.finetune(a, "bin", methods.BY_NAME["composed"])
    assert composed[composed.index("--head-gates-target-sparsity") + 1] == "0.5"  # the heads keep their target
    assert "--l0drop-lambda" not in commands.finetune(options(), "bin", methods.BY_NAME["l0drop"])


def test_dropped_states_masked_reach_every_l0drop_model():
    a = options("--l0drop-dropped-as", "mask")
    for name in ("l0drop", "l0drop_layers", "composed"):
        cmd = commands.finetune(a, "bin", methods.BY_NAME[name])
        assert cmd[cmd.index("--l0drop-dropped-as") + 1] == "mask" and "--l0drop-target-sparsity" in cmd, name
        assert "masked" in methods.BY_NAME[name].what(a)
    assert "--l0drop-dropped-as" not in commands.finetune(options(), "bin", methods.BY_NAME["l0drop"])


def test_the_gates_bias_temperature_and_weight_rate_reach_the_fine_tunings_only_when_asked():
    cmd = commands.finetune(options("--l0drop-init-bias", "0", "--l0drop-lambda", "0.3", "--l0drop-beta", "0.33",
                                    "--l0drop-weight-lr", "0.005"), "bin", methods.BY_NAME["l0drop"])
    assert cmd[cmd.index("--l0drop-init-bias") + 1] == "0.0" and cmd[cmd.index("--l0drop-lambda") + 1] == "0.3"
    assert cmd[cmd.index("--l0drop-beta") + 1] == "0.33" and cmd[cmd.index("--l0drop-weight-lr") + 1] == "0.005"
    control = commands.finetune(options("--l0drop-weight-lr", "0.005"), "bin", methods.BY_NAME["control"])
    assert "--l0drop-weight-lr" not in control  # adam_sparsity refuses it for a model without L0Drop
    default = commands.finetune(options(), "bin", methods.BY_NAME["l0drop"])
    assert not {"--l0drop-init-bias", "--l0drop-beta", "--l0drop-weight-lr"} & set(default)


@pytest.mark.parametrize("argv, message", [
    (["--l0drop-init-bias", "nan"], "--l0drop-init-bias must be a finite number"),
    (["--l0drop-beta", "0"], "--l0drop-beta must be a positive number"),
    (["--l0drop-beta", "nan"], "--l0drop-beta must be a positive number"),
    (["--l0drop-weight-lr", "-1"], "--l0drop-weight-lr must be a positive number"),
])
def test_a_bad_l0drop_gate_option_is_refused(argv, message, capsys):
    from fairseq_sparse.recipe.option_checks import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w"] + argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.1", "nan", "inf"])
def test_a_bad_l0drop_lambda_is_refused(value, capsys):
    from fairseq_sparse.recipe.option_checks import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w", "--l0drop-lambda", value])
    assert "--l0drop-lambda must be a number, at least 0" in capsys.readouterr().err


def test_distillation_and_patience_flags():
    a = options("--distill-weight", "0.5", "--baseline-patience", "4")
    for name in ("control", "l0drop", "composed"):  # a method and its control: the same teacher
        cmd = commands.finetune(a, "bin", methods.BY_NAME[name])
        assert cmd[cmd.index("--distill-teacher") + 1] == "baseline/checkpoint_best.pt"
        assert cmd[cmd.index("--distill-weight") + 1] == "0.5"
    scratch = commands.train_from_scratch(a, "bin", methods.BY_NAME["baseline"])
    assert scratch[scratch.index("--patience") + 1] == "4" and "--distill-teacher" not in scratch
    assert "--distill-teacher" not in commands.finetune(options(), "bin", methods.BY_NAME["l0drop"])
    assert "--patience" not in commands.train_from_scratch(options("--baseline-patience", "0"), "bin",
                                                           methods.BY_NAME["baseline"])


def test_budget_points_set_the_checkpoint_interval_of_every_fine_tuning():
    from fairseq_sparse.recipe.commands import save_interval

    a = options("--budget-points", "600,2000,6000", "--finetune-updates", "6000", "--curve-updates", "2000")
    assert save_interval(a, methods.BY_NAME["l0drop"]) == 200  # gcd of the points
    assert save_interval(a, methods.BY_NAME["control"]) == 200  # and of --curve-updates
    assert save_interval(options(), methods.BY_NAME["l0drop"]) == 0
    cmd = commands.finetune(a, "bin", methods.BY_NAME["heads_all"])
    assert cmd[cmd.index("--save-interval-updates") + 1] == "200" and "--no-epoch-checkpoints" not in cmd


def test_heads_target_per_attention_type_reaches_the_criterion():
    a = options("--heads-target", "enc=0.5,dec=0.5,encdec=0.5")
    cmd = commands.finetune(a, "bin", methods.BY_NAME["heads_all"])
    assert cmd[cmd.index("--head-gates-target-sparsity") + 1] == "enc=0.5,dec=0.5,encdec=0.5"


@pytest.mark.parametrize("extra,message", [
    (["--heads-target", "1.5"], "--heads-target must be in [0, 1)"),
    (["--heads-target", "enc=0.2:0.4"], "not a schedule"),
    (["--heads-target", "ffn=0.3"], "unknown attention type 'ffn'"),
    (["--heads-target", "enc=0.5,dec=0.5", "--steps", "heads_enc"], "which the heads_enc step does not gate (enc)"),
    (["--heads-target", "encdec=0.5", "--composed-head-gates", "enc,dec", "--steps", "composed"],
     "which the composed step does not gate (enc, dec)")])
def test_bad_heads_target_is_refused(extra, message, capsys):
    from fairseq_sparse.recipe.option_checks import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w"] + extra)
    assert message in capsys.readouterr().err


def test_budget_compares_each_fine_tuning_with_a_fine_tuned_control_of_equal_updates():
    from fairseq_sparse.recipe.budget import budget_control
    from fairseq_sparse.recipe.methods import BY_NAME, METHODS

    # the simplified decoder's control is itself (trained from scratch, no budget points): the stock control then
    assert BY_NAME["simplified_control"].control == "simplified"
    assert budget_control(BY_NAME["simplified_control"]) == "control"
    assert budget_control(BY_NAME["control"]) is None  # not compared with itself
    for m in METHODS:
        if m.start is not None and m.control is not None and BY_NAME[m.control].start is not None:
            assert budget_control(m) == m.control, m.name


@pytest.mark.parametrize("points,message", [("600,300", "--budget-points must rise"), ("3000", "at most --finetune-updates"),
                                            ("a,b", "--budget-points: a comma list of update counts")])
def test_bad_budget_points_are_refused(points, message, capsys):
    from fairseq_sparse.recipe.option_checks import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w", "--budget-points", points])
    assert message in capsys.readouterr().err


def test_curve_and_control_save_a_checkpoint_per_target():
    a = options("--curve-updates", "200")
    for name in ("curve", "control"):
        cmd = commands.finetune(a, "bin", methods.BY_NAME[name])
        assert cmd[cmd.index("--save-interval-updates") + 1] == "200" and "--no-epoch-checkpoints" not in cmd
    assert methods.updates_of(methods.BY_NAME["curve"], a) == 600


def test_model_flags_are_the_recipe_sizes():
    a = options("--layers", "2", "--embed-dim", "64", "--ffn-dim", "96", "--heads", "4")
    flags = commands.recipe_model_flags(a)
    assert flags[flags.index("--encoder-layers") + 1] == "2" and flags[flags.index("--decoder-ffn-embed-dim") + 1] == "96"


def test_encoder_and_decoder_depths_are_set_apart_and_default_to_layers():
    flags = commands.recipe_model_flags(options("--encoder-layers", "6", "--decoder-layers", "1", "--pre-norm"))
    assert flags[flags.index("--encoder-layers") + 1] == "6" and flags[flags.index("--decoder-layers") + 1] == "1"
    assert "--encoder-normalize-before" in flags and "--decoder-normalize-before" in flags
    flags = commands.recipe_model_flags(options("--layers", "4", "--decoder-layers", "2"))
    assert flags[flags.index("--encoder-layers") + 1] == "4" and flags[flags.index("--decoder-layers") + 1] == "2"


@pytest.mark.parametrize("extra,message", [
    (["--encoder-layers", "0"], "--encoder-layers must be at least 1"),
    (["--encoder-layers", "6", "--decoder-layers", "1", "--steps", "baseline,speed"], "step speed builds models of one depth"),
    (["--encoder-layers", "1", "--steps", "l0drop_layers"], "1 encoder layer has no such place"),
])
def test_bad_depths_are_refused_in_one_line(extra, message, capsys):
    from fairseq_sparse.recipe.option_checks import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w", "--device", "cpu"] + extra)
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_pre_norm_reaches_the_baseline_and_every_fine_tuning_alike():
    norm = ["--encoder-normalize-before", "--decoder-normalize-before"]
    a = options("--pre-norm")
    commands_of = [commands.train_from_scratch(a, "bin", methods.BY_NAME["baseline"])] + [
        commands.finetune(a, "bin", methods.BY_NAME[name]) for name in ("control", "l0drop")]
    assert all(all(flag in cmd for flag in norm) for cmd in commands_of)
    assert not any(flag in commands.train_from_scratch(options(), "bin", methods.BY_NAME["baseline"]) for flag in norm)


def test_progress_lines_are_read_from_fairseqs_json_log():
    train = '2026-11-24 10:00:00 | INFO | train_inner | {"epoch": 2, "update": 1.5, "loss": "5.1", "num_updates": "50", "wall": "12"}'
    valid = '2026-11-24 10:00:00 | INFO | valid | {"epoch": 2, "valid_loss": "4.9", "valid_bleu": "3.1", "valid_num_updates": "80"}'
    assert progress_line("x", train) == "    [x] epoch 2 update 50 loss 5.1 (12 s)"
    assert progress_line("x", valid) == "    [x] valid at update 80: loss 4.9 bleu 3.1"
    assert progress_line("x", "2026-11-24 | INFO | fairseq.trainer | begin training") is None


def test_layer_sparsity_and_heads_kept_read_the_tools_json(tmp_path):
    wd = WorkDir(str(tmp_path))
    dec = Decoding(options("--heads", "4"), wd, "bin")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "composed.log").write_text(
        '1 | INFO | valid | {"valid_l0drop_sparsity": "0.2", "valid_num_updates": "10"}\n'
        '2 | INFO | valid | {"valid_l0drop_sparsity": "0.5", "valid_l0drop_layer1_sparsity": "0.25", '
        '"valid_loss": "3"}\n')
    assert list(layer_sparsity(wd, "composed").items()) == [("l0drop_layer1", 0.25), ("l0drop", 0.5)]
    (tmp_path / "heads_all").mkdir()
    (tmp_path / "heads_all" / "pruned.kept_heads.json").write_text(json.dumps(
        {"enc": [[0, 1], [2]], "dec": [[0, 1, 2, 3], []], "encdec": [[1], [0, 3]]}))
    assert dec.heads_kept("heads_all") == {"kept": {"enc": 3, "dec": 4, "encdec": 3}, "total": (10, 24)}


def _results():
    settings = vars(options("--finetune-updates", "20"))
    row = {"score": 10.0, "bleu": 10.0, "sentences": 3, "checkpoint": "x", "l0drop_sparsity": None,
           "decode_seconds": 1.0, "parameters": 1000}
    return {"models": {"baseline": row, "control": dict(row, score=12.0),
                       "l0drop": dict(row, score=11.5, l0drop_sparsity=0.48)},
            "significance": {"l0drop": {"delta": -0.5, "p_value": 0.03, "mean": 11.4, "ci95": 0.9, "samples": 1000}},
            "budget": {"l0drop": [{"updates": 300, "score": 11.0, "control_score": 12.0, "gap": -1.0, "p_value": 0.02,
                                   "l0drop_sparsity": 0.47}],  # (written before heads_closed was)
                       "heads_all": [{"updates": 300, "score": 11.8, "control_score": 12.0, "gap": -0.2,
                                      "p_value": 0.3, "l0drop_sparsity": None, "heads_closed": 0.5}]},
            "heads": {}, "attention": {}, "curve": [], "speed": [], "noise": [], "settings": settings,
            "l0drop_exact": {"identical": True, "sentences": 3, "max_score_difference": 0.0},
            "stopped": {"baseline": {"updates": 900, "early_stop": True,
                                     "reason": "no valid BLEU gain in 10 validations (--baseline-patience)"}},
            "plots": [["a plot", "curve/curve.png"]], "commands": {"baseline": ["fairseq-train bin --arch transformer"]}}


def test_report_is_a_function_of_results_json_alone(tmp_path, monkeypatch):
    results = json.loads(json.dumps(_results()))  # what results.json holds after a round trip
    monkeypatch.chdir(tmp_path)  # nothing on disk to read
    lines = render(results)
    assert lines == render(_results())
    table = [l for l in lines if l.startswith("| ")]
    assert table[1].startswith("| baseline | stock transformer, at most 2610 updates | 10.00 |  |")
    assert table[3].startswith("| l0drop | L0Drop, target 0.5, pruned decoding | 11.50 | -0.50 (vs control) | "
                               "p = 0.030; 11.40 ± 0.90 | 48.0%")
    assert any("identical hypotheses on all 3" in l for l in lines)
    assert "- [a plot](curve/curve.png)" in lines and "fairseq-train bin --arch transformer" in lines
    assert "- baseline: stopped after 900 updates: no valid BLEU gain in 10 validations (--baseline-patience)." in lines
    assert "| l0drop | 300 | 11.00 | control (12.00) | -1.00 | 0.020 | 47.0% |  |" in lines
    assert "| heads_all | 300 | 11.80 | control (12.00) | -0.20 | 0.300 |  | 50.0% |" in lines


def test_exactness_counts_the_sentences_that_differ():
    """One flipped beam-search tie is reported as one sentence, by its line, not as the whole test set."""
    from fairseq_sparse.recipe.decoding import same_hypotheses
    from fairseq_sparse.recipe.report import exactness_lines

    pruned = {"hypotheses": [["a b", -1.0], ["c d", -2.0], ["e", -0.5]]}
    full = {"hypotheses": [["a b", -1.0000005], ["c x", -2.15], ["e", -0.5]]}
    e = same_hypotheses(pruned, full)
    # the largest score difference where the outputs agree (line 1's 5e-7), not the flipped line's 0.15
    assert e == {"identical": False, "sentences": 3, "differ": [1], "max_score_difference": pytest.approx(5e-7)}
    results = dict(_results(), l0drop_exact=e)
    line = next(l for l in exactness_lines(results) if "pruned decoding against the full memory" in l)
    assert "DIFFERENT hypotheses on 1 of 3 test sentences (line 2 of the test set;" in line
    assert same_hypotheses(pruned, pruned)["identical"] and same_hypotheses(pruned, pruned)["differ"] == []


def test_rouge_impl_perl_is_checked_before_work(capsys, monkeypatch):
    """--rouge-impl perl needs --metric rouge, and a ROUGE-1.5.5 that can run (what is missing is named)."""
    from fairseq_sparse.analysis import scores
    from fairseq_sparse.recipe.option_checks import parse_args

    base = ["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w", "--rouge-impl", "perl"]
    with pytest.raises(SystemExit):
        parse_args(base)
    assert "add --metric rouge" in capsys.readouterr().err
    monkeypatch.setattr(scores, "rouge155_missing", lambda: scores.ROUGE155_DEPENDENCY)
    with pytest.raises(SystemExit):
        parse_args(base + ["--metric", "rouge"])
    assert "XML::Parser" in capsys.readouterr().err
    monkeypatch.setattr(scores, "rouge155_missing", lambda: None)
    assert parse_args(base + ["--metric", "rouge"]).rouge_impl == "perl"


def test_gpu_training_flags_bound_the_baseline_by_time_and_every_fine_tuning_by_updates_only():
    a = options("--baseline-minutes", "3", "--validate-interval-updates", "500", "--amp")
    scratch = commands.train_from_scratch(a, "bin", methods.BY_NAME["baseline"])
    assert float(scratch[scratch.index("--stop-time-hours") + 1]) == pytest.approx(0.05, abs=1e-6)
    assert scratch[scratch.index("--validate-interval-updates") + 1] == "500"
    assert scratch[scratch.index("--save-interval-updates") + 1] == "500" and "--amp" in scratch
    assert int(scratch[scratch.index("--validate-interval") + 1]) > 10 ** 6  # epochs' ends no longer validate
    # fairseq's --stop-time-hours counts the time stored in the --finetune-from-model checkpoint: a fine-tuning
    # bounded by it stops after one update; a method and its control are bounded by the same --max-update
    for name in ("control", "l0drop", "l0drop_low", "pattern_freq"):
        cmd = commands.finetune(a, "bin", methods.BY_NAME[name])
        assert "--stop-time-hours" not in cmd and "--amp" in cmd
        assert cmd[cmd.index("--max-update") + 1] == str(a.finetune_updates)
    plain = commands.train_from_scratch(options(), "bin", methods.BY_NAME["baseline"])
    assert "--stop-time-hours" not in plain and "--amp" not in plain and "--validate-interval-updates" not in plain


def test_l0drop_low_is_l0drop_at_its_own_target_beside_the_same_control():
    a = options("--l0drop-target-low", "0.3", "--l0drop-target", "0.5")
    low, high = (commands.finetune(a, "bin", methods.BY_NAME[n]) for n in ("l0drop_low", "l0drop"))
    assert low[low.index("--l0drop-target-sparsity") + 1] == "0.3"
    assert high[high.index("--l0drop-target-sparsity") + 1] == "0.5"
    assert methods.CONTROL_OF["l0drop_low"] == methods.CONTROL_OF["l0drop"] == "control"


def test_a_product_is_made_again_when_a_setting_it_was_made_with_changes(tmp_path, capsys):
    """WorkDir.produced keys an output by its input checkpoints and its settings (e.g. the command line with
    --importance-fraction or --seq-kd-shards): a changed setting remakes it and says so; the same settings keep it."""
    wd = WorkDir(str(tmp_path))
    made = []

    def make(text):
        (tmp_path / "mask.json").write_text(text)
        made.append(text)

    wd.produced("mask.json", [], lambda: make("a"), ["tool --prune-fraction 0.5"])
    wd.produced("mask.json", [], lambda: make("b"), ["tool --prune-fraction 0.5"])
    assert made == ["a"]
    wd.produced("mask.json", [], lambda: make("c"), ["tool --prune-fraction 0.25"])
    assert made == ["a", "c"] and "mask.json: made again (its settings changed)" in capsys.readouterr().out


def _holding(path, content):
    """A process that holds PATH with flock(2), as a recipe run or a command it started does, CONTENT written."""
    import subprocess
    import sys

    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, sys.argv[2].encode()); print('held', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), content], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_one_run_per_step_and_a_stale_lock_is_taken_over(tmp_path, capsys):
    import subprocess
    import sys

    from fairseq_sparse.recipe.workdir import StepLock

    wd = WorkDir(str(tmp_path))
    (tmp_path / "locks").mkdir()
    lock = tmp_path / "locks" / "control.lock"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for content, holder in (("{pid}\n", "another recipe run \\(pid {pid}\\)"),  # a run holds it
                            # a killed run's training still holds it (the run's pid is gone): it is named
                            (f"{gone.pid}\n{{pid}}\n", f"a command of a recipe run that was killed \\(pid {{pid}}; "
                                                       f"the run was pid {gone.pid}\\)")):
        other = _holding(lock, "")
        try:
            lock.write_text(content.format(pid=other.pid))
            with pytest.raises(SystemExit, match=f"step control of .*: {holder.format(pid=other.pid)} holds "
                                                 f"{lock}; wait for it, or stop it"):
                with StepLock(wd, ["l0drop", "control"]):
                    pass
            assert not (tmp_path / "locks" / "l0drop.lock").exists()  # what it took before the refusal is released
        finally:
            other.kill()
            other.wait()
    # a lock file nobody holds is stale, whatever live process it names (here: this test's own pid's parent)
    lock.write_text(f"{os.getppid()}\n")
    with StepLock(wd, ["l0drop", "control"]):
        assert lock.read_text() == f"{os.getpid()}\n"
        assert wd.lock_fds and len(wd.lock_fds) == 2  # what the commands the run starts inherit
    assert f"a stale lock of a run that is gone (pid {os.getppid()}) taken over" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "locks")) == [] and wd.lock_fds == ()


def test_a_trained_models_key_is_its_command_line_without_the_budget():
    from fairseq_sparse.recipe.training import BUDGET_OPTIONS
    from fairseq_sparse.recipe.workdir import command_options, key_changes

    line = "fairseq-train data-bin --lr 0.0005 --max-update 20 --no-epoch-checkpoints -s en --adam-betas '(0.9, 0.98)'"
    options = command_options(line)
    assert options == {"args": ["data-bin"], "--lr": "0.0005", "--max-update": "20", "--no-epoch-checkpoints": True,
                       "-s": "en", "--adam-betas": "(0.9, 0.98)"}
    assert "--max-update" in BUDGET_OPTIONS and "--lr" not in BUDGET_OPTIONS
    assert key_changes({"--lr": "0.0005"}, {"--lr": "0.001", "--seed": "2"}) == [
        "--lr 0.0005 (this run: 0.001)", "--seed (none) (this run: 2)"]


def test_the_speed_step_runs_the_packages_benchmark_modules(tmp_path):
    """The speed step runs fairseq_sparse.benchmarks' modules with python -m (an install from a wheel has them as a
    clone does), each of them a module of the package."""
    import importlib.util
    import sys

    from fairseq_sparse.recipe import paths
    from fairseq_sparse.recipe.speed import benchmark_runs

    (tmp_path / "dict.en.txt").write_text("a 1\nb 1\n")
    runs = benchmark_runs(options(), WorkDir(str(tmp_path / "work")), str(tmp_path))
    assert [(name, cmd[:3]) for name, _, cmd in runs] == [
        (name, [sys.executable, "-m", module]) for name, module in paths.SPEED_MODULES.items()]
    assert set(paths.SPEED_MODULES) == {"l0drop", "heads", "simplified"}
    assert all(importlib.util.find_spec(module) for module in paths.SPEED_MODULES.values())


def test_runs_side_by_side_writing_one_file_never_collide(tmp_path):
    """Two fine-tunings under --finetune-protocol continue each wrote START/checkpoint_continue.pt through one
    PATH.tmp: one replaced the other's temporary file and failed (FileNotFoundError). Each writer has its own now."""
    import subprocess
    import sys

    code = ("import sys; from fairseq_sparse.recipe.workdir import save_json\n"
            "for i in range(300): save_json(sys.argv[1], {'i': i, 'pad': 'x' * 20000})")
    path = str(tmp_path / "same.json")
    procs = [subprocess.Popen([sys.executable, "-c", code, path], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert json.loads(open(path).read())["i"] == 299 and not list(tmp_path.glob("*.tmp"))


def test_the_gap_section_shows_chrf_repeats_and_the_copy_share_groups():
    from fairseq_sparse.recipe.report import gap_lines

    group = {"sentences": 3, "control": 10.0, "method": 8.0, "gap": -2.0, "relative_gap": -0.2, "control_ratio": 1.0,
             "method_ratio": 0.9}
    nll = {"train_sample": {"nll_loss": 3.0}, "valid": {"nll_loss": 4.0}}
    r = {"control": "baseline", "sparsity": 0.5, "overall": {"method": 8.0, "control": 10.0},
         "brevity": {k: {"ratio": 1.0, "bp": 1.0} for k in ("method", "control")}, "nll": {"method": nll, "control": nll},
         "by_length": {"1-10": group}, "by_copy_share": {"over 25%": group},
         "copy_recall": {"method": {"all": {"recall": 0.5, "words": 4}}, "control": {"all": {"recall": 0.75}}},
         "chrf": {"method": 30.5, "control": 35.25}, "repeated_trigrams": {"method": 0.02, "control": 0.01}}
    text = "\n".join(gap_lines({"pattern_freq_merge_mean_scratch": r}))
    assert "chrF 30.50 / 35.25; repeated trigrams 2.0% / 1.0%." in text
    assert "| copied over 25% | 3 | 10.00 | 8.00 | -2.00 | -20.0% | 0.900 / 1.000 |" in text
    del r["chrf"], r["repeated_trigrams"], r["by_copy_share"]  # an analysis of an earlier version still renders
    assert "chrF" not in "\n".join(gap_lines({"x": r}))


def test_seq_kd_leaves_no_shard_of_another_shard_count(tmp_path, monkeypatch, capsys):
    """Issue 62 item 4: distill_data with --seq-kd-shards 3 after a run with 10 left seqkd/shard3.tsv .. shard9.tsv
    (and their stamps) of the other count beside the three it reads, and the .tmp of a shard write cut off: files
    that look like this run's data. They are removed; what the recipe does not name (a file of the user's, a link the
    user put there, a file given as an input of the run) stays."""
    import torch

    from fairseq_sparse.recipe import seqkd

    wd = WorkDir(str(tmp_path))
    (tmp_path / "baseline").mkdir()
    torch.save({"optimizer_history": [{"num_updates": 5}]}, tmp_path / "baseline" / "checkpoint_best.pt")
    decoded = []

    def decode_shard(a, wd, data, shard):
        decoded.append((a.seq_kd_shards, shard))
        with open(wd.path("seqkd", f"shard{shard}.tsv"), "w") as f:
            f.write(f"{shard}\tsource {shard}\ttranslation {shard} of {a.seq_kd_shards}\n")

    read = []

    def binarise(a, wd, data):
        for shard in range(a.seq_kd_shards):
            read.append(open(wd.path("seqkd", f"shard{shard}.tsv")).read())
        os.makedirs(wd.path("data-bin-seqkd"), exist_ok=True)

    monkeypatch.setattr(seqkd, "decode_shard", decode_shard)
    monkeypatch.setattr(seqkd, "binarise", binarise)
    seqkd.distill_data(options("--seq-kd", "--seq-kd-shards", "10"), wd, "data-bin")
    assert len(decoded) == 10
    folder = tmp_path / "seqkd"
    (folder / "shard4.tsv.tmp").write_text("a write cut off")
    (folder / "shard1.tsv.tmp").write_text("a write cut off")
    (folder / "notes.txt").write_text("the user's")
    (folder / "shard05.tsv").write_text("no name of the recipe's")
    (tmp_path / "elsewhere.tsv").write_text("the user's")
    (folder / "shard7.tsv").unlink()
    (folder / "shard7.tsv").symlink_to(tmp_path / "elsewhere.tsv")
    given = folder / "shard8.tsv"  # an input of the run (--segment-types), whatever its name
    decoded.clear(), read.clear()
    seqkd.distill_data(options("--seq-kd", "--seq-kd-shards", "3", "--segment-types", str(given)), wd, "data-bin")
    assert decoded == [(3, 0), (3, 1), (3, 2)]  # made again: another shard count
    assert read == [f"{k}\tsource {k}\ttranslation {k} of 3\n" for k in range(3)]
    assert sorted(os.listdir(folder)) == ["notes.txt", "shard0.tsv", "shard05.tsv", "shard1.tsv", "shard2.tsv",
                                          "shard7.tsv", "shard8.tsv"]
    assert (tmp_path / "elsewhere.tsv").read_text() == "the user's" and given.read_text().endswith("of 10\n")
    stamps = sorted(n for n in os.listdir(tmp_path / "results") if n.startswith("seqkd_shard"))
    assert stamps == ["seqkd_shard0.tsv.inputs.json", "seqkd_shard1.tsv.inputs.json", "seqkd_shard2.tsv.inputs.json"]
    out = capsys.readouterr().out
    assert "distill_data: removed 7 files of another --seq-kd-shards or of a write cut off: seqkd/shard1.tsv.tmp, " \
           "seqkd/shard3.tsv, seqkd/shard4.tsv, seqkd/shard4.tsv.tmp, seqkd/shard5.tsv, seqkd/shard6.tsv, " \
           "seqkd/shard9.tsv" in out, out
    # the same settings again: nothing decoded, nothing removed
    decoded.clear(), read.clear()
    seqkd.distill_data(options("--seq-kd", "--seq-kd-shards", "3", "--segment-types", str(given)), wd, "data-bin")
    assert decoded == [] and "removed" not in capsys.readouterr().out
    assert sorted(os.listdir(folder)) == ["notes.txt", "shard0.tsv", "shard05.tsv", "shard1.tsv", "shard2.tsv",
                                          "shard7.tsv", "shard8.tsv"]
