"""The fixed-shape beam search (fairseq_sparse/search/fixed_shape_search.py, --task translation_fixed_shape) gives fairseq's
SequenceGenerator's hypotheses and scores for the stock transformer and every architecture of the plugin, and for
every generation option it accepts; what it cannot honour is refused in one line before decoding. Random tiny
models built in-process, eager on the CPU."""
import logging
import types

import pytest
import torch

from fairseq.modules import MultiheadAttention

from fairseq_sparse.modules.attention_normalisers import NormalisedAttention
from fairseq_sparse.modules.count_attention import CountAwareAttention
from fairseq_sparse.modules.coverage_attention import CoverageAttention
from fairseq_sparse.modules.head_gates import HeadlessAttention, attention_modules, prune_heads
from fairseq_sparse.search.fixed_shape_search import (FixedShapeSequenceGenerator, StaticCacheSelfAttention, StepGraphs,
                                                      moves_with_the_beam)
from fairseq_sparse.search.shared_memory import SharedMemoryAttention
from fairseq_sparse.search.translation_fixed_shape import TranslationFixedShapeConfig, TranslationFixedShapeTask
from helpers.models import build, eager_graphs_class, gated, generation_args, sources

EagerGraphs = eager_graphs_class()
#: scores agree to float rounding: fairseq drops finished sentences from the batch, which changes the shapes its
#: matrix products run at (bit-identical on this machine so far; the tolerance is what is promised)
SCORE_TOL = 1e-5

ARCHITECTURES = {
    "transformer": ("transformer",),
    "l0drop, pruned decoding": ("transformer_l0drop",),
    "l0drop merged (attention), head gates, simplified decoder": (
        "transformer_l0drop", "--encoder-output-merge", "attention", "--head-gates", "enc,dec,encdec",
        "--simplified-decoder"),
    "l0drop between layers, compacted encoder": ("transformer_l0drop",
                                                 "--l0drop-between-layers", "--compact-encoder", "True"),
    "head gates": ("transformer_head_gates", "--head-gates", "enc,dec,encdec"),
    "simplified decoder": ("transformer_simplified_decoder",),
    "composed": ("transformer_l0drop", "--simplified-decoder", "--l0drop-between-layers",
                 "--head-gates", "enc,dec,encdec"),
    "head-pruned, other head counts per layer": ("transformer_head_gates", "--head-gates", "enc,dec,encdec"),
    "coverage attention (state per hypothesis)": ("transformer_l0drop", "--encdec-attention-coverage"),
    "sparsemax attention": ("transformer_head_gates", "--encdec-attention-normaliser", "sparsemax"),
}


def built(name, eos_scale):
    """The architecture with random weights; the head-pruned one physically pruned to other head counts per layer
    (one layer of each attention type left with none)."""
    model, d = build(*ARCHITECTURES[name], eos_scale=eos_scale)
    if name.startswith("head-pruned"):
        keep = {key: list(range(i % (mha.num_heads + 1))) for i, (key, mha) in enumerate(attention_modules(model).items())}
        prune_heads(model, keep)
    return gated(model), d


def decode(model, d, sample, flags, fixed, step_form="prefix", beam_reorder="copy"):
    task = (TranslationFixedShapeTask(TranslationFixedShapeConfig(fixed_shape_step_form=step_form,
                                                                  fixed_shape_beam_reorder=beam_reorder), d, d)
            if fixed else None)
    if task is None:
        from fairseq.tasks.translation import TranslationConfig, TranslationTask

        task = TranslationTask(TranslationConfig(), d, d)
    gen = task.build_generator([model], generation_args(["--max-len-b", "15"] + list(flags)))
    assert isinstance(gen, FixedShapeSequenceGenerator) == fixed
    with torch.no_grad():
        return gen.generate([model], sample)


