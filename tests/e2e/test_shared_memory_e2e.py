"""``--task translation_shared_memory`` on a stock transformer trained by fairseq-train (the session's checkpoint,
conftest.py): fairseq-generate and fairseq-interactive print exactly what ``--task translation`` prints (sources,
hypotheses, scores, positional scores, alignments) for fairseq's generation options, batch sizes with a ragged last
batch and an ensemble; in the generator the memory keeps one row per sentence; a model it cannot switch is refused
with one line and exit status 1 before anything is decoded.

One comparison runs the console script (stock and switched side by side, one thread each); the others call the
console scripts' own ``main`` in this process with the arguments their parsers read (what the scripts run, without
one more interpreter start and import of fairseq, 3 s of CPU and much more wall time on shared cores)."""
import os
import subprocess

import pytest
import torch

from conftest import USER_DIR, console
from helpers.cli import generate_argv, per_sentence_lines, run_main

SHARED = ["--task", "translation_shared_memory"]


def assert_same_output(script, argv, stdin=None):
    """``argv`` with --task translation and with the switch print the same lines, character for character (scores
    to all the digits fairseq prints); returns them."""
    ref = per_sentence_lines(run_main(script, argv, stdin))
    assert per_sentence_lines(run_main(script, argv + SHARED, stdin)) == ref
    return ref


# fairseq's generation options (its test_binaries matrix and the ones the issue names), a few per run
GENERATE_FLAGS = {
    # 60 test sentences in batches of 7: the last batch has 4
    "beam5_nbest_lenpen_unkpen_alignment_ragged": ["--beam", "5", "--nbest", "3", "--lenpen", "0.6", "--unkpen", "1.5",
                                                   "--print-alignment", "--batch-size", "7"],
    "greedy_max_len_min_len_no_repeat": ["--beam", "1", "--max-len-a", "0.5", "--max-len-b", "3", "--min-len", "2",
                                         "--no-repeat-ngram-size", "2", "--batch-size", "16"],
    "prefix_soft_alignment_match_source_len": ["--beam", "3", "--prefix-size", "2", "--print-alignment", "soft",
                                               "--match-source-len", "--max-tokens", "150"],
    "sampling_topk_temperature": ["--sampling", "--sampling-topk", "3", "--temperature", "1.5", "--beam", "2",
                                  "--nbest", "2", "--seed", "3"],
    "sampling_topp_retain_dropout": ["--sampling", "--sampling-topp", "0.3", "--retain-dropout", "--beam", "2",
                                     "--nbest", "2", "--seed", "3"],
    "diversity_rate": ["--diversity-rate", "0.5", "--beam", "4", "--nbest", "2"],
    "score_reference": ["--score-reference"],
}


@pytest.mark.parametrize("name", sorted(GENERATE_FLAGS))
def test_fairseq_generate_prints_the_same(name, stock_transformer_ckpt, corpus):
    lines = assert_same_output("generate", generate_argv(corpus, stock_transformer_ckpt, GENERATE_FLAGS[name]))
    if name.startswith("beam5"):  # sentences finish at different steps (hypotheses of many lengths)
        assert len({len(line.split("\t")[2].split()) for line in lines if line.startswith("H-")}) > 3


def test_an_ensemble_prints_the_same(stock_transformer_ckpt, corpus):
    """Two checkpoints (fairseq's ensemble averages their probabilities): each keeps its own shared memory."""
    best = os.path.join(os.path.dirname(stock_transformer_ckpt), "checkpoint_best.pt")
    assert_same_output("generate", generate_argv(corpus, f"{stock_transformer_ckpt}:{best}",
                                                 ["--beam", "4", "--batch-size", "9"]))


