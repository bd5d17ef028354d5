"""``--task translation_fixed_shape`` through fairseq-generate on checkpoints trained by fairseq-train (conftest.py's
stock transformer and L0Drop fine-tuning): the same lines as ``--task translation`` (hypotheses, scores and
positional scores within float rounding: fairseq drops finished sentences from the batch, so its matrix products
run at other shapes) for the options the fixed-shape search accepts, batches with a
ragged last one; an option it does not support is refused before anything is decoded."""
import os

import pytest

from conftest import USER_DIR
from helpers.cli import generate_argv, per_sentence_lines, run_main

# the search's own steps (its default, auto, runs fairseq's search on the CPU)
FIXED = ["--task", "translation_fixed_shape", "--fixed-shape-step-form", "prefix"]
FLAGS = {
    "beam5_nbest_lenpen_unkpen_ragged": ["--beam", "5", "--nbest", "3", "--lenpen", "0.6", "--unkpen", "1.5",
                                         "--batch-size", "7"],
    "greedy_max_len_min_len_no_repeat": ["--beam", "1", "--max-len-a", "0.5", "--max-len-b", "3", "--min-len", "2",
                                         "--no-repeat-ngram-size", "2", "--batch-size", "16"],
    "beam4_unnormalized_temperature": ["--beam", "4", "--unnormalized", "--temperature", "1.3", "--max-len-b", "30",
                                       "--batch-size", "9"],
}


def assert_close(lines, ref):
    """The same lines, tokens and text exactly, scores within 1e-5 + 1e-6 of their size (an unnormalised score is a
    sum over up to 200 steps), positional scores within one unit of the 4 decimals fairseq prints."""
    assert len(lines) == len(ref)
    for line, want in zip(lines, ref):
        a, b = line.split("\t"), want.split("\t")
        assert len(a) == len(b) and a[0] == b[0], (line, want)
        if a[0].startswith(("H-", "D-")):
            assert a[2] == b[2] and abs(float(a[1]) - float(b[1])) <= 1e-5 + 1e-6 * abs(float(b[1])), (line, want)
        elif a[0].startswith("P-"):
            assert all(abs(float(x) - float(y)) <= 1.01e-4 for x, y in zip(a[1].split(), b[1].split())), (line, want)
        else:
            assert a == b


@pytest.mark.parametrize("which,name", [("stock", n) for n in sorted(FLAGS)]
                         + [("l0drop", "beam5_nbest_lenpen_unkpen_ragged"), ("l0drop", "beam4_unnormalized_temperature")])
def test_fairseq_generate_prints_what_the_translation_task_prints(name, which, stock_transformer_ckpt, l0drop_ckpt,
                                                                   corpus):
    argv = generate_argv(corpus, stock_transformer_ckpt if which == "stock" else l0drop_ckpt, FLAGS[name])
    ref = per_sentence_lines(run_main("generate", argv))
    assert_close(per_sentence_lines(run_main("generate", argv + FIXED)), ref)
    if name.startswith("beam5"):  # sentences finish at different steps
        assert len({len(line.split("\t")[2].split()) for line in ref if line.startswith("H-")}) > 3


def test_an_option_it_does_not_support_is_refused_before_decoding(stock_transformer_ckpt, corpus, capsys):
    with pytest.raises(SystemExit) as e:
        run_main("generate", generate_argv(corpus, stock_transformer_ckpt, ["--sampling", "--beam", "2", "--nbest", "2"]) + FIXED)
    assert "does not support --sampling" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("which", ["stock", "l0drop"])
def test_steps_of_fixed_shape_print_what_the_translation_task_prints(which, stock_transformer_ckpt, l0drop_ckpt,
                                                                     corpus):
    """--fixed-shape-step-form fixed: the form a GPU captures in a CUDA graph, run eagerly on the CPU."""
    flags = FLAGS["beam5_nbest_lenpen_unkpen_ragged"]
    argv = generate_argv(corpus, stock_transformer_ckpt if which == "stock" else l0drop_ckpt, flags)
    ref = per_sentence_lines(run_main("generate", argv))
    assert_close(per_sentence_lines(run_main("generate", argv + FIXED + ["--fixed-shape-step-form", "fixed"])), ref)


