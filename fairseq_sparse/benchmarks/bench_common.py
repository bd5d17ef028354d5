"""The harness shared by the benchmarks (each run as ``python -m fairseq_sparse.benchmarks.NAME``); each benchmark
keeps only what it measures.

Timing rules of every benchmark: the variants compared are measured side by side in one process, in
interleaved rounds whose order rotates every round (ABC, BCA, CAB, ...), so that load changes on a shared
machine hit all variants alike; each variant's median is reported, and every ratio also as the median of
the per-round ratios ("paired"); the spread of those per-round ratios is printed as the run's noise. Both
clocks are recorded, the wall clock (CUDA synchronised) and the process's CPU time (``time.process_time``);
``--clock`` picks the one behind speeds and ratios (``cpu``, with ``--threads 1``, is steadier on a busy
machine).

Here: model sizes, the dummy dictionary, a random fairseq model built from a fairseq-train command line,
random sources, a SequenceGenerator with forced output length, peak memory, the timing rounds, machine
facts, the options all benchmarks share and the JSON writer.
"""
import contextlib
import ctypes
import gc
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

#: the plugin package (fairseq's --user-dir)
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_POSITIONS = 2048  # --max-source/target-positions of the random models (sources of up to 2,000 tokens)
#: sentences in the random models' gate-calibration batch (on the CPU, whatever the benchmark's batch: at
#: batch 64 and 1,000 tokens the composed benchmark spent over 2 minutes calibrating on the GPU machine's CPU)
CALIBRATION_SENTENCES = 10

#: name -> (layers per side, dim, heads, FFN dim, joined vocabulary)
SIZES = {
    "base": (6, 512, 8, 2048, 8000),    # transformer / transformer_wmt_en_de (Vaswani et al. 2017, base)
    "big": (6, 1024, 16, 4096, 8000),   # transformer_vaswani_wmt_en_de_big
    "iwslt": (6, 512, 4, 1024, 8000),   # transformer_iwslt_de_en
    "small": (3, 256, 4, 1024, 8000),
    "tiny": (2, 64, 4, 128, 500),       # the tests' tiny model (smoke runs)
}
SIZE_FIELDS = ("layers", "dim", "heads", "ffn", "vocab")
SIZE_HELP = {"layers": "encoder and decoder layers", "dim": "embedding dim", "heads": "attention heads per layer",
             "ffn": "FFN dim", "vocab": "joined vocabulary size"}

# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------

def add_size_args(p, preset_flag=None, presets=(), default="base", help_prefix=""):
    """--layers, --dim, --heads, --ffn, --vocab of the random model. With ``preset_flag`` (e.g. --size) a
    preset among ``presets`` whose numbers they override (see :func:`check_size_args`); without, their
    defaults are the ``default`` preset's."""
    if preset_flag:
        p.add_argument(preset_flag, default=default, choices=sorted(presets),
                       help=f"model size preset (default {default})")
    for name, value in zip(SIZE_FIELDS, SIZES[default]):
        tail = f" (overrides {preset_flag})" if preset_flag else ""
        p.add_argument(f"--{name}", type=int, default=None if preset_flag else value,
                       help=f"{help_prefix}{SIZE_HELP[name]}{tail}")


def check_size_args(p, args, preset=None):
    """Fill the sizes left unset from ``preset``; every size positive, the dim a multiple of the heads."""
    for name, value in zip(SIZE_FIELDS, SIZES[preset] if preset else (None,) * len(SIZE_FIELDS)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(getattr(args, name) for name in SIZE_FIELDS) < 1:
        p.error("--layers, --dim, --heads, --ffn and --vocab must be positive")
    if args.vocab < 5:
        p.error("--vocab must leave room for a word besides fairseq's 4 special symbols (>= 5)")
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} is not a multiple of --heads {args.heads}")


def add_run_args(p, repeats=3, threads=1):
    """The options of every benchmark's timing: --beam, --repeats, --warmup, --no-memory, --seed, --threads,
    --clock, --device, --cpu, --fp16, --json."""
    p.add_argument("--beam", type=int, default=4, help="beam size of the SequenceGenerator (default 4)")
    p.add_argument("--repeats", type=int, default=repeats,
                   help=f"timed rounds per measurement (median reported; default {repeats})")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per variant before the rounds")
    p.add_argument("--no-memory", action="store_true", help="skip the (untimed) peak-memory measurements")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=threads,
                   help=f"torch CPU threads (default {threads}; 0: torch's default)")
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="time behind speeds and ratios: wall clock (default) or the process's CPU time (CPU only; "
                        "steadier on a shared, loaded machine, best with --threads 1)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="default: cuda where torch sees a CUDA device, else cpu (cpu with --clock cpu)")
    p.add_argument("--cpu", action="store_true", help="the same as --device cpu")
    p.add_argument("--fp16", action="store_true", help="CUDA only: half precision")
    p.add_argument("--json", metavar="OUT", help="write all results here")