def assert_same(out, ref):
    assert len(out) == len(ref)
    for s, (hs, rs) in enumerate(zip(out, ref)):
        assert [h["tokens"].tolist() for h in hs] == [r["tokens"].tolist() for r in rs], s
        for h, r in zip(hs, rs):
            assert abs(float(h["score"]) - float(r["score"])) <= SCORE_TOL
            assert torch.allclose(h["positional_scores"], r["positional_scores"], atol=SCORE_TOL, rtol=0)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model(request):
    """The architecture with random weights, EOS's output weight scaled (of a few scales, the one) where greedy
    search ends the test sentences at the most different steps."""
    def lengths(eos_scale):
        model, d = built(request.param, eos_scale)
        ref = decode(model, d, sources(d), ["--beam", "1"], fixed=False)
        return len({len(hs[0]["tokens"]) for hs in ref}), eos_scale

    n, eos_scale = max(lengths(1.0 + 0.25 * k) for k in range(9))
    assert n > 1, f"{request.param}: no EOS scale gives sentences of different lengths"
    return built(request.param, eos_scale)


@pytest.mark.parametrize("flags", [["--beam", "1"], ["--beam", "4"], ["--beam", "5", "--nbest", "5"]], ids=" ".join)
def test_every_architecture_gives_fairseqs_hypotheses(model, flags):
    model, d = model
    sample = sources(d)
    ref = decode(model, d, sample, flags, fixed=False)
    assert_same(decode(model, d, sample, flags, fixed=True), ref)


@pytest.mark.parametrize("flags", [["--beam", "1"], ["--beam", "4"], ["--lenpen", "0.3", "--min-len", "3"]],
                         ids=" ".join)
def test_steps_of_fixed_shape_give_fairseqs_hypotheses(model, flags):
    """The form a CUDA graph captures (the step's token, the whole buffers masked after the step, positions and
    length rules from the step tensor), run eagerly here; coverage attention, whose state per hypothesis a step
    replaces, is refused in one line."""
    model, d = model
    sample = sources(d)
    if any(type(m).__name__ == "CoverageAttention" for m in model.modules()):
        with pytest.raises(ValueError, match="CoverageAttention keeps state per hypothesis"):
            decode(model, d, sample, flags, fixed=True, step_form="fixed")
        return
    assert_same(decode(model, d, sample, flags, fixed=True, step_form="fixed"),
                decode(model, d, sample, flags, fixed=False))


@pytest.mark.parametrize("flags", [["--beam", "4"], ["--beam", "5", "--nbest", "5", "--lenpen", "0.3"]],
                         ids=" ".join)
def test_beams_reordered_through_an_ancestry_table_give_fairseqs_hypotheses(model, flags):
    """--fixed-shape-beam-reorder indirect: the self-attention keys and values stay where they were written, each
    hypothesis reads its history through the ancestry table; fairseq's hypotheses and scores (fp32, to 1e-5)."""
    model, d = model
    sample = sources(d)
    if any(type(m).__name__ == "CoverageAttention" for m in model.modules()):
        return  # refused in steps of fixed shape (test_steps_of_fixed_shape_give_fairseqs_hypotheses)
    out = decode(model, d, sample, flags, fixed=True, step_form="fixed", beam_reorder="indirect")
    ref = decode(model, d, sample, flags, fixed=False)
    assert_same(out, ref)
    for hs, rs in zip(out, ref):
        for h, r in zip(hs, rs):
            assert float(h["score"]) == pytest.approx(float(r["score"]), abs=1e-5)
            assert torch.allclose(h["positional_scores"], r["positional_scores"], atol=1e-5)


@pytest.mark.parametrize("reorder", ["copy", "indirect"])
@pytest.mark.parametrize("name", ["l0drop, pruned decoding", "l0drop between layers, compacted encoder", "composed"])
def test_l0drop_models_with_pruned_decoding_off_give_fairseqs_hypotheses(name, reorder):
    """The full memory (``--model-overrides "{'pruned_decoding': False}"``, the recipe's check of pruned decoding)
    decoded by steps of fixed shape: fairseq's hypotheses."""
    model, d = built(name, 2.5)
    switched = [m for m in model.modules() if hasattr(m, "pruned_decoding")]
    assert switched
    for m in switched:
        m.pruned_decoding = False
    sample = sources(d)
    assert_same(decode(model, d, sample, ["--beam", "4"], fixed=True, step_form="fixed", beam_reorder=reorder),
                decode(model, d, sample, ["--beam", "4"], fixed=False))


