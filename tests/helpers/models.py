"""Tiny transformers built in-process as fairseq-train builds them (parser, architecture preset, task.build_model),
with random weights; batches for them; fairseq-generate's generator options; comparing and rescoring hypotheses."""
import torch


def build_l0drop_model(*extra):
    """transformer_l0drop as fairseq-train builds it (parser, architecture preset, task.build_model)."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from conftest import USER_DIR

    d = Dictionary()
    for k in range(20):
        d.add_symbol(f"w{k}")
    d.finalize(padding_factor=1)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused-data-dir", "--user-dir", USER_DIR, "--task", "translation", "--arch", "transformer_l0drop",
        "--encoder-layers", "3", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings", "--l0drop-init-bias", "0"] + list(extra))
    torch.manual_seed(0)
    return TranslationTask(TranslationConfig(), d, d).build_model(args), args


def mixed_length_batch(seed=3):
    """Six left-padded sources of lengths 1 (EOS only) to 12, tokens of the 20-word dictionary."""
    g = torch.Generator().manual_seed(seed)
    lengths = [12, 9, 1, 7, 12, 4]
    src = torch.full((len(lengths), max(lengths)), 1)  # pad = 1
    for i, n in enumerate(lengths):
        src[i, -n:] = torch.randint(4, 24, (n,), generator=g)
        src[i, -1] = 2  # eos
    return src, torch.tensor(lengths)


VOCAB = 24


def parse(arch, extra):
    from fairseq import options

    from conftest import USER_DIR

    return options.parse_args_and_arch(options.get_training_parser(), [
        "unused-data-dir", "--user-dir", USER_DIR, "--task", "translation", "--arch", arch,
        "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings"] + list(extra))


def dictionary():
    from fairseq.data import Dictionary

    d = Dictionary()
    for k in range(VOCAB - 4):
        d.add_symbol(f"w{k}")
    d.finalize(padding_factor=1)
    return d


def build(arch="transformer", *extra, seed=0, eos_scale=2.5):
    """A model as fairseq-train builds it (parser, architecture preset, task.build_model), random weights; EOS's
    output embedding scaled up so that sentences end at different steps."""
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    d = dictionary()
    torch.manual_seed(seed)
    model = TranslationTask(TranslationConfig(), d, d).build_model(parse(arch, extra)).eval()
    with torch.no_grad():
        model.decoder.output_projection.weight[d.eos()] *= eos_scale
    return model, d


def sources(d, lengths=(9, 3, 6, 1, 12, 5, 2), seed=0):
    """A left-padded batch (as fairseq's translation task makes them) of the given lengths, EOS included."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), d.pad())
    for i, n in enumerate(lengths):
        src[i, src.size(1) - n:] = torch.randint(d.nspecial, len(d), (n,), generator=g)
        src[i, -1] = d.eos()
    return {"id": torch.arange(len(lengths)),
            "net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths)}}


def generation_args(flags):
    """fairseq-generate's generation options, parsed from its own parser."""
    from fairseq import options

    return options.parse_args_and_arch(options.get_generation_parser(), ["unused-data-dir"] + flags)


def assert_identical(out, ref):
    assert len(out) == len(ref)
    for hs, rs in zip(out, ref):
        assert len(hs) == len(rs)
        for h, r in zip(hs, rs):
            assert torch.equal(h["tokens"], r["tokens"])
            assert torch.equal(h["score"], r["score"]), (h["score"], r["score"])
            assert torch.equal(h["positional_scores"], r["positional_scores"])
            for key in ("attention", "alignment"):  # alignment: pairs (hard) or one tensor per token (soft)
                assert same(h.get(key), r.get(key)), key


def same(a, b) -> bool:
    """Bit for bit: tensors, numbers and lists or tuples of them."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def memory_rows_seen(model):
    """Record the rows of the encoder output the decoder is handed, call by call."""
    rows = []
    forward = model.decoder.forward

    def recording(prev_output_tokens, encoder_out=None, **kw):
        rows.append((prev_output_tokens.size(0), encoder_out["encoder_out"][0].size(1)))
        return forward(prev_output_tokens, encoder_out=encoder_out, **kw)

    model.decoder.forward = recording
    return rows


def rescore(model, sample, hypos, eos):
    """Teacher-forced log-probabilities of each hypothesis (a full-sequence, non-incremental pass)."""
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    scores = []
    for i, hyps in enumerate(hypos):
        for h in hyps:
            tokens = h["tokens"].unsqueeze(0)
            prev = torch.cat([tokens.new_full((1, 1), eos), tokens[:, :-1]], dim=1)
            with torch.no_grad():
                logits, _ = model(src[i:i + 1], lengths[i:i + 1], prev)
                lp = model.get_normalized_probs((logits, None), log_probs=True)
            scores.append((lp[0].gather(-1, tokens[0].unsqueeze(-1)).squeeze(-1), h["positional_scores"]))
    return scores


def eager_graphs_class():
    """StepGraphs on the CPU (the fixed-shape search's CUDA graphs, stood in for): "capturing" runs the step for real
    (the warm-up) and keeps the captured run; a replay runs the step again on that run's tensors, which is what a CUDA
    graph's replay reads. So a state a new batch fails to copy into the captured run, or a result left in the captured
    buffers that the next batch overwrites, shows here as a wrong hypothesis."""
    import types

    from fairseq_sparse.search.fixed_shape_search import StepGraphs

    class EagerGraphs(StepGraphs):
        device_type = "cpu"
        captures = 0

        def _capture(self, generator, run):
            generator._step(run, 1)
            self.captures += 1
            return types.SimpleNamespace(replay=lambda: generator._step(run, 1)), run

    return EagerGraphs


def gated(model, seed=0):
    """Close about half of every L0Drop gate (input-dependent) and some head gates, so that the memory is pruned; give
    coverage attention a say."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("log_alpha_proj.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 3.0)
            elif name.endswith("log_alpha_proj.bias"):
                p.fill_(-0.5)
            elif name.endswith("merge.score.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("log_alpha") and p.dim() == 1:
                p.copy_(torch.where(torch.rand(p.shape, generator=g) < 0.3, -10.0, 3.0))
            elif ".coverage.logit." in name:  # zero at initialisation: coverage would change nothing
                p.copy_(torch.randn(p.shape, generator=g))
    return model
