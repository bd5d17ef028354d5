"""One encoder memory per sentence for fairseq's own transformer (fairseq_sparse/search/shared_memory.py): fairseq's
SequenceGenerator gives bit-identical hypotheses, scores, positional scores and attention with the switched model
and with the stock one, while the memory the decoder reads keeps one row per sentence; what cannot be switched is
refused. Random tiny models built in-process (the trained checkpoint and fairseq-generate: tests/e2e)."""
import argparse
import copy

import pytest
import torch

from fairseq_sparse.search.shared_memory import SharedMemoryAttention, share_encoder_memory, why_not_shareable
from helpers.models import assert_identical, build, dictionary, generation_args, memory_rows_seen, parse, sources


def switched(model):
    """``model`` as ``--task translation_shared_memory`` loads it: the task builds the model, then its weights load."""
    from fairseq_sparse.search.translation_shared_memory import TranslationSharedMemoryConfig, TranslationSharedMemoryTask

    d = dictionary()
    task = TranslationSharedMemoryTask(TranslationSharedMemoryConfig(), d, d)
    shared = task.build_model(parse("transformer", ())).eval()
    shared.load_state_dict(model.state_dict(), strict=True)
    return shared, task


def generate(models, d, sample, flags=(), task=None, lm=None, seed=0, prefix_tokens=None):
    """fairseq-generate's generator for ``flags`` (the task's build_generator), run once on ``sample``."""
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    task = task or TranslationTask(TranslationConfig(), d, d)
    extra = {"lm_model": lm, "lm_weight": 0.5} if lm is not None else None
    gen = task.build_generator(models, generation_args(["--max-len-b", "15"] + list(flags)), extra_gen_cls_kwargs=extra)
    torch.manual_seed(seed)  # sampling
    with torch.no_grad():
        return gen.generate(models, sample, prefix_tokens=prefix_tokens)


@pytest.fixture(scope="module")
def pair():
    model, d = build()
    shared, task = switched(model)
    return model, shared, d, task


# fairseq's generation options (its test_binaries / test_sequence_generator matrix) that reach the generator
GENERATION_FLAGS = [
    ["--beam", "1"], ["--beam", "2"], ["--beam", "5"], ["--lenpen", "0.3", "--unkpen", "2"], ["--min-len", "4"],
    ["--max-len-a", "0.5", "--max-len-b", "3"], ["--no-repeat-ngram-size", "2"], ["--match-source-len"],
    ["--print-alignment"], ["--print-alignment", "soft"],
    ["--sampling", "--beam", "2", "--temperature", "2"], ["--sampling", "--sampling-topk", "3", "--beam", "2"],
    ["--sampling", "--sampling-topp", "0.5", "--beam", "2"], ["--diversity-rate", "0.5", "--beam", "4"],
]


# with these every sentence of this random model runs to the end
NO_EARLY_END = {"--min-len", "--match-source-len", "--max-len-a", "--sampling-topp"}


@pytest.mark.parametrize("flags", GENERATION_FLAGS, ids=" ".join)
def test_generation_is_bit_identical(pair, flags):
    model, shared, d, task = pair
    sample = sources(d)
    ref = generate([model], d, sample, flags)
    if not NO_EARLY_END.intersection(flags):
        ends = [max(len(h["tokens"]) for h in hs) for hs in ref]
        assert min(ends) < max(ends), ends  # sentences end at different steps (and leave the batch)
    assert_identical(generate([shared], d, sample, flags, task=task), ref)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.cuda)])
def test_beam_search_is_bit_identical_on(device):
    """On a GPU (fp32): cuBLAS may choose its kernels by batch count, so this is checked, not assumed."""
    model, d = build()
    shared, task = switched(model)
    model, shared = model.to(device), shared.to(device)
    from fairseq import utils

    sample = utils.move_to_cuda(sources(d))
    for flags in (["--beam", "1"], ["--beam", "5"], ["--print-alignment"]):
        out, ref = generate([shared], d, sample, flags, task=task), generate([model], d, sample, flags)
        assert_identical(utils.move_to_cpu(out), utils.move_to_cpu(ref))


def test_prefix_tokens_are_bit_identical(pair):
    model, shared, d, task = pair
    sample = sources(d)
    prefix = sample["net_input"]["src_tokens"][:, -3:-1].clone()
    prefix[prefix.eq(d.pad()) | prefix.eq(d.eos())] = d.index("w3")
    assert_identical(generate([shared], d, sample, ["--beam", "3"], task=task, prefix_tokens=prefix),
                     generate([model], d, sample, ["--beam", "3"], prefix_tokens=prefix))


def test_diverse_beam_groups_are_bit_identical():
    """fairseq's DiverseBeamSearch indexes its per-sentence state by sentence id and fails (IndexError) once
    sentences leave the batch, with or without the switch; here no sentence ends early (EOS not favoured)."""
    model, d = build(eos_scale=1.0)
    shared, task = switched(model)
    sample, flags = sources(d), ["--diverse-beam-groups", "2", "--diverse-beam-strength", "0.5", "--beam", "4"]
    assert_identical(generate([shared], d, sample, flags, task=task), generate([model], d, sample, flags))


def test_language_model_fusion_is_bit_identical(pair):
    """--lm-path / --lm-weight: a language model's scores added at every step (random transformer_lm)."""
    from fairseq import options
    from fairseq.tasks.language_modeling import LanguageModelingTask

    model, shared, d, task = pair
    lm_args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused-data-dir", "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1",
        "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2"])
    torch.manual_seed(5)
    lm = LanguageModelingTask(lm_args, d, d).build_model(lm_args).eval()
    sample = sources(d)
    assert_identical(generate([shared], d, sample, task=task, lm=lm), generate([model], d, sample, lm=lm))