def test_the_ancestry_table_moves_and_the_buffers_do_not():
    """With --fixed-shape-beam-reorder indirect no written key or value is ever moved: after a step, every position
    written before holds what it held; the table names, per hypothesis and position, the slot of its sentence."""
    from fairseq_sparse.search.static_cache import StaticCacheSelfAttention

    model, d = build("transformer")
    seen = []

    def record(module, args, kwargs, out):
        state = module._get_input_buffer(kwargs["incremental_state"])
        seen.append((int(module.static_step), state["static_key"].clone(), state["static_ancestry"].clone()))

    attention = model.decoder.layers[0].self_attn
    hook = attention.register_forward_hook(record, with_kwargs=True)
    decode(model, d, sources(d), ["--beam", "4"], fixed=True, step_form="fixed", beam_reorder="indirect")
    hook.remove()
    assert type(attention) is MultiheadAttention and len(seen) > 3
    for (step, keys, table), (_, later_keys, _) in zip(seen, seen[1:]):
        assert keys.dim() == 5 and torch.equal(later_keys[:, :, :, :step + 1], keys[:, :, :, :step + 1])
        assert int(table.max()) < 4 and torch.equal(table[:, step], torch.arange(table.size(0)) % 4)
    assert any(not torch.equal(t[:, :s], (torch.arange(t.size(0)) % 4).unsqueeze(1).expand(-1, s))
               for s, _, t in seen[2:])  # some hypothesis continues another slot's history
    assert StaticCacheSelfAttention.static_beam == 0


def test_an_ancestry_table_needs_steps_of_fixed_shape():
    model, d = build("transformer")
    task = TranslationFixedShapeTask(TranslationFixedShapeConfig(fixed_shape_step_form="prefix",
                                                                 fixed_shape_beam_reorder="indirect"), d, d)
    with pytest.raises(SystemExit, match="needs steps of fixed shape"):
        task.build_generator([model], generation_args(["--beam", "4"]))


GENERATION_FLAGS = [["--lenpen", "0.3", "--unkpen", "2"], ["--lenpen", "2"], ["--min-len", "4"],
                    ["--max-len-a", "0.5", "--max-len-b", "3"], ["--no-repeat-ngram-size", "2"],
                    ["--unnormalized"], ["--temperature", "1.7"], ["--beam", "3", "--max-len-b", "2"]]


@pytest.mark.parametrize("flags", GENERATION_FLAGS, ids=" ".join)
def test_every_accepted_generation_option_gives_fairseqs_hypotheses(flags):
    model, d = build("transformer")
    sample = sources(d)
    assert_same(decode(model, d, sample, flags, fixed=True), decode(model, d, sample, flags, fixed=False))


@pytest.mark.parametrize("flags", [["--no-repeat-ngram-size", "2", "--min-len", "12"], ["--no-repeat-ngram-size", "3"]],
                         ids=" ".join)
def test_steps_of_fixed_shape_block_repeated_ngrams_as_fairseq_does(flags):
    """n-gram blocking in the form a CUDA graph captures: the step read on the device (fairseq_sparse/patches/ngram_block.py),
    the same hypotheses as fairseq's search, none with a repeated n-gram."""
    model, d = build("transformer")
    sample = sources(d)
    out = decode(model, d, sample, flags, fixed=True, step_form="fixed")
    assert_same(out, decode(model, d, sample, flags, fixed=False))
    n = int(flags[1])
    for h in (h["tokens"].tolist() for sentence in out for h in sentence):
        assert len({tuple(h[i:i + n]) for i in range(len(h) - n + 1)}) == len(h) - n + 1, h


