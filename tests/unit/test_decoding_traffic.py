"""The bytes-per-step model of decoding (fairseq_sparse/analysis/decoding_traffic.py): its closed forms term by
term, its parameter counts against real fairseq models built in-process at a tiny size, and the prediction
it exists for (a shared, pruned memory pays at batch 64 on long inputs, not at batch 1). No timing."""
import pytest

from fairseq_sparse.analysis import decoding_traffic as dt

BASE = dt.ModelShape.uniform(layers=6, dim=512, heads=8, ffn=2048, vocab=32000)
H100 = dict(bandwidth=3.35e12, peak_flops=989e12)  # H100 SXM: HBM3, dense fp16 tensor cores


def step(shape=BASE, t=10, memory_len=400, sentences=8, beam=5, shared_memory=False, element_bytes=2, copies=False):
    return dt.step_traffic(shape, t, memory_len, sentences, beam, shared_memory, element_bytes, copies)


def generate(shape=BASE, memory_len=400, sentences=64, shared_memory=False, **kw):
    args = dict(enc_rows=[memory_len] * len(shape.enc_heads), memory_len=memory_len, sentences=sentences, beam=5,
                steps=61, shared_memory=shared_memory, element_bytes=2, **H100)
    args.update(kw)
    return dt.decoding_time(shape, **args)


def test_shared_memory_divides_only_the_cross_attention_term_by_beam():
    (a, fa), (b, fb) = step(shared_memory=False), step(shared_memory=True)
    assert a["cross_kv"] == 5 * b["cross_kv"]
    assert {k: v for k, v in a.items() if k != "cross_kv"} == {k: v for k, v in b.items() if k != "cross_kv"}
    assert fa == fb  # every hypothesis still has its own query: bytes saved, not FLOPs


def test_cross_attention_term_closed_form():
    terms, _ = step(memory_len=400, sentences=8, beam=5, element_bytes=2)
    assert terms["cross_kv"] == 6 * 2 * 400 * 512 * 8 * 5 * 2  # layers x k,v x source x kv dim x hyps x bytes


def test_doubling_the_source_doubles_only_the_cross_attention_term():
    (a, _), (b, _) = step(memory_len=300), step(memory_len=600)
    assert b["cross_kv"] == 2 * a["cross_kv"] > 0
    assert {k: v for k, v in a.items() if k != "cross_kv"} == {k: v for k, v in b.items() if k != "cross_kv"}


def test_self_attention_term_grows_with_the_step_and_averages_over_the_output():
    steps = 61
    per_step = [step(t=t, sentences=3, beam=4, element_bytes=4)[0]["self_kv"] for t in range(steps)]
    assert per_step[0] == 6 * 2 * 1 * 512 * 3 * 4 * 4
    assert per_step == [per_step[0] * (t + 1) for t in range(steps)]
    mean = generate(sentences=3, beam=4, steps=steps, element_bytes=4)["step_bytes"]["self_kv"]
    assert mean == pytest.approx(per_step[0] * (steps + 1) / 2)


def test_removing_the_decoder_ffn_removes_exactly_its_bytes():
    simplified = dt.ModelShape.uniform(layers=6, dim=512, heads=8, ffn=2048, vocab=32000, dec_ffn=False)
    (a, fa), (b, fb) = step(BASE, element_bytes=2), step(simplified, element_bytes=2)
    ffn_params = 2 * 512 * 2048 + 2048 + 512 + 2 * 512  # fc1, fc2 with biases, the FFN's layer norm
    assert a["weights"] - b["weights"] == 6 * ffn_params * 2
    assert {k: v for k, v in a.items() if k != "weights"} == {k: v for k, v in b.items() if k != "weights"}
    assert fa - fb == 2 * 6 * ffn_params * 8 * 5


def test_element_size_scales_every_term_but_the_float32_log_probs():
    (h, _), (f, _) = step(element_bytes=2), step(element_bytes=4)
    for k in ("weights", "cross_kv", "self_kv"):
        assert f[k] == 2 * h[k]
    assert f["logits"] - h["logits"] == 8 * 5 * 32000 * 2 * (4 - 2)  # logits written and read at the element size


def test_copies_fairseq_makes_per_step():
    (plain, _), (first, _) = step(t=0), step(t=0, copies=True)
    assert plain == {k: v for k, v in first.items() if k != "copies"}
    (later, _), (later_shared, _) = step(t=10, copies=True), step(t=10, copies=True, shared_memory=True)
    # without a shared memory the key/value caches (read + write) and the encoder output and embeddings are
    # reordered too; the self-attention caches are concatenated and reordered in both
    reorder = 2 * later["cross_kv"] + 2 * 2 * 400 * 512 * 8 * 5 * 2
    assert later["copies"] - later_shared["copies"] == reorder
    assert first["copies"] < later_shared["copies"]  # no reordering at the first step