def test_the_memory_keeps_one_row_per_sentence(pair):
    """The decoder reads a memory of one row per sentence at every step, and caches keys and values per sentence;
    the stock model's memory has one row per hypothesis (so this test fails if the switch did not share)."""
    model, shared, d, _ = pair
    sample, beam = sources(d), 4
    sentences = sample["net_input"]["src_tokens"].size(0)
    for m, expect in ((copy.deepcopy(shared), "sentences"), (copy.deepcopy(model), "hypotheses")):
        rows = memory_rows_seen(m)
        caches = []
        attn = m.decoder.layers[0].encoder_attn
        reorder = attn.reorder_incremental_state

        def recording_reorder(incremental_state, new_order, attn=attn, reorder=reorder):
            caches.append(attn._get_input_buffer(incremental_state)["prev_key"].size(0))
            return reorder(incremental_state, new_order)

        attn.reorder_incremental_state = recording_reorder
        generate([m], d, sample, ["--beam", str(beam)])
        assert len(rows) > 5
        if expect == "sentences":
            assert all(memory == sentences for _, memory in rows), rows
            assert rows[0] == (sentences * beam, sentences)
            assert max(caches) == sentences and min(caches) < sentences  # moves only when sentences finish
        else:
            assert all(memory == hyps for hyps, memory in rows), rows
            assert max(caches) == sentences * beam


def test_ensembles_are_bit_identical():
    a, d = build(seed=0)
    b, _ = build(seed=1)
    (sa, task), (sb, _) = switched(a), switched(b)
    sample = sources(d)
    assert_identical(generate([sa, sb], d, sample, task=task), generate([a, b], d, sample))


def test_full_sequence_passes_are_fairseq_s(pair):
    """Training, validation and scoring (no incremental state) go through fairseq's forward unchanged, gradients
    included."""
    model, shared, d, _ = pair
    sample = sources(d)
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    prev = torch.roll(src, 1, dims=1)
    outs = []
    for m in (copy.deepcopy(model).train(), copy.deepcopy(shared).train()):
        torch.manual_seed(3)
        logits, extra = m(src, lengths, prev)
        logits.sum().backward()
        outs.append((logits, extra["attn"][0], m.decoder.layers[1].encoder_attn.k_proj.weight.grad))
    for x, y in zip(*outs):
        assert torch.equal(x, y)


def test_switching_keeps_the_weights_and_adds_nothing(pair):
    model, shared, _, _ = pair
    assert list(model.state_dict()) == list(shared.state_dict())
    assert all(torch.equal(v, shared.state_dict()[k]) for k, v in model.state_dict().items())
    assert all(type(layer.encoder_attn) is SharedMemoryAttention for layer in shared.decoder.layers)
    assert shared.load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("arch, extra, reason", [
    ("transformer_l0drop", (), "already keeps one encoder memory per sentence"),
    ("transformer_head_gates", (), "not fairseq's own transformer"),
    ("transformer_simplified_decoder", (), "not fairseq's own transformer"),
    ("transformer", ("--cross-self-attention",), "--cross-self-attention"),
    ("transformer", ("--no-cross-attention",), "no encoder-decoder attention"),
])
def test_models_it_cannot_switch_are_refused(arch, extra, reason):
    model, _ = build(arch, *extra)
    assert reason in why_not_shareable(model)
    with pytest.raises(ValueError, match=reason.replace("-", "\\-")):
        share_encoder_memory(model)


def test_the_task_refuses_such_a_model_with_one_line():
    """--task translation_shared_memory on a model it cannot switch: SystemExit with one line (exit status 1)."""
    from fairseq_sparse.search.translation_shared_memory import TranslationSharedMemoryConfig, TranslationSharedMemoryTask

    d = dictionary()
    task = TranslationSharedMemoryTask(TranslationSharedMemoryConfig(), d, d)
    with pytest.raises(SystemExit) as e:
        task.build_model(parse("transformer_l0drop", ()))
    message = str(e.value.code)
    assert "\n" not in message and message.startswith("error: --task translation_shared_memory cannot share"), message
    assert "already keeps one encoder memory per sentence" in message


@pytest.mark.parametrize("flags", [["--beam", "5"], ["--print-alignment"]])
def test_no_beam_attention_where_fairseq_generate_reads_none(pair, flags):
    """fairseq-generate's prepare_for_inference_ (need_attn = --print-alignment): without --print-alignment the
    switched model's beam search keeps no attention, with the same tokens and scores as stock bit for bit; with it,
    the alignments are stock's."""
    from fairseq_sparse.modules.beam_attention import BeamAttentionOption

    model, shared, d, task = pair
    shared = copy.deepcopy(shared)  # prepare_for_inference_ applies once per model
    shared.prepare_for_inference_(argparse.Namespace(generation=generation_args(flags)))
    assert isinstance(shared.decoder, BeamAttentionOption)
    assert shared.decoder.beam_attention == ("--print-alignment" in flags)
    out, ref = generate([shared], d, sources(d), flags, task=task), generate([model], d, sources(d), flags)
    if "--print-alignment" in flags:
        assert_identical(out, ref)
        return
    for hs, rs in zip(out, ref):
        for h, r in zip(hs, rs):
            assert torch.equal(h["tokens"], r["tokens"]) and torch.equal(h["score"], r["score"])
            assert torch.equal(h["positional_scores"], r["positional_scores"])
            assert h["attention"].numel() == 0 and r["attention"].numel() > 0
