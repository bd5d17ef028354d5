"""One measurement of the composed benchmark, in a fresh child process: every variant loaded and timed in
interleaved rounds at one source length (with the stock model's time split by hooks and the machine's bandwidth
and peak rate), or one variant's peak memory."""
import argparse
import os
import time

from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.composed_variants import CT2_VARIANTS, INT8_VARIANTS, SELF_DECODING, TS_VARIANTS


class Ct2Model:
    """The stock model in CTranslate2: translate_batch with fairseq's beam and forced length."""

    def __init__(self, path, compute_type, threads, dictionary):
        import ctranslate2

        self.translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type, inter_threads=1,
                                                 intra_threads=threads)
        self.dictionary = dictionary

    def generate(self, sample, beam, out_len):
        eos = self.dictionary.eos()
        tokens = [[self.dictionary[int(i)] for i in row if int(i) != eos]  # CTranslate2 adds the EOS itself
                  for row in sample["net_input"]["src_tokens"]]
        return self.translator.translate_batch(tokens, beam_size=beam, min_decoding_length=out_len,
                                               max_decoding_length=out_len, return_scores=True)


class ScriptedModel:
    """fairseq-sparse-export's artefact of a loaded model (scripted in memory, not written): fairseq's beam search
    with the output length forced as :func:`bench_common.forced_generator` forces it."""

    def __init__(self, model, task, beam, out_len):
        from fairseq_sparse import export

        options = dict(export.GENERATION_DEFAULTS, beam=beam, max_len_a=0, max_len_b=out_len, min_len=out_len)
        self.translator = export.script_translator(model, task, options, {})

    def generate(self, sample, beam, out_len):
        net_input = sample["net_input"]
        return self.translator(net_input["src_tokens"], net_input["src_lengths"])


def load(spec, variant, length):
    """(model, task) of one variant: a fairseq model in eval mode, a :class:`ScriptedModel` or a :class:`Ct2Model`."""
    import torch
    from fairseq import checkpoint_utils

    path = spec["paths"][variant]
    if variant in CT2_VARIANTS:
        from fairseq.data import Dictionary

        d = Dictionary.load(os.path.join(spec["data"], f"dict.{spec['source_lang']}.txt"))
        return Ct2Model(path, variant.split("_")[1], spec["threads"], d), None
    overrides = {"data": spec["data"]}
    if variant.endswith("_unpruned"):
        overrides["pruned_decoding"] = False
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    model = models[0].eval()
    if variant in INT8_VARIANTS:
        from fairseq_sparse.export import quantise_int8

        model = quantise_int8(model)
    if variant in TS_VARIANTS:
        return ScriptedModel(model, task, spec["beam"], spec["out_len"]), task
    if spec["fp16"]:
        model.half()
    return model.to(torch.device(spec["device"])), task


def encoder_rows(model, sample):
    """The rows each encoder layer ran over and the memory length, on fairseq's generator path; the heads of
    every attention layer, the decoder layers with an FFN, whether the memory is shared by the hypotheses."""
    import torch

    from fairseq_sparse.modules.head_gates import head_layout

    rows, hooks = [], [layer.register_forward_pre_hook(lambda m, a: rows.append(a[0].size(0)))
                       for layer in model.encoder.layers]
    with torch.no_grad():
        out = model.encoder.forward_torchscript(sample["net_input"])
    for h in hooks:
        h.remove()
    src = sample["net_input"]["src_tokens"]
    layout = head_layout(model)
    r = {"enc_rows": rows, "memory_len": out["encoder_out"][0].size(0), "shape": model_shape(model),
         "heads": {t: [n for (kind, _), n in layout.items() if kind == t] for t in ("enc", "dec", "encdec")},
         "dec_ffn": [getattr(layer, "fc1", None) is not None for layer in model.decoder.layers],
         "shared_memory": "l0drop_gates" in out}
    if "l0drop_gates" in out:
        pad = src.eq(model.encoder.padding_idx)
        r["sparsity"] = float(((out["l0drop_gates"][0] == 0) & ~pad).sum()) / float((~pad).sum())
    return r