def test_heads_pruned_shrink_attention_weights_and_caches():
    half = dt.ModelShape.uniform(layers=6, dim=512, heads=8, ffn=2048, vocab=32000, kept_heads=4)
    (a, _), (b, _) = step(BASE), step(half)
    assert b["cross_kv"] * 2 == a["cross_kv"] and b["self_kv"] * 2 == a["self_kv"]
    # self-attention q,k,v,out and cross-attention q,out: 6 matrices of 512 x 256 fewer per layer, biases
    assert a["weights"] - b["weights"] == 6 * (6 * 512 * 256 + 4 * 256) * 2


def test_roofline_bound_and_batch():
    one = generate(sentences=1, memory_len=25)
    assert one["bound"] == "memory" and one["memory_bound_share"] == 1.0  # batch 1: weights read for 5 hypotheses
    big = generate(sentences=64, memory_len=1000)
    # at 1,000 source tokens the per-hypothesis keys/values dwarf the weights
    assert big["step_bytes"]["cross_kv"] > 10 * big["step_bytes"]["weights"]
    t, b = dt.roofline(100.0, 1000.0, bandwidth=10.0, peak_flops=1000.0)
    assert (t, b) == (10.0, "memory")
    assert dt.roofline(100.0, 1e5, bandwidth=10.0, peak_flops=1000.0) == (100.0, "compute")


def test_pruned_shared_memory_pays_at_batch_64_on_long_inputs_not_at_batch_1():
    """The question the model answers (issue 25): a memory pruned by 60% and shared per sentence, against stock
    (transformer-base sizes, beam 5, fp16, H100 rates)."""
    def ratio(sentences, length):
        stock = generate(sentences=sentences, memory_len=length)
        l0drop = generate(sentences=sentences, memory_len=max(1, round(0.4 * length)), shared_memory=True,
                          enc_rows=[length] * 6)
        return dt.predicted_ratio(stock, l0drop)

    assert ratio(1, 25) < 1.1
    assert ratio(64, 1000) > 3.0
    assert ratio(1, 25) < ratio(1, 1000) < ratio(64, 1000)


def test_refuses_what_it_cannot_describe():
    with pytest.raises(ValueError):
        dt.ModelShape.uniform(layers=2, dim=10, heads=3, ffn=8, vocab=10)
    with pytest.raises(ValueError):
        dt.ModelShape(8, 2, 10, (4,), (8, 8), (4,), (4,), (8,))
    with pytest.raises(ValueError):
        generate(steps=0)
    with pytest.raises(ValueError):
        generate(bandwidth=0)


@pytest.mark.parametrize("variant", ["stock", "heads", "simplified", "composed"])
def test_parameter_counts_agree_with_a_real_fairseq_model(tmp_path, variant):
    """The closed form against the parameters of a fairseq model built in-process (tiny: 2+2 layers, dim 64,
    4 heads, FFN 128, vocab 500; heads and composed with 2 of 4 heads kept in every attention)."""
    from fairseq_sparse.benchmarks import bench_common, composed, composed_measure, composed_variants

    args = composed.parse_args(["--size", "tiny", "--variants", "stock"])
    model, _, _ = bench_common.build_random_model(args, str(tmp_path), composed_variants.arch_flags(args, variant))
    kept = 2 if variant in ("heads", "composed") else None
    shape = dt.ModelShape.uniform(layers=2, dim=64, heads=4, ffn=128, vocab=500, kept_heads=kept,
                                  dec_ffn=variant not in ("simplified", "composed"))
    decoder = dict(model.decoder.named_parameters())
    assert dt.decoder_parameters(shape) == sum(p.numel() for p in decoder.values())
    assert dt.step_weight_parameters(shape) == sum(
        p.numel() for n, p in decoder.items() if not any(f"encoder_attn.{m}_proj" in n for m in "kv"))
    assert dt.encoder_parameters(shape) == sum(p.numel() for n, p in model.encoder.named_parameters()
                                               if "l0drop" not in n)
    # the benchmark reads the same shape off the model
    read = composed_measure.model_shape(model)
    assert dt.ModelShape(**{k: tuple(v) if isinstance(v, list) else v for k, v in read.items()}) == shape