def test_the_stop_check_interval_does_not_change_the_result():
    model, d = build("transformer")
    sample = sources(d)
    task = TranslationFixedShapeTask(TranslationFixedShapeConfig(fixed_shape_stop_every=1), d, d)
    every = task.build_generator([model], generation_args(["--beam", "4"]))
    rarely = FixedShapeSequenceGenerator([model], d, beam_size=4, max_len_b=200, stop_every=64)
    with torch.no_grad():
        a, b = every.generate([model], sample), rarely.generate([model], sample)
    assert_same(a, b)


@pytest.mark.parametrize("flags", [["--sampling"], ["--diverse-beam-groups", "2", "--beam", "4"],
                                   ["--diversity-rate", "0.5"], ["--match-source-len"], ["--prefix-size", "1"],
                                   ["--constraints"], ["--print-alignment"]], ids=" ".join)
def test_options_it_cannot_honour_are_refused_in_one_line(flags):
    model, d = build("transformer")
    task = TranslationFixedShapeTask(TranslationFixedShapeConfig(), d, d)
    with pytest.raises(SystemExit) as e:
        task.build_generator([model], generation_args(flags))
    message = str(e.value)
    assert "\n" not in message and flags[0] in message and "--task translation" in message


def test_self_attention_reads_the_preallocated_buffers_and_gets_its_class_back():
    """Every decoder self-attention decodes from the buffers (no fairseq cache grown by concatenation) during the
    search, and is fairseq's MultiheadAttention again afterwards (training and scoring unchanged)."""
    model, d = build("transformer")
    seen = []

    def record(module, args, kwargs, out):
        state = kwargs["incremental_state"]
        seen.append((type(module), sorted(module._get_input_buffer(state))))

    hooks = [layer.self_attn.register_forward_hook(record, with_kwargs=True) for layer in model.decoder.layers]
    decode(model, d, sources(d), ["--beam", "4"], fixed=True)
    for h in hooks:
        h.remove()
    assert seen and all(kind is StaticCacheSelfAttention and "static_key" in keys and "prev_key" not in keys
                        for kind, keys in seen), seen[:3]
    assert all(type(layer.self_attn) is MultiheadAttention for layer in model.decoder.layers)


@pytest.mark.cuda
@pytest.mark.parametrize("reorder", ["copy", "indirect"])
@pytest.mark.parametrize("name", ["transformer", "l0drop, pruned decoding", "head-pruned, other head counts per layer",
                                  "composed"])
def test_cuda_graphs_give_fairseqs_hypotheses_and_replay_for_a_new_batch(name, reorder):
    """On a GPU (fp32): the step captured in a CUDA graph gives fairseq's hypotheses; a second batch of the same shape
    replays the graph (its tensors copied into the captured ones) and gives fairseq's hypotheses too; with the beams
    reordered by copies and through the ancestry table alike."""
    from fairseq import utils

    model, d = built(name, 2.5)
    model = model.cuda()
    task = TranslationFixedShapeTask(TranslationFixedShapeConfig(fixed_shape_beam_reorder=reorder), d, d)
    for seed in (0, 1):
        sample = utils.move_to_cuda(sources(d, seed=seed))
        for flags in (["--beam", "4"], ["--beam", "5", "--lenpen", "0.3"]):
            gen = task.build_generator([model], generation_args(["--max-len-b", "15"] + flags))
            with torch.no_grad():
                out = [gen.generate([model], sample) for _ in range(2)]  # the second call replays
            assert gen.graphs is not None and len(gen.graphs.graphs) >= 1, "nothing was captured"
            ref = decode(model, d, sample, flags, fixed=False)
            for o in out:
                assert_same(utils.move_to_cpu(o), utils.move_to_cpu(ref))