def model_shape(model):
    """The sizes the bytes-per-step model needs (:class:`fairseq_sparse.analysis.decoding_traffic.ModelShape`'s
    fields), read off a loaded fairseq transformer; None if it is not one this model describes (a decoder
    layer without self- or encoder-decoder attention)."""
    from fairseq_sparse.modules.head_gates import attention_modules, head_layout

    enc, dec = model.encoder, model.decoder
    layout = head_layout(model)
    heads = {t: [n for (kind, _), n in layout.items() if kind == t] for t in ("enc", "dec", "encdec")}
    if not len(heads["dec"]) == len(heads["encdec"]) == len(dec.layers):
        return None
    ffn = [[layer.fc1.out_features if getattr(layer, "fc1", None) is not None else 0 for layer in side.layers]
           for side in (enc, dec)]
    proj = getattr(dec, "output_projection", None)
    return {"dim": dec.embed_tokens.embedding_dim, "head_dim": next(iter(attention_modules(model).values())).head_dim,
            "vocab": proj.out_features, "enc_heads": heads["enc"], "enc_ffn": ffn[0], "dec_heads": heads["dec"],
            "cross_heads": heads["encdec"], "dec_ffn": ffn[1], "tied_output": proj.weight is dec.embed_tokens.weight,
            "dec_final_norm": getattr(dec, "layer_norm", None) is not None,
            "enc_final_norm": getattr(enc, "layer_norm", None) is not None}


def device_rates(spec, clock):
    """Memory bandwidth (GB/s: 2 x the bytes of a tensor copied / time, read and write; CPU 128 MB, CUDA 1 GB)
    and peak FLOP rate (TFLOP/s: a square matmul in the model's precision, CPU 1024, CUDA 8192), each the
    median of 5 timed runs after one untimed (``clock``: the run's --clock; CUDA synchronised); --bandwidth-gbs
    and --peak-tflops replace them."""
    import statistics

    import torch

    cuda = spec["device"] == "cuda"
    dtype = torch.float16 if spec["fp16"] else torch.float32
    out = {"bandwidth_source": "measured", "peak_source": "measured"}

    def median_time(fn):
        fn()
        return statistics.median(bench_common.timed(fn, cuda)[0][1 if clock == "cpu" else 0] for _ in range(5))

    if spec.get("bandwidth_gbs"):
        out.update(bandwidth_gbs=spec["bandwidth_gbs"], bandwidth_source="--bandwidth-gbs")
    else:
        n = (2**30 if cuda else 2**27) // (torch.finfo(dtype).bits // 8)
        src = torch.ones(n, dtype=dtype, device=spec["device"])
        dst = torch.empty_like(src)
        out["bandwidth_gbs"] = 2 * src.numel() * src.element_size() / median_time(lambda: dst.copy_(src)) / 1e9
        del src, dst
    if spec.get("peak_tflops"):
        out.update(peak_tflops=spec["peak_tflops"], peak_source="--peak-tflops")
    else:
        n = 8192 if cuda else 1024
        a = torch.randn(n, n, device=spec["device"]).to(dtype)
        b = torch.randn(n, n, device=spec["device"]).to(dtype)
        out["peak_tflops"] = 2 * n**3 / median_time(lambda: torch.mm(a, b)) / 1e12
    return out


def component_shares(model, gen, sample, clock):
    """Share of one generate's time (``clock``) spent in each part of a fairseq transformer (by hooks)."""
    import torch

    spent, began, hooks = {}, {}, []

    def watch(start_module, end_module, key):
        def start(*_):
            began[key] = clock()

        def end(*_):
            spent[key] = spent.get(key, 0.0) + clock() - began[key]

        hooks.append(start_module.register_forward_pre_hook(start))
        hooks.append(end_module.register_forward_hook(end))

    def watch_method(obj, name, key):  # an instance attribute shadows the class's method until deleted
        method = getattr(obj, name)

        def timed_call(*args, **kwargs):
            t = clock()
            try:
                return method(*args, **kwargs)
            finally:
                spent[key] = spent.get(key, 0.0) + clock() - t

        setattr(obj, name, timed_call)
        patched.append((obj, name))

    patched = []
    watch_method(model.encoder, "reorder_encoder_out", "memory_reorder")
    for i, layer in enumerate(model.encoder.layers):
        watch(layer.self_attn, layer.self_attn, f"enc_attn{i}")
        watch(layer.fc1, layer.fc2, f"enc_ffn{i}")
    for layer in model.decoder.layers:
        watch(layer.self_attn, layer.self_attn, "dec_self")
        watch(layer.encoder_attn, layer.encoder_attn, "dec_cross")
        watch_method(layer.encoder_attn, "reorder_incremental_state", "memory_reorder")
        watch(layer.fc1, layer.fc2, "dec_ffn")
    t0 = clock()
    with torch.no_grad():
        gen.generate([model], sample)
    total = clock() - t0
    for h in hooks:
        h.remove()
    for obj, name in patched:
        delattr(obj, name)
    return {k: v / total for k, v in spent.items()}