def test_fairseq_interactive_with_constraints_prints_the_same(stock_transformer_ckpt, corpus):
    """fairseq-interactive builds its models through the task too; --constraints (lexically constrained beam search)
    reads them from the input lines, so it is tried here (fairseq-generate's test split has none)."""
    with open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8") as f:
        sources = f.read().splitlines()[:12]
    with open(os.path.join(corpus["raw"], "test.tgt"), encoding="utf-8") as f:
        targets = f.read().splitlines()[:12]
    stdin = "".join(f"{s}\t{t.split()[-1]}\n" for s, t in zip(sources, targets))
    argv = [corpus["bin"], "--user-dir", USER_DIR, "--path", stock_transformer_ckpt, "--cpu", "--source-lang", "src",
            "--target-lang", "tgt", "--beam", "4", "--nbest", "2", "--constraints", "--buffer-size", "5",
            "--batch-size", "5"]
    lines = assert_same_output("interactive", argv, stdin)
    assert sum(line.startswith("C-") for line in lines) == 12


def test_the_console_script_prints_the_same(stock_transformer_ckpt, corpus):
    """fairseq-generate itself, stock and switched side by side (one thread each); the switch says it is on."""
    cmd = [console("fairseq-generate")] + generate_argv(corpus, stock_transformer_ckpt,
                                                        ["--beam", "4", "--nbest", "2", "--batch-size", "7"])
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in (cmd, cmd + SHARED)]
    (stock, stock_err), (shared, shared_err) = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], stock_err[-3000:] + shared_err[-3000:]
    assert "translation_shared_memory: one encoder memory per sentence" in shared_err, shared_err[-2000:]
    assert per_sentence_lines(shared) == per_sentence_lines(stock)


def test_the_generator_reads_one_memory_row_per_sentence(stock_transformer_ckpt, corpus):
    """In-process, loaded as fairseq-generate loads it (the task builds the model, the checkpoint's weights load):
    every decoding step hands the decoder a memory of one row per sentence, and the output equals the stock model's
    bit for bit (a test batch of mixed lengths, beam 4)."""
    from fairseq import checkpoint_utils, options, tasks
    from helpers.models import assert_identical, generation_args, memory_rows_seen

    loaded = {}
    for task_name in ("translation", "translation_shared_memory"):
        args = options.parse_args_and_arch(options.get_generation_parser(), [
            corpus["bin"], "--user-dir", USER_DIR, "--task", task_name])
        task = tasks.setup_task(args)
        task.load_dataset("test")
        (model,), _ = checkpoint_utils.load_model_ensemble([stock_transformer_ckpt], task=task)
        loaded[task_name] = (model.eval(), task)
    ds = loaded["translation"][1].dataset("test")
    sample = ds.collater([ds[i] for i in range(0, len(ds), 3)])
    sentences = sample["net_input"]["src_tokens"].size(0)
    rows = memory_rows_seen(loaded["translation_shared_memory"][0])
    out = {}
    for name, (model, task) in loaded.items():
        gen = task.build_generator([model], generation_args(["--beam", "4"]))
        with torch.no_grad():
            out[name] = gen.generate([model], sample)
    assert len(rows) > 3 and all(memory == sentences for _, memory in rows), rows
    assert rows[0] == (sentences * 4, sentences)
    assert_identical(out["translation_shared_memory"], out["translation"])


def test_a_model_it_cannot_switch_is_refused_with_one_line(corpus, tmp_path):
    """A transformer_l0drop checkpoint (random weights, saved here): exit status 1, one error line, no traceback and
    nothing decoded."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        corpus["bin"], "--user-dir", USER_DIR, "--task", "translation", "--arch", "transformer_l0drop",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings"])
    model = tasks.setup_task(args).build_model(args)
    ckpt = str(tmp_path / "l0drop.pt")
    torch.save({"args": args, "model": model.state_dict(), "extra_state": {"train_iterator": None},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, ckpt)
    proc = subprocess.run([console("fairseq-generate")] + generate_argv(corpus, ckpt, ["--beam", "4"]) + SHARED,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("error: --task translation_shared_memory cannot share the encoder memory: the model "
                    "(L0DropTransformerModel) already keeps one encoder memory per sentence; decode it without "
                    "this switch"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not any(line.startswith("H-") for line in proc.stdout.splitlines())