def resolve_device(p, args):
    """args.device from --device / --cpu (the tools' rule: cuda where available; cpu with --clock cpu); --device
    cuda without CUDA refused in one line."""
    from fairseq_sparse.cli.common import default_device, device_error

    if args.cpu and args.device == "cuda":
        p.error("--cpu and --device cuda contradict each other: give one")
    if args.cpu or (args.device is None and args.clock == "cpu"):
        args.device = "cpu"
    args.device = args.device or default_device()
    if device_error(args.device):
        raise SystemExit(f"{p.prog}: error: {device_error(args.device)}")


def check_run_args(p, args):
    """Refuse what the options of :func:`add_run_args` cannot honour, before anything is built or timed."""
    from fairseq_sparse.cli.common import ToolError, check_output_files

    resolve_device(p, args)
    if args.fp16 and args.device != "cuda":
        p.error("--fp16 needs --device cuda")
    if args.clock == "cpu" and args.device != "cpu":
        p.error("--clock cpu is for CPU runs (--device cpu)")
    check_range(p, "--beam", args.beam, 1, None)
    check_range(p, "--repeats", args.repeats, 1, None)
    check_range(p, "--warmup", args.warmup, 0, None)
    check_range(p, "--threads", args.threads, 0, None)
    try:
        check_output_files([("--json", args.json)], overwrite=True)
    except ToolError as e:
        p.error(str(e))


def check_range(p, option, value, low, high=MAX_POSITIONS):
    """low <= value (<= high unless None; the default: a sequence length the random models can hold)."""
    if value < low or (high is not None and value > high):
        p.error(f"{option} {value}: must be " + (f"in {low}..{high}" if high is not None else f">= {low}"))


def apply_quick(args, caps, defaults=None):
    """--quick: each option of ``caps`` ({name: value}) lowered to at most that value; each option of
    ``defaults`` ({name: (default, quick value)}) replaced when it was left at its default."""
    for name, cap in caps.items():
        setattr(args, name, min(getattr(args, name), cap))
    for name, (default, quick) in (defaults or {}).items():
        if getattr(args, name) == default:
            setattr(args, name, quick)


def int_list(p, option, text, low=1):
    """A comma list of integers >= low, or a clear error."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"{option}: not a comma list of integers: {text!r}")
    if not values or min(values) < low:
        p.error(f"{option}: give integers >= {low}")
    return values


# ---------------------------------------------------------------------------------------------
# process set-up and machine facts
# ---------------------------------------------------------------------------------------------

def quiet():
    """No warnings or info logs between the measurements."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def init_torch(args):
    """What every benchmark does before building models: quiet logs, the plugin's models registered,
    torch threads (``--threads``) and device (``--device``, also set as ``args.torch_device``). Returns torch."""
    quiet()
    import torch

    import fairseq_sparse  # noqa: F401  (registers the plugin's models and safe checkpoint loading)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():  # a child: the parent checked its options
        raise SystemExit("--device cuda: no CUDA device")
    args.torch_device = torch.device(args.device)
    return torch


def loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


