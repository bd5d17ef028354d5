"""lab/gpu_study.sh in its CPU plumbing mode on a tiny corpus: one device call's study of fine-tunings (the
baseline under a wall-clock bound, every fine-tuning beside its equal-updates control, budget points, the report,
the pack and the model-only fp16 checkpoints), as the GPU runs it; one seed (seeds side by side, from scratch: the
queue's rehearsal, tests/lab/test_queue_rehearsal.py)."""
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest
import torch

from fairseq_sparse.checkpoint_safety import read_state

from conftest import REPO
from helpers.recipe import TINY

SCRIPT = os.path.join(REPO, "lab", "gpu_study.sh")


def test_one_call_one_study_in_plumbing_mode(raw_corpus, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    prefix = str(tmp_path / "W")
    # the baseline is bounded by 3 s of training (400 updates would take longer; the last --baseline-updates
    # counts), the fine-tunings by updates
    args = TINY + ["--baseline-updates", "400", "--baseline-minutes", "0.05", "--validate-interval-updates", "10",
                   "--budget-points", "10,20", "--corpus", str(raw_corpus), "-s", "en", "-t", "de"]
    tmp = tmp_path / "tmp"  # the packs' lock and temporary pack: removed when the study ends
    tmp.mkdir()
    env = dict(os.environ, VENV=os.path.dirname(os.path.dirname(sys.executable)), DEVICE="cpu", THREADS="1", OUT=str(out), SECONDS_LEFT="800",
               TMPDIR=str(tmp), RECIPE_ARGS=" ".join(args),
               BRING_BACK="1:l0drop/checkpoint_last.pt baseline/checkpoint_best.pt control/checkpoint_last.pt",
               # 51 KiB a file: the tiny checkpoints come back in parts; at most 6 files come back
               BRING_BACK_MIB="0.05", BRING_BACK_FILES="6")
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-sparse-recipe"), *args, "--work-dir", prefix + "1",
                    "--steps", "prepare", "--device", "cpu", "--quiet"], check=True, capture_output=True)
    done = subprocess.run(["bash", SCRIPT, prefix, "1", "baseline", "control,l0drop"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "seed 1, l0drop: exit 0" in done.stdout and "seed 1, report: exit 0" in done.stdout, done.stdout
    assert not [n for n in os.listdir(tmp) if n.startswith("gpu_study.")], os.listdir(tmp)
    for seed in (1,):
        results = json.loads(open(f"{prefix}{seed}/results.json").read())
        stopped = results["stopped"]["baseline"]
        assert stopped["updates"] < 400 and "--baseline-minutes" in stopped["reason"], stopped
        # fairseq's --stop-time-hours is never handed to a fine-tuning: it would count the baseline's stored time
        # and stop after one update (the device tool notes' trap); every fine-tuning made its 20 updates
        for name in ("control", "l0drop"):
            assert results["timing"][name]["updates"] == 20, results["timing"]
            assert results["timing"][name]["updates_per_second"] > 0
        assert results["timing"]["baseline"]["updates"] == stopped["updates"]
        assert [p["updates"] for p in results["budget"]["l0drop"]] == [10, 20]
        converged = results["converged"]
        assert converged["control_gain"] == round(results["models"]["control"]["score"]
                                                  - results["models"]["baseline"]["score"], 2)
        validated = [u for u, _, _ in converged["baseline_valid_curve"]]  # every 10 updates, and where time ran out
        assert validated[-1] == stopped["updates"] and all(u % 10 == 0 for u in validated[:-1]), validated
        assert results["l0drop_exact"]["identical"]
    with tarfile.open(out / "study.tgz") as t:
        names = t.getnames()
    assert any(n.endswith("W1/results.json") for n in names) and not any(n.endswith(".pt") for n in names)
    brought = sorted(os.listdir(out))
    # seed 1's L0Drop first, whole; then the baseline and the control as long as the 6 files hold them, whole or not
    # at all
    assert len(brought) <= 6 and "study.tgz" in brought, brought
    left_out = re.findall(r"bring back \S+/(W\d/\w+/checkpoint_\w+\.pt): left out", done.stdout)
    assert left_out, done.stdout
    for name in brought:
        whole = re.fullmatch(r"(s\d_\w+)\.part\d+of(\d+)\.pt", name)
        if whole:
            assert sum(n.startswith(whole.group(1) + ".part") for n in brought) == int(whole.group(2)), brought
    assert len(left_out) + len({n.split(".part")[0] for n in brought if ".part" in n}) == 3, (left_out, brought)
    parts = sorted(str(out / n) for n in brought if n.startswith("s1_l0drop_checkpoint_last.part"))
    assert len(parts) > 1 and all(os.path.getsize(p) <= 0.05 * 2**20 for p in parts), parts
    joined = tmp_path / "s1_l0drop.pt"
    subprocess.run([sys.executable, os.path.join(REPO, "lab", "checkpoint_parts.py"), "join", str(joined), *parts],
                   check=True, capture_output=True)
    state = read_state(str(joined))  # fairseq's safe loader reads it
    assert "last_optimizer_state" not in state
    assert {v.dtype for v in state["model"].values() if v.is_floating_point()} == {torch.float16}
    trained = read_state(f"{prefix}1/l0drop/checkpoint_last.pt")["model"]
    assert list(state["model"]) == list(trained)
    assert all(torch.equal(state["model"][k], v.half() if v.is_floating_point() else v) for k, v in trained.items())

    # the study's summary over its seeds, from the pack alone (lab/study_summary.py)
    sys.path.insert(0, os.path.join(REPO, "lab"))
    import study_summary

    summary_json = tmp_path / "summary.json"
    study_summary.main([str(out / "study.tgz"), "--json", str(summary_json)])
    summary = json.loads(summary_json.read_text())
    assert sorted(summary["seeds"]) == ["1"]
    results = json.loads(open(f"{prefix}1/results.json").read())
    models = results["models"]
    row = summary["seeds"]["1"]["models"]["l0drop"]
    assert row["control"] == "control" and row["gap"] == round(models["l0drop"]["score"] - models["control"]["score"], 2)
    assert row["source_states_pruned"] == models["l0drop"]["l0drop_sparsity"] and row["updates"] == 20
    assert 0 <= row["p_value"] <= 1
    # over two seeds: the pack unpacked beside a second seed's work dir (its L0Drop model 1 point better)
    both = tmp_path / "both"
    with tarfile.open(out / "study.tgz") as t:
        t.extractall(both, filter="data")
    results["settings"]["seed"] = 2
    results["models"]["l0drop"]["score"] += 1.0
    (both / "W2").mkdir()
    (both / "W2" / "results.json").write_text(json.dumps(results))
    two = study_summary.summarise(str(both))
    assert sorted(two["seeds"]) == [1, 2] and two["seeds"][2]["models"]["l0drop"]["gap"] == round(row["gap"] + 1.0, 2)
    assert two["mean"]["l0drop"]["gap"] == round(row["gap"] + 0.5, 2) and two["mean"]["l0drop"]["seeds"] == 2
    with pytest.raises(SystemExit):  # an existing --json is not overwritten
        study_summary.main([str(out / "study.tgz"), "--json", str(summary_json)])


def test_what_cannot_work_is_refused_before_any_work_and_a_failed_study_never_exits_0(raw_corpus, tmp_path):
    """Issue 55 item 3: THREADS=abc, an empty seed list, BRING_BACK_MIB=0 and phases that need data nobody prepared
    are refused up front (exit 2, in CHECK_ONLY too); a study whose steps fail exits 1, saying which."""
    prefix = str(tmp_path / "W")
    args = TINY + ["--corpus", str(raw_corpus), "-s", "en", "-t", "de"]
    base = dict(os.environ, VENV=os.path.dirname(os.path.dirname(sys.executable)), DEVICE="cpu", THREADS="1",
                RECIPE_ARGS=" ".join(args))

    def study(seeds, *phases, **env):
        return subprocess.run(["bash", SCRIPT, prefix, seeds, *phases], env={**base, **env}, capture_output=True,
                              text=True, timeout=600)

    for seeds, env, wanted in (("1", {"THREADS": "abc"}, "THREADS must be a whole number"),
                               (" ", {}, "no seed given"),
                               ("1 1", {}, "a run is given twice in '1 1'"),
                               ("1", {"BRING_BACK_MIB": "0"}, "BRING_BACK_MIB a number of MiB > 0"),
                               ("1", {"CHECK_ONLY": "1"}, "no phase prepares the data")):
        done = study(seeds, "baseline", **env)
        assert done.returncode == 2 and wanted in done.stdout, (env, done.stdout[-2000:], done.stderr[-2000:])
    assert not os.path.exists(prefix + "1")
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-sparse-recipe"), *args, "--work-dir",
                    prefix + "1", "--steps", "prepare", "--device", "cpu", "--quiet"], check=True, capture_output=True)
    done = study("1", "control")  # no baseline to fine-tune: refused by the check (issue 62 item 3)
    assert done.returncode == 2 and "step control starts from the baseline model" in done.stdout, done.stdout[-3000:]
    os.makedirs(prefix + "1/baseline")
    with open(prefix + "1/baseline/checkpoint_best.pt", "wb") as f:  # a carried baseline that is no checkpoint
        f.write(b"not a checkpoint")
    done = study("1", "control")  # the step fails after the checks
    assert done.returncode == 1, done.stdout[-3000:]
    assert re.search(r"seed 1, control: exit [1-9]", done.stdout) and "did not end with exit 0" in done.stdout
