"""The composed benchmark's rows and printed table: ratios against stock, the Amdahl bound of each variant from
stock's time split and the bytes-per-step model's prediction (composed.py's docstring), TorchScript and pruned
decoding against the models they must agree with."""
from fairseq_sparse.benchmarks import bench_common
from fairseq_sparse.benchmarks.bench_common import fmt, print_header
from fairseq_sparse.benchmarks.composed_variants import CT2_VARIANTS, TS_VARIANTS


def amdahl_bound(shares, r, stock, length, beam):
    """1 / (1 - the share of the stock model's time the variant ``r`` removes), see the module docstring; the
    variant's structure as measured (rows, memory, heads per layer, decoder FFNs) against stock's."""
    if "enc_rows" not in r:  # CTranslate2: another engine
        return None

    def kept(kind, i):
        return r["heads"][kind][i] / stock["heads"][kind][i]

    mem = r["memory_len"] / length
    per_sentence = 1.0 / beam if r["shared_memory"] else 1.0  # keys and values projected and read per sentence
    removed = shares.get("memory_reorder", 0.0) if r["shared_memory"] else 0.0
    for i, n in enumerate(r["enc_rows"]):
        f = n / length
        removed += shares.get(f"enc_attn{i}", 0.0) * (1 - kept("enc", i) * f * f)
        removed += shares.get(f"enc_ffn{i}", 0.0) * (1 - f)
    layers = len(r["dec_ffn"])
    for i in range(layers):  # decoder shares are summed over layers: each layer counts 1 / layers of them
        removed += shares.get("dec_self", 0.0) / layers * (1 - kept("dec", i)) if stock["heads"]["dec"] else 0.0
        removed += shares.get("dec_cross", 0.0) / layers * (1 - kept("encdec", i) * mem * per_sentence)
        removed += 0.0 if r["dec_ffn"][i] else shares.get("dec_ffn", 0.0) / layers
    return 1.0 / max(1.0 - removed, 1e-9)


def traffic_prediction(args, r, rates):
    """The bytes-per-step model's prediction of one variant's generate (module docstring of
    :mod:`fairseq_sparse.analysis.decoding_traffic`): {"reads": ..., "copies": ...} (without and with fairseq's
    per-step copies), each decoding_time's result; None for CTranslate2 or a model it does not describe."""
    from fairseq_sparse.analysis import decoding_traffic as dt

    if not r.get("shape"):
        return None
    shape = dt.ModelShape(**{k: tuple(v) if isinstance(v, list) else v for k, v in r["shape"].items()})
    common = dict(enc_rows=r["enc_rows"], memory_len=r["memory_len"], sentences=args.batch_size, beam=args.beam,
                  steps=args.out_len + 1, shared_memory=r["shared_memory"], element_bytes=2 if args.fp16 else 4,
                  bandwidth=rates["bandwidth_gbs"] * 1e9, peak_flops=rates["peak_tflops"] * 1e12)
    return {kind: dt.decoding_time(shape, copies=kind == "copies", **common) for kind in ("reads", "copies")}