def start(args):
    """The start of a benchmark run: a SIGTERM ends it like Ctrl-C (subprocess.run then kills a measuring
    child too); a warning when wall-clock timings on the CPU share a busy machine. Returns what
    :func:`machine_facts` and :func:`finish` need."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cores = len(os.sched_getaffinity(0))
    if args.device == "cpu" and args.clock == "wall" and os.getloadavg()[0] > 0.5 * cores:
        print(f"warning: this machine is busy (load average {os.getloadavg()[0]:.1f} on {cores} cores): wall-clock "
              f"timings can be off by a factor of several here; consider --threads 1 --clock cpu", flush=True)
    return {"t_start": time.time(), "loadavg_before": loadavg()}


def machine_facts(args, started):
    """device (with fp16 and the GPU's name), torch threads, cores, torch version, load average before / after."""
    import torch

    device = args.device + (" fp16" if args.fp16 else "")
    if args.device == "cuda":
        device += f" ({torch.cuda.get_device_name()})"
    return {"device": device, "threads": torch.get_num_threads(), "cores": len(os.sched_getaffinity(0)),
            "torch": torch.__version__, "loadavg_before": started["loadavg_before"], "loadavg_after": loadavg()}


def settings_of(args):
    """The run's options as its JSON records them."""
    return {k: v for k, v in vars(args).items() if k != "torch_device" and not k.startswith("_")}


def finish(args, started, meta, results):
    """Print the total time (also meta["elapsed_s"]); with --json, write {"settings", "meta", **results}."""
    from fairseq_sparse.cli.common import write_json

    meta["elapsed_s"] = time.time() - started["t_start"]
    print(f"total time {meta['elapsed_s']:.0f} s")
    if args.json:
        write_json(args.json, {"settings": settings_of(args), "meta": meta, **results})
        print(f"results written to {args.json}")


# ---------------------------------------------------------------------------------------------
# measuring children: one fresh process per measurement
# ---------------------------------------------------------------------------------------------

def run_child(module, workdir, spec):
    """Run ``python -m MODULE --_child SPEC`` (one measurement in a fresh process) and return the JSON it wrote;
    its output tail and a clear error if it failed."""
    out = os.path.join(workdir, f"child_{spec['mode']}_{spec.get('variant', 'all')}_{spec['length']}.json")
    spec = dict(spec, out=out)
    proc = subprocess.run([sys.executable, "-m", module, "--_child", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"measurement {spec['mode']} {spec.get('variant', '')} @ {spec['length']} failed "
                         f"({proc.returncode})")
    with open(out) as f:
        return json.load(f)


def measure_or_run(args, measure_times, measure_memory, prefix, run):
    """A benchmark's main: in a measuring child (``--_child``) its one measurement, written as JSON; otherwise
    ``run(args, workdir)`` in ``--workdir`` or a temporary folder named PREFIX..."""
    if args._child:
        spec = json.loads(args._child)
        res = measure_times(spec) if spec["mode"] == "times" else measure_memory(spec)
        with open(spec["out"], "w") as f:
            json.dump(res, f)
        return
    with workdir(args.workdir, prefix) as folder:
        run(args, folder)


@contextlib.contextmanager
def workdir(path, prefix):
    """``--workdir`` (created, kept) or a temporary folder removed at the end."""
    if path:
        os.makedirs(path, exist_ok=True)
        yield os.path.abspath(path)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield tmp


# ---------------------------------------------------------------------------------------------
# the random model and its inputs
# ---------------------------------------------------------------------------------------------

def write_dummy_dictionary(data_dir, vocab):
    """A joined dictionary of ``vocab`` entries (fairseq's 4 specials + dummy words) as dict.{src,tgt}.txt."""
    os.makedirs(data_dir, exist_ok=True)
    for lang in ("src", "tgt"):
        with open(os.path.join(data_dir, f"dict.{lang}.txt"), "w") as f:
            f.writelines(f"w{i} {vocab - i}\n" for i in range(vocab - 4))


def model_command(args, data_dir, arch_flags):
    """The fairseq-train command line of a model of args' size (--layers ...) on the dummy data, shared
    embeddings, seed --seed, followed by ``arch_flags`` (--arch and any other option)."""
    from fairseq_sparse.recipe.commands import model_flags

    return [data_dir, "--user-dir", USER_DIR, "--task", "translation", "-s", "src", "-t", "tgt",
            "--seed", str(args.seed), *model_flags(args.layers, args.dim, args.ffn, args.heads),
            "--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS),
            *arch_flags]


def build_random_model(args, data_dir, arch_flags, as_config=False):
    """(model, task, cfg) with random weights (torch seeded with --seed): the dummy dictionary of --vocab
    words written into ``data_dir``, then fairseq's training parser, task and model registries on
    :func:`model_command`. cfg: the parsed argparse Namespace, or its omegaconf config if ``as_config``
    (the task and model are then built from that)."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    write_dummy_dictionary(data_dir, args.vocab)
    cfg = options.parse_args_and_arch(options.get_training_parser(), model_command(args, data_dir, arch_flags))
    if as_config:
        cfg = convert_namespace_to_omegaconf(cfg)
    torch.manual_seed(args.seed)
    task = tasks.setup_task(cfg.task if as_config else cfg)
    model = task.build_model(cfg.model if as_config else cfg)
    assert len(task.source_dictionary) == args.vocab, (len(task.source_dictionary), args.vocab)
    return model, task, cfg


#: HardConcrete with gamma=-0.1, zeta=1.1: g_hat = 0 iff log alpha <= -log 11
LOG_11 = math.log(11.0)


def close_gate_at_quantile(proj, scores, w, share):
    """Set an L0Drop gate's log alpha = x.(k w) + b (``proj``: its log_alpha_proj) so that it closes (g_hat = 0)
    for the share ``share`` of the states whose x.w are ``scores``, and almost every open gate is fully
    open (steep k). w: a fixed random direction; with random weights this is how benchmarks get a sparsity."""
    import torch

    q = torch.quantile(scores, share).item() if share > 0 else scores.min().item() - 1.0
    k = 50.0 / max(scores.std().item(), 1e-6)
    with torch.no_grad():
        proj.weight.copy_((k * w).unsqueeze(0))
        proj.bias.fill_(-k * q - LOG_11)


def random_sources(dictionary, batch, length, generator):
    """batch x length token ids (random words, EOS last), as fairseq's translation task makes them.
    generator: a torch.Generator, or an int seed for a fresh one."""
    import torch

    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    src = torch.randint(dictionary.nspecial, len(dictionary), (batch, length), generator=generator)
    src[:, -1] = dictionary.eos()
    return src


def make_sources(task, length, batch, subset, seed):
    """(batch x length sources, what they are): consecutive sentences of the task's ``subset``, concatenated and
    cut (EOS last), or random tokens when the subset is missing."""
    import torch

    d = task.source_dictionary
    try:
        task.load_dataset(subset)
        ds = task.dataset(subset).src
    except Exception:
        ds = None
    if ds is None or len(ds) == 0:
        return random_sources(d, batch, length, seed), "random tokens"
    need, stream, i = batch * (length - 1), [], 0
    while sum(t.numel() for t in stream) < need:
        t = ds[i % len(ds)]
        stream.append(t[t.ne(d.eos())])
        i += 1
    words = torch.cat(stream)[:need].view(batch, length - 1)
    src = torch.cat([words, torch.full((batch, 1), d.eos(), dtype=words.dtype)], dim=1)
    return src, f"{subset} sentences, concatenated"


def source_sample(src):
    """fairseq's sample of a batch of equal-length sources (no padding)."""
    import torch

    n, length = src.shape
    return {"id": torch.arange(n, device=src.device),
            "net_input": {"src_tokens": src, "src_lengths": torch.full((n,), length, device=src.device)}}


def forced_generator(model, target_dictionary, beam, out_len):
    """fairseq's SequenceGenerator (beam search) with the output length forced: ``min_len = max_len =
    out_len`` (max_len_a=0, max_len_b=min_len=out_len), so every hypothesis has out_len tokens + EOS and
    every variant runs the same number of beam steps whatever its weights. The plugin's decoders keep no beam
    attention, as in fairseq-generate without --print-alignment (its ``prepare_for_inference_`` switches it
    off; fairseq's own decoder keeps it whatever); set here directly, since that call also forbids training
    the model afterwards."""
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_sparse.modules.beam_attention import BeamAttentionOption

    if isinstance(getattr(model, "decoder", None), BeamAttentionOption):
        model.decoder.beam_attention = False

    return SequenceGenerator([model], target_dictionary, beam_size=beam, max_len_a=0, max_len_b=out_len,
                             min_len=out_len)


def out_lengths(hypos):
    """The distinct hypothesis lengths (EOS included) of a generate's output, sorted."""
    return sorted({len(h["tokens"]) for hs in hypos for h in hs})


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------

_LIBC = None


def release_memory():
    """gc, then glibc's malloc_trim: freed memory goes back to the system before a measurement."""
    global _LIBC
    gc.collect()
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    except OSError:
        pass


def proc_status_mb(field):
    """A memory field of /proc/self/status (VmRSS, VmHWM, ...) in MB, or None."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return None


def peak_rss_mb():
    """The process's peak resident set size so far (ru_maxrss), MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakMemory:
    """Peak memory a block adds (``mb``, MB). CPU: VmHWM (reset via /proc/self/clear_refs, after gc and
    malloc_trim) minus VmRSS before; CUDA: max_memory_allocated minus memory_allocated before, and
    ``peak_mb`` the absolute max_memory_allocated. (tracemalloc does not see PyTorch's tensor memory.)"""

    def __init__(self, cuda):
        self.cuda, self.mb, self.peak_mb = cuda, None, None

    def __enter__(self):
        import torch

        release_memory()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS to the current RSS (Linux >= 4.0)
            self.base = proc_status_mb("VmRSS")
        except OSError:
            self.base = None
        return self

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.peak_mb = torch.cuda.max_memory_allocated() / 2**20
            self.mb = self.peak_mb - self.base / 2**20
        elif self.base is not None:
            self.peak_mb = proc_status_mb("VmHWM")
            self.mb = None if self.peak_mb is None else self.peak_mb - self.base
        return False


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------

def timed(fn, cuda=False):
    """((wall seconds, CPU seconds of this process), fn()); CUDA is synchronised around the call."""
    import torch

    if cuda:
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0, time.process_time() - c0), out


def time_rounds(fns, repeats, cuda=False, then=None):
    """Interleaved timing rounds: round k runs every fns[name]() once, in the order rotated by k (ABC,
    BCA, CAB, ...). ``then``: name -> a callable timed right after that variant's run (e.g. its encoder
    alone). Returns name -> {"wall": [s per round], "cpu": [...], "then_wall": [...], "then_cpu": [...]}."""
    names = list(fns)
    res = {n: {"wall": [], "cpu": [], "then_wall": [], "then_cpu": []} for n in names}
    for k in range(repeats):
        for name in names[k % len(names):] + names[:k % len(names)]:
            steps = [(fns[name], "")] + ([(then[name], "then_")] if then and name in then else [])
            for fn, prefix in steps:
                (w, c), _ = timed(fn, cuda)
                res[name][prefix + "wall"].append(w)
                res[name][prefix + "cpu"].append(c)
    return res


def clock_medians(rounds, clock, prefix=""):
    """From one variant's :func:`time_rounds` entry: wall_times_s and cpu_times_s (per round), times_s (those
    of --clock), and their medians wall_s, cpu_s, time_s."""
    wall, cpu = rounds[prefix + "wall"], rounds[prefix + "cpu"]
    times = cpu if clock == "cpu" else wall
    return {"wall_times_s": wall, "cpu_times_s": cpu, "times_s": times, "wall_s": statistics.median(wall),
            "cpu_s": statistics.median(cpu), "time_s": statistics.median(times)}


def paired_ratios(base_times, times):
    """base / variant time, round by round."""
    return [a / b for a, b in zip(base_times, times)]


def speedup(base, r):
    """(ratio of the medians, paired ratio: median of the per-round ratios) of time(base) / time(r), from
    two :func:`clock_medians` results: > 1 when r is faster."""
    return base["time_s"] / r["time_s"], statistics.median(paired_ratios(base["times_s"], r["times_s"]))


def noise_line(comparisons):
    """How noisy a run was, one line: comparisons is {label: (base times, variant times)} per round; the
    spread of a comparison is (max - min) / median of its per-round ratios (0 on a quiet machine)."""
    spreads = {}
    for label, (base_times, times) in comparisons.items():
        ratios = paired_ratios(base_times, times)
        if len(ratios) > 1:
            spreads[label] = (max(ratios) - min(ratios)) / statistics.median(ratios)
    if not spreads:
        return "noise: one round per variant, so no spread of the per-round ratios to show (--repeats >= 2)"
    worst = max(spreads, key=spreads.get)
    return (f"noise: the per-round ratios spread by {statistics.median(spreads.values()):.1%} (median over "
            f"{len(spreads)} comparisons; (max - min) / median), at most {spreads[worst]:.1%} ({worst})")


def print_rounds(name, r, width, note=""):
    """A progress line: a variant's median and its rounds (of --clock), then ``note``."""
    print(f"  {name:>{width}}: {r['time_s']:.3f} s (rounds: {', '.join(f'{t:.3f}' for t in r['times_s'])}){note}",
          flush=True)


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------

def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def memory_cell(r, cuda):
    """A variant's memory column: its CUDA peak MB, or on the CPU its peak RSS MB with the RSS after loading in
    parentheses ("-" where the memory child did not run)."""
    if cuda:
        return fmt(r.get("cuda_peak_mb"), "{:.0f}")
    if not r.get("peak_rss_mb"):
        return "-"
    return f"{fmt(r.get('peak_rss_mb'), '{:.0f}')} ({fmt(r.get('rss_loaded_mb'), '{:.0f}')})"


def pct(x):
    """A speed ratio as a change: 1.12 -> +12.0%."""
    return "-" if x is None else f"{x - 1:+.1%}"


def print_header(hdr):
    """A table's header line and its rule."""
    print(hdr)
    print("-" * len(hdr))