@pytest.mark.parametrize("name", sorted(n for n in ARCHITECTURES if not n.startswith("coverage")))
def test_a_step_of_fixed_shape_reads_nothing_on_the_host(name, monkeypatch):
    """What a CUDA graph cannot capture, caught on the CPU: from the second step on (the first step runs eagerly
    before any capture), no tensor is turned into a Python value (bool, int, float, item, tolist, nonzero) by the
    search, fairseq or the plugin, so a captured step has no host read."""
    from fairseq_sparse.search import fixed_shape_search

    model, d = built(name, 2.5)
    step = fixed_shape_search.FixedShapeSequenceGenerator._step
    reads = []

    def host_read(what):
        def read(self, *args, **kwargs):
            raise AssertionError(f"a host read ({what}) inside a step of fixed shape")
        return read

    def guarded(self, run, at):
        if at == 0:
            return step(self, run, at)
        with pytest.MonkeyPatch.context() as m:
            for what in ("__bool__", "__int__", "__float__", "item", "tolist", "nonzero"):
                m.setattr(torch.Tensor, what, host_read(what))
            step(self, run, at)
        reads.append(at)

    monkeypatch.setattr(fixed_shape_search.FixedShapeSequenceGenerator, "_step", guarded)
    decode(model, d, sources(d), ["--beam", "4"], fixed=True, step_form="fixed")
    assert reads, "no step after the first ran"
    # n-gram blocking (fairseq_sparse/patches/ngram_block.py) and beams reordered through the ancestry table: no host read
    reads.clear()
    decode(model, d, sources(d), ["--beam", "4", "--no-repeat-ngram-size", "2"], fixed=True, step_form="fixed",
           beam_reorder="indirect")
    assert reads, "no step after the first ran"


@pytest.mark.parametrize("reorder", ["copy", "indirect"])
@pytest.mark.parametrize("name", ["transformer", "l0drop, pruned decoding", "composed"])
def test_a_new_batch_of_a_captured_shape_replays_with_its_own_tensors(name, reorder):
    """One graph per shape, kept for later batches of that shape (their tensors copied into the captured ones: with
    the ancestry table, its table and slots too), the least recently used dropped beyond the limit; fairseq's
    hypotheses for every batch, the first and the replayed."""
    model, d = built(name, 2.5)
    gen = FixedShapeSequenceGenerator([model], d, beam_size=4, max_len_b=15, step_form="fixed", source_bucket=1,
                                      beam_reorder=reorder)
    gen.graphs = EagerGraphs(size=1)
    batches = [sources(d, seed=0), sources(d, seed=1), sources(d, lengths=(4, 7, 3), seed=2)]
    for sample in batches + batches[:2]:
        ref = decode(model, d, sample, ["--beam", "4"], fixed=False)
        with torch.no_grad():
            assert_same(gen.generate([model], sample), ref)
    assert len(gen.graphs.graphs) == 1
    if name == "transformer":  # (L0Drop's memory length depends on the batch)
        assert gen.graphs.captures == 3, "seed 1 has seed 0's shape; seed 0's graph was dropped for the third shape"


@pytest.mark.parametrize("form", ["prefix", "fixed"])
def test_the_stock_memory_keeps_one_row_per_sentence_read_by_its_beams(form):
    """fairseq's transformer expands its memory over the beam; here its encoder-decoder attention computes the keys
    and values once per sentence (SharedMemoryAttention) during the search, and is fairseq's class again after."""
    from fairseq_sparse.search.shared_memory import SharedMemoryAttention

    model, d = build("transformer")
    sample = sources(d)
    rows = []

    def record(module, args, kwargs, out):
        state = module._get_input_buffer(kwargs["incremental_state"])
        rows.append((type(module), state["prev_key"].size(0)))

    hooks = [layer.encoder_attn.register_forward_hook(record, with_kwargs=True) for layer in model.decoder.layers]
    out = decode(model, d, sample, ["--beam", "4"], fixed=True, step_form=form)
    for h in hooks:
        h.remove()
    n = sample["net_input"]["src_tokens"].size(0)
    assert rows and all(kind is SharedMemoryAttention and r == n for kind, r in rows), rows[:3]
    assert all(type(layer.encoder_attn) is MultiheadAttention for layer in model.decoder.layers)
    assert_same(out, decode(model, d, sample, ["--beam", "4"], fixed=False))