def test_fairseq_interactive_prints_what_the_translation_task_prints(l0drop_ckpt, corpus):
    with open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8") as f:
        stdin = "".join(f.read().splitlines(keepends=True)[:12])
    argv = [corpus["bin"], "--user-dir", USER_DIR, "--path", l0drop_ckpt, "--cpu", "--source-lang", "src",
            "--target-lang", "tgt", "--beam", "4", "--nbest", "2", "--buffer-size", "5", "--batch-size", "5"]
    ref = per_sentence_lines(run_main("interactive", argv, stdin))
    assert sum(line.startswith("H-") for line in ref) == 24
    assert_close(per_sentence_lines(run_main("interactive", argv + FIXED, stdin)), ref)


def test_the_hub_interface_translates_as_the_translation_task_does(l0drop_ckpt, corpus):
    from fairseq_sparse.search.fixed_shape_search import FixedShapeSequenceGenerator
    from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel
    from fairseq_sparse.search.translation_fixed_shape import use_fixed_shape_search

    def hub():
        return L0DropTransformerModel.from_pretrained(
            os.path.dirname(l0drop_ckpt), checkpoint_file=os.path.basename(l0drop_ckpt),
            data_name_or_path=corpus["bin"], source_lang="src", target_lang="tgt")

    with open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8") as f:
        sources = [line.strip() for line in f][:8]
    fixed = use_fixed_shape_search(hub(), fixed_shape_stop_every=2, fixed_shape_step_form="prefix")
    assert isinstance(fixed.task.build_generator(fixed.models, fixed.cfg.generation), FixedShapeSequenceGenerator)
    assert fixed.task.cfg.fixed_shape_stop_every == 2 and fixed.task.cfg.source_lang == "src"
    assert fixed.translate(sources, beam=4) == hub().translate(sources, beam=4)
    with pytest.raises(ValueError, match="unknown option"):
        use_fixed_shape_search(hub(), stop_every=2)
    # issue 62 item 6: a setting the search refuses ended the calling program (SystemExit); now the caller catches it
    try:
        fixed.translate(sources, beam=2, sampling=True)
    except ValueError as e:
        assert "does not support --sampling" in str(e)
    else:
        raise AssertionError("sampling was not refused")
    assert fixed.translate(sources, beam=4) == hub().translate(sources, beam=4)  # the program goes on


def test_callers_that_read_after_several_batches_get_their_own_translations(l0drop_ckpt, corpus, monkeypatch):
    """fairseq-interactive with --buffer-size above --batch-size and the hub's translate decode several batches before
    they read any: with steps captured (the eager stand-in of a CUDA graph), each batch of a shape is decoded in the
    captured buffers, so its hypotheses must be copied out (was: 8 of 12 translations another sentence's)."""
    import fairseq_sparse.search.fixed_shape_search as search
    from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel
    from fairseq_sparse.search.translation_fixed_shape import use_fixed_shape_search
    from helpers.models import eager_graphs_class

    monkeypatch.setattr(search, "StepGraphs", eager_graphs_class())
    with open(os.path.join(corpus["raw"], "test.src"), encoding="utf-8") as f:
        lines = f.read().splitlines()[:12]
    argv = [corpus["bin"], "--user-dir", USER_DIR, "--path", l0drop_ckpt, "--cpu", "--source-lang", "src",
            "--target-lang", "tgt", "--beam", "4", "--buffer-size", "12", "--batch-size", "3"]
    stdin = "".join(line + "\n" for line in lines)
    ref = per_sentence_lines(run_main("interactive", argv, stdin))
    captured = FIXED[:2] + ["--fixed-shape-step-form", "fixed"]
    assert_close(per_sentence_lines(run_main("interactive", argv + captured, stdin)), ref)

    def hub():
        h = L0DropTransformerModel.from_pretrained(
            os.path.dirname(l0drop_ckpt), checkpoint_file=os.path.basename(l0drop_ckpt),
            data_name_or_path=corpus["bin"], source_lang="src", target_lang="tgt")
        h.cfg.dataset.batch_size = 3
        return h

    fixed = use_fixed_shape_search(hub(), fixed_shape_step_form="fixed")
    assert fixed.translate(lines, beam=4) == hub().translate(lines, beam=4)