def measure_times(spec):
    """Timing child: every variant at one source length, loaded in one process, timed in interleaved rounds."""
    import torch

    bench_common.init_torch(argparse.Namespace(threads=spec["threads"], device=spec["device"]))
    cuda = spec["device"] == "cuda"
    L = spec["length"]
    jobs, facts, task = {}, {}, None
    for v in spec["variants"]:
        model, t = load(spec, v, L)
        task = task or t
        jobs[v] = model
    src, source = bench_common.make_sources(task, L, spec["batch_size"], spec["gen_subset"], spec["seed"] + L)
    torch.save(src, spec["sources"])  # the memory children decode the same sources
    sample = bench_common.source_sample(src.to(torch.device(spec["device"])))
    gens = {v: bench_common.forced_generator(m, task.target_dictionary, spec["beam"], spec["out_len"])
            for v, m in jobs.items() if v not in SELF_DECODING}
    run = {v: (lambda v=v: jobs[v].generate(sample, spec["beam"], spec["out_len"]) if v in SELF_DECODING
               else gens[v].generate([jobs[v]], sample)) for v in jobs}
    for v in jobs:
        facts[v] = {} if v in SELF_DECODING else encoder_rows(jobs[v], sample)
        if v in INT8_VARIANTS:
            facts[v]["shape"] = None  # the bytes-per-step model counts float weights: no prediction
        with torch.no_grad(), bench_common.PeakMemory(cuda) as mem:
            for _ in range(max(1, spec["warmup"])):
                out = run[v]()
        if cuda:
            facts[v]["cuda_peak_mb"] = mem.peak_mb
        if v in CT2_VARIANTS:
            facts[v]["out_lengths"] = sorted({len(h) for r in out for h in r.hypotheses})
        else:
            facts[v]["out_lengths"] = bench_common.out_lengths(out)
            facts[v]["hypos"] = [[h["tokens"].tolist() for h in hs] for hs in out]
            facts[v]["scores"] = [[float(h["score"]) for h in hs] for hs in out]
    clock = time.process_time if spec["clock"] == "cpu" else time.perf_counter
    shares = component_shares(jobs["stock"], gens["stock"], sample, clock)
    with torch.no_grad():
        rounds = bench_common.time_rounds(run, spec["repeats"], cuda)
    for v, r in facts.items():
        r.update(bench_common.clock_medians(rounds[v], spec["clock"]))
    with torch.no_grad():
        rates = device_rates(spec, spec["clock"])
    return {"length": L, "threads": torch.get_num_threads(), "shares": shares, "jobs": facts, "source": source,
            "rates": rates}


def measure_memory(spec):
    """Memory child (CPU): one variant in a fresh process, one generate; peak RSS and RSS after loading."""
    import gc

    import torch

    bench_common.init_torch(argparse.Namespace(threads=spec["threads"], device="cpu"))
    v, L = spec["variant"], spec["length"]
    model, task = load(spec, v, L)
    gc.collect()
    loaded = bench_common.proc_status_mb("VmRSS")
    sample = bench_common.source_sample(torch.load(spec["sources"]))  # the timing child's sources
    with torch.no_grad():
        if v in SELF_DECODING:
            model.generate(sample, spec["beam"], spec["out_len"])
        else:
            bench_common.forced_generator(model, task.target_dictionary, spec["beam"], spec["out_len"]).generate(
                [model], sample)
    return {"rss_loaded_mb": loaded, "peak_rss_mb": bench_common.peak_rss_mb()}