@pytest.mark.parametrize("form", ["prefix", "fixed"])
def test_an_ensemble_gives_fairseqs_hypotheses(form):
    """Two models, a stock transformer (memory shared by the beams) and an L0Drop one (its own per-sentence memory)."""
    from fairseq.sequence_generator import SequenceGenerator

    (a, d), (b, _) = build("transformer"), built("l0drop, pruned decoding", 2.5)
    sample = sources(d)
    fixed = FixedShapeSequenceGenerator([a, b], d, beam_size=4, max_len_b=15, step_form=form)
    stock = SequenceGenerator([a, b], d, beam_size=4, max_len_b=15)
    with torch.no_grad():
        assert_same(fixed.generate([a, b], sample), stock.generate([a, b], sample))


@pytest.mark.parametrize("name", ["transformer", "l0drop, pruned decoding", "head-pruned, other head counts per layer"])
def test_sources_padded_to_a_bucket_give_fairseqs_hypotheses_and_share_a_graph(name):
    """Where steps are captured, sources and L0Drop's compressed memories are padded (masked) to a multiple of the
    bucket: batches of 12 and 14 tokens decode through one graph, and every batch gives fairseq's hypotheses on its
    unpadded sources, left- and right-padded alike."""
    model, d = built(name, 2.5)
    gen = FixedShapeSequenceGenerator([model], d, beam_size=4, max_len_b=15, step_form="fixed", source_bucket=8)
    gen.graphs = EagerGraphs(size=4)
    for lengths in ((9, 3, 6, 1, 12, 5, 2), (14, 3, 6, 1, 12, 5, 2)):
        for right in (False, True):
            sample = sources(d, lengths=lengths)
            if right:  # the same sentences padded on the right (--left-pad-source False)
                src = sample["net_input"]["src_tokens"]
                keep = src.ne(d.pad())
                sample["net_input"]["src_tokens"] = torch.stack(
                    [torch.cat([row[k], row[~k]]) for row, k in zip(src, keep)])
            ref = decode(model, d, sample, ["--beam", "4"], fixed=False)
            with torch.no_grad():
                assert_same(gen.generate([model], sample), ref)
    assert gen.graphs.captures == 1, "12 and 14 tokens (and L0Drop's kept lengths), padded to 16: one shape"


def test_a_graph_that_cannot_be_captured_leaves_eager_steps_with_a_warning(caplog):
    """Where a capture fails (an operation CUDA graphs refuse), the batch is decoded anew with eager steps, the
    generator stays eager from then on, and the log says why; the hypotheses are fairseq's either way."""

    class Failing(EagerGraphs):
        def _capture(self, generator, run):
            raise RuntimeError("operation not permitted when stream is capturing")

    model, d = build("transformer")
    gen = FixedShapeSequenceGenerator([model], d, beam_size=4, max_len_b=15, step_form="fixed")
    gen.graphs = Failing()
    sample = sources(d)
    with caplog.at_level("WARNING"), torch.no_grad():
        out = gen.generate([model], sample)
    assert gen.graphs is None
    assert any("could not be captured" in r.getMessage() and "not permitted" in r.getMessage() for r in caplog.records)
    assert_same(out, decode(model, d, sample, ["--beam", "4"], fixed=False))


@pytest.mark.parametrize("setting, value", [("fixed_shape_stop_every", 0), ("fixed_shape_max_graphs", -1),
                                            ("fixed_shape_source_bucket", 0)])
def test_settings_out_of_range_are_refused_in_one_line_before_decoding(setting, value):
    model, d = build("transformer")
    task = TranslationFixedShapeTask(TranslationFixedShapeConfig(**{setting: value}), d, d)
    with pytest.raises(SystemExit) as e:
        task.build_generator([model], generation_args(["--beam", "4"]))
    message = str(e.value)
    assert "\n" not in message and f"--{setting.replace('_', '-')}" in message and str(value) in message
    with pytest.raises(ValueError, match="must be a whole number"):
        FixedShapeSequenceGenerator([model], d, beam_size=4, **{setting[len("fixed_shape_"):]: value})


