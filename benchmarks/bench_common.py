"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<script>.py``)."""
import time


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
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    args.torch_device = torch.device(args.device)
    return torch


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


def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)