def same_share(a, b):
    """The share of the hypotheses (every n-best entry of every sentence) identical in a and b."""
    pairs = [(x, y) for p, q in zip(a, b) for x, y in zip(p, q)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def summarise(args, timing, memory):
    rows = []
    for L, res in sorted(timing.items()):
        jobs, stock = res["jobs"], res["jobs"]["stock"]
        row = {"length": L, "shares": res["shares"], "rates": res["rates"], "variants": {}}
        predicted = {v: traffic_prediction(args, r, res["rates"]) for v, r in jobs.items()}
        for v, r in jobs.items():
            ratio, paired = bench_common.speedup(stock, r)
            pred, base = predicted[v], predicted["stock"]
            row["variants"][v] = dict({k: r.get(k) for k in ("time_s", "times_s", "wall_s", "cpu_s", "wall_times_s",
                                                             "cpu_times_s", "enc_rows", "memory_len", "sparsity",
                                                             "heads", "dec_ffn", "shared_memory", "out_lengths",
                                                             "cuda_peak_mb", "shape")},
                                      vs_stock=ratio, vs_stock_paired=paired,
                                      bound=amdahl_bound(res["shares"], r, stock, L, args.beam),
                                      traffic=pred,
                                      vs_stock_bytes=(base["reads"]["time_s"] / pred["reads"]["time_s"]
                                                      if pred else None),
                                      vs_stock_bytes_copies=(base["copies"]["time_s"] / pred["copies"]["time_s"]
                                                             if pred else None),
                                      **memory.get((v, L), {}))
        # each TorchScript artefact against the eager model it was scripted from (same weights, same sources)
        row["ts_same_hypotheses"] = {v: same_share(jobs[v]["hypos"], jobs[v[:-3]]["hypos"])
                                     for v in TS_VARIANTS if v in jobs and v[:-3] in jobs}
        if "layers" in jobs and "layers_unpruned" in jobs:
            a, b = jobs["layers"], jobs["layers_unpruned"]
            row["pruned_vs_unpruned"], row["pruned_vs_unpruned_paired"] = bench_common.speedup(b, a)
            row["identical_hypotheses"] = a["hypos"] == b["hypos"]
            row["max_score_diff"] = max(abs(x - y) for p, q in zip(a["scores"], b["scores"]) for x, y in zip(p, q))
        rows.append(row)
    return rows


def variant_line(v, r, cuda):
    """One variant's row of the printed table."""
    enc_rows = "/".join(str(n) for n in r["enc_rows"]) if r.get("enc_rows") else "-"
    pred_ms = r["traffic"]["copies"]["time_s"] * 1e3 if r["traffic"] else None
    return (f"{v:>15} {r['time_s']:>8.3f} {r['vs_stock']:>7.2f}x {r['vs_stock_paired']:>7.2f}x "
            f"{fmt(r['bound'], '{:.2f}x'):>6} {fmt(r['vs_stock_bytes'], '{:.2f}x'):>6} "
            f"{fmt(r['vs_stock_bytes_copies'], '{:.2f}x'):>7} {fmt(pred_ms, '{:.3g}'):>7} "
            f"{fmt(r.get('sparsity'), '{:.1%}'):>8} {enc_rows:>16} "
            f"{fmt(r.get('memory_len'), '{}'):>6}  {bench_common.memory_cell(r, cuda)}")


def print_report(args, rows, meta):
    print()
    print(f"Composed model benchmark: {meta['model']}")
    print(f"device {meta['device']}, torch threads {meta['threads']}, batch {args.batch_size}, beam {args.beam}, output "
          f"forced to {args.out_len} tokens, median of {args.repeats} interleaved rounds after {args.warmup} warm-up; "
          f"sources: {meta['source']}")
    if not args._paths:
        print(f"assumed: output sparsity {args.sparsity:.1%}; cumulative sparsity after encoder layers "
              f"1..{args.layers - 1}: {', '.join(f'{r:.1%}' for r in args._layer_rates)}; heads removed per layer and "
              f"type: {round(args.heads * args.heads_pruned)} of {args.heads}")
    mem_name = "CUDA peak MB" if args.device == "cuda" else "peak RSS MB (loaded)"
    for row in rows:
        _print_length(args, row, mem_name)
    _print_legend(args, rows)
    meta["noise"] = bench_common.noise_line({f"{v} vs stock, {row['length']} tokens": (row["variants"]["stock"]["times_s"],
                                                                                        r["times_s"])
                                             for row in rows for v, r in row["variants"].items() if v != "stock"})
    print(meta["noise"])
    print(f"load average before / after: {meta['loadavg_before']} / {meta['loadavg_after']}")


def _print_length(args, row, mem_name: str):
    """One source length's part of the report: stock's time split, the bytes model and the variants' table."""
    print()
    print(f"source length {row['length']}; stock's time: " + ", ".join(
        f"{k} {v:.0%}" for k, v in sorted(row["shares"].items(), key=lambda kv: -kv[1]) if v >= 0.01))
    rates, base = row["rates"], row["variants"]["stock"]["traffic"]
    print(f"bytes model: {rates['bandwidth_gbs']:.1f} GB/s ({rates['bandwidth_source']}), "
          f"{rates['peak_tflops'] * 1e3:.1f} GFLOP/s ({rates['peak_source']}); stock's mean step reads "
          + ", ".join(f"{k} {b / 1e6:.1f} MB" for k, b in base["copies"]["step_bytes"].items())
          + f"; predicted {base['reads']['time_s'] * 1e3:.3g} ms (+copies {base['copies']['time_s'] * 1e3:.3g} ms; "
          f"{base['copies']['memory_bound_share']:.0%} of the steps memory-bound), measured "
          f"{row['variants']['stock']['time_s'] * 1e3:.3g} ms")
    print_header(f"{'variant':>15} {args.clock + ' s':>8} {'vs stock':>8} {'(paired)':>8} {'bound':>6} "
                 f"{'bytes':>6} {'+copies':>7} {'pred ms':>7} {'sparsity':>8} {'encoder rows':>16} {'memory':>6}  "
                 f"{mem_name}")
    for v, r in row["variants"].items():
        print(variant_line(v, r, args.device == "cuda"))
    for v, share in row.get("ts_same_hypotheses", {}).items():
        print(f"{v}: {share:.0%} of the hypotheses identical to {v[:-3]}'s (the eager model it was scripted from)")
    if "pruned_vs_unpruned" in row:
        print(f"layers / layers_unpruned (compaction and pruned memory on one checkpoint): "
              f"{row['pruned_vs_unpruned']:.2f}x (paired {row['pruned_vs_unpruned_paired']:.2f}x); identical "
              f"hypotheses: {'yes' if row['identical_hypotheses'] else 'NO'} (max score diff "
              f"{row['max_score_diff']:.1e})")


def _print_legend(args, rows):
    """What the columns of the variants' tables mean, and the CTranslate2 output lengths."""
    print()
    print("vs stock: time(stock) / time(variant); (paired): median of the per-round ratios; bound: Amdahl bound from "
          "stock's time split (see the docstring);")
    print("bytes, +copies: time(stock) / time(variant) predicted by the bytes-per-step roofline model (weights, "
          "cross- and self-attention keys/values, logits read per step at the bandwidth, or FLOPs at the peak rate, "
          "whichever is slower; +copies: with fairseq's per-step cache copies); pred ms: its time with copies;")
    print("encoder rows: rows each encoder layer ran over (compacted: 1 + most kept states); memory: source states the "
          "decoder attends to.")
    if args.device == "cpu" and not args.no_memory:
        print(f"peak RSS at {max(r['length'] for r in rows)} tokens: ru_maxrss of a fresh process that loads one "
              "model and runs one generate (model + libraries + decoding); (loaded): its RSS before decoding.")
    ct2 = [v for v in rows[0]["variants"] if v in CT2_VARIANTS]
    if ct2:
        lengths = rows[0]["variants"][ct2[0]]["out_lengths"]
        print(f"CTranslate2 output lengths {lengths} (fairseq: {args.out_len} + EOS).")