def test_auto_without_a_cuda_graph_is_fairseqs_own_search(caplog):
    """``auto`` on the CPU (no CUDA graph to replay) decodes with fairseq's own search, which drops finished sentences
    (an eager step of fixed shape computes their rows: slower there), and says so once; ``prefix`` runs the search's
    own steps. Both give fairseq's hypotheses."""
    from fairseq_sparse.search import fixed_shape_search

    model, d = built("transformer", 2.5)
    sample = sources(d)
    steps = []
    original = fixed_shape_search.FixedShapeSequenceGenerator._step
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO, logger="fairseq_sparse.search.fixed_shape_search"):
        mp.setattr(fixed_shape_search.FixedShapeSequenceGenerator, "_step",
                   lambda self, run, step: steps.append(step) or original(self, run, step))
        task = TranslationFixedShapeTask(TranslationFixedShapeConfig(), d, d)  # auto, the default
        gen = task.build_generator([model], generation_args(["--max-len-b", "15", "--beam", "4"]))
        with torch.no_grad():
            auto = [gen.generate([model], sample) for _ in range(2)]
        assert steps == [] and caplog.text.count("fairseq's own search, faster without a CUDA graph") == 1
        prefix = decode(model, d, sample, ["--beam", "4"], fixed=True, step_form="prefix")
        assert steps, "prefix ran no step of the fixed-shape search"
    ref = decode(model, d, sample, ["--beam", "4"], fixed=False)
    for out in (*auto, prefix):
        assert_same(out, ref)


def test_hypotheses_outlive_the_next_batch_of_a_captured_shape():
    """A caller that decodes several batches before it reads them (the hub's translate, fairseq-interactive with
    --buffer-size above --batch-size) keeps each batch's hypotheses: they are copied out of the captured buffers,
    which the next batch of the same shape overwrites (was: views, 8 of 12 translations another sentence's)."""
    model, d = built("transformer", 2.5)
    gen = FixedShapeSequenceGenerator([model], d, beam_size=4, max_len_b=15, step_form="fixed", source_bucket=1)
    gen.graphs = EagerGraphs(size=1)
    batches = [sources(d, seed=0), sources(d, seed=1)]  # one shape
    with torch.no_grad():
        held = [gen.generate([model], sample) for sample in batches]
    assert gen.graphs.captures == 1
    for out, sample in zip(held, batches):
        assert_same(out, decode(model, d, sample, ["--beam", "4"], fixed=False))


def test_retain_dropout_and_a_unigram_block_are_refused_in_one_line():
    model, d = build("transformer")
    task = TranslationFixedShapeTask(TranslationFixedShapeConfig(), d, d)
    for flags, wanted in ((["--retain-dropout"], "--retain-dropout"),
                          (["--no-repeat-ngram-size", "1"], "--no-repeat-ngram-size 1 blocks every token")):
        with pytest.raises(SystemExit) as e:
            task.build_generator([model], generation_args(flags))
        assert "\n" not in str(e.value) and wanted in str(e.value)
    task.build_generator([model], generation_args(["--no-repeat-ngram-size", "2"]))


def test_the_fp16_length_penalty_divides_as_fairseq_does():
    """fairseq divides a half score by the Python float (step + 1) ** lenpen, which the division reads in float32;
    rounding the divisor to half first changed the last bit of many normalised scores (issue 53)."""
    from fairseq_sparse.search.fixed_shape_search import Beams

    gen = types.SimpleNamespace(normalize_scores=True, len_penalty=0.6, eos=2)
    scores = torch.linspace(-9.0, -0.1, 4096).half()
    b = Beams(4096, 1, 40, 2, 1, 2, 8, "cpu")
    b.scores_as(scores)
    differ = 0
    for step in range(1, 40):
        b.step.fill_(step)
        b.fin_count.zero_()
        eos = torch.ones(4096, 1, dtype=torch.bool)
        FixedShapeSequenceGenerator._finalise(gen, b, step + 1, eos, torch.arange(4096).view(-1, 1), scores.view(-1, 1))
        want = (scores.float() / float((step + 1) ** 0.6)).half()
        assert torch.equal(b.fin_score[:, 0], want), step
        differ += int((scores / torch.tensor((step + 1) ** 0.6).half()).ne(want).sum())
    assert differ > 0  # the half divisor (the old code) would have differed


@pytest.mark.parametrize("cls, moves", [(MultiheadAttention, False), (CountAwareAttention, False),
                                        (NormalisedAttention, False), (SharedMemoryAttention, False),
                                        (HeadlessAttention, False), (CoverageAttention, True)],
                         ids=lambda c: getattr(c, "__name__", str(c)))
def test_the_attention_classes_say_what_the_search_leaves_in_place(cls, moves):
    """Encoder-decoder attention whose state is the sentence's memory stays in the sentence's rows; a self-attention
    (state per hypothesis) moves with the beams, but for a headless layer, which has none."""
    for encoder_decoder in (True, False):
        attention = MultiheadAttention(8, 2, self_attention=not encoder_decoder,
                                       encoder_decoder_attention=encoder_decoder)
        attention.__class__ = cls
        want = moves if encoder_decoder else cls is not HeadlessAttention
        assert moves_with_the_beam(attention) == want, encoder_decoder


class UndeclaredAttention(MultiheadAttention):
    """An encoder-decoder attention that does not say its state is the sentence's memory."""


@pytest.mark.parametrize("what", ["encoder-decoder attention", "decoder"])
def test_a_class_that_does_not_declare_its_state_per_sentence_is_refused_in_one_line(what, monkeypatch):
    """The search leaves in place only the state of a class that says it is per sentence
    (``fixed_shape_sentence_memory``, ``fixed_shape_sentence_state``): any other has state per hypothesis, which a
    step of fixed shape refuses as it refuses coverage attention's."""
    from fairseq_sparse.models.l0drop_decoder import L0DropTransformerDecoder

    model, d = build("transformer_l0drop")
    if what == "decoder":
        monkeypatch.delattr(L0DropTransformerDecoder, "fixed_shape_sentence_state")
        name = "L0DropTransformerDecoder"
    else:
        model.decoder.layers[0].encoder_attn.__class__ = UndeclaredAttention
        name = "UndeclaredAttention"
    with pytest.raises(ValueError, match=f"steps of fixed shape: {name} keeps state per hypothesis that a step"):
        decode(model, d, sources(d), ["--beam", "4"], fixed=True, step_form="fixed")


def test_the_installed_fairseq_is_the_one_whose_beam_search_the_search_copies():
    """The search overrides fairseq's private SequenceGenerator._generate: another fairseq fails here. Then read its
    _generate against the search (its _step and _finalise), and record the new version and source hash."""
    import importlib.metadata

    import fairseq

    from fairseq_sparse.search import fixed_shape_search as search

    assert (fairseq.__version__, importlib.metadata.version("fairseq-fixed")) == (search.FAIRSEQ_VERSION,) * 2
    assert search.installed_generate_sha256() == search.FAIRSEQ_GENERATE_SHA256


def test_another_fairseq_is_refused_when_the_search_is_built(monkeypatch):
    """A fairseq whose _generate differs: the generator is not built (ValueError naming both versions; one line in a
    console tool), rather than decode other hypotheses than fairseq's without a word."""
    import re

    import fairseq

    from fairseq_sparse.search import fixed_shape_search as search

    monkeypatch.setattr(search, "FAIRSEQ_GENERATE_SHA256", "0" * 64)
    monkeypatch.setattr(search, "FAIRSEQ_VERSION", "0.12.2")
    model, d = build("transformer")
    with pytest.raises(ValueError, match=r"\(SequenceGenerator._generate\) of fairseq 0\.12\.2; the installed fairseq "
                       + re.escape(fairseq.__version__) + " has another one"):
        FixedShapeSequenceGenerator([model], d, beam_size=4)
    with pytest.raises(SystemExit) as e:
        TranslationFixedShapeTask(TranslationFixedShapeConfig(), d, d).build_generator([model], generation_args([]))
    assert "\n" not in str(e.value) and str(e.value).startswith("error: --task translation_fixed_shape: the fixed-shape")
