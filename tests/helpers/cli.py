"""fairseq's console scripts on the session's corpus and checkpoints (conftest.py): the commands of fairseq-train and
fairseq-generate, their runs, reading what they print and log; fairseq-generate's and fairseq-interactive's ``main``
in this process; an L0Drop checkpoint with mixed gates."""
import contextlib
import hashlib
import io
import json
import math
import os
import re
import socket

import pytest
import torch

import fairseq_sparse  # noqa: F401  (allowlists fairseq's checkpoint classes in this process too)
from conftest import TINY_MODEL, TRAIN_COMMON, USER_DIR, console, run
from fairseq_sparse.modules.hard_concrete import DEFAULT_GAMMA, DEFAULT_ZETA


# the safe loader must be what loads checkpoints: never let an override leak in from the environment
ENV = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
# short runs: small batches, a log line every 5 updates, parseable logs
FAST = ["--max-tokens", "400", "--log-interval", "5", "--log-format", "json"]
L0DROP = ["--arch", "transformer_l0drop", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
          "--label-smoothing", "0.1"]
# fairseq (main branch, facebookresearch/fairseq#5036) silently drops the last batch unless its size is a
# multiple of --required-batch-size-multiple (default 8): only 56 of the 60 test sentences would be decoded
GEN_FIX = ["--required-batch-size-multiple", "1"]
# batches loaded in the decoding process: a data-loader worker forked from a test process (a pytest-xdist worker, with
# its threads) held each in-process decoding about 5-15 s past its end (about 280 s of idle wall time in a run)
IN_PROCESS_LOADER = ["--num-workers", "0"]
SPARSITY_RE = re.compile(
    r"fairseq_sparse(?: \| |:)L0Drop sparsity rate ([\d.]+)% \((\d+) of (\d+) source tokens pruned, (\d+) sentences; "
    r"pruned decoding (on|off)\)"
)
N_TEST = 60  # sentences in the corpus fixture's test set


def train_cmd(data_bin, save_dir, extra, max_update=10):
    return ([console("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--save-dir", save_dir,
             "--max-update", str(max_update)] + TRAIN_COMMON + FAST + TINY_MODEL + extra)


def train(data_bin, save_dir, extra, max_update=10, check=True, console=False):
    proc = run(train_cmd(data_bin, save_dir, extra, max_update), check=check, env=ENV, console=console)
    proc.log = proc.stdout + proc.stderr
    return proc


def generate_cmd(data, ckpt, extra=()):
    return [console("fairseq-generate"), data, "--user-dir", USER_DIR, "--path", ckpt, "--beam", "4",
            "--batch-size", "32", "--gen-subset", "test", "--cpu"] + GEN_FIX + IN_PROCESS_LOADER + list(extra)


def generate(data, ckpt, extra=(), check=True, console=False):
    return run(generate_cmd(data, ckpt, extra), check=check, env=ENV, console=console)


def parse_generate(stdout):
    """{'H': {id: (score, hypothesis)}, 'D': same, 'P': {id: [scores]}, 'A': {id: alignment}, 'S': {id: source}}"""
    out = {k: {} for k in "SHDPA"}
    for line in stdout.splitlines():
        m = re.match(r"([SHDPA])-(\d+)\t(.*)$", line)
        if not m:
            continue
        kind, sid, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind in "HD":
            score, _, text = rest.partition("\t")
            out[kind][sid] = (float(score), text)
        elif kind == "P":
            out[kind][sid] = [float(x) for x in rest.split()]
        else:
            out[kind][sid] = rest
    return out


def sparsity_line(proc):
    lines = [l for l in (proc.stdout + proc.stderr).splitlines() if "L0Drop sparsity rate" in l]
    assert len(lines) == 1, f"not one L0Drop sparsity line in fairseq-generate's output:\n{lines or proc.stderr[-2000:]}"
    m = SPARSITY_RE.search(lines[0])
    rate, pruned, tokens, sentences, mode = m.groups()
    return float(rate), int(pruned), int(tokens), int(sentences), mode


def assert_same_decoding(pruned, unpruned, check_alignment=False):
    """Identical hypotheses, scores within 1e-4 (and identical alignments). P- lines are printed
    rounded to 4 decimals: values less than 1e-4 apart print at most one step (1e-4) apart."""
    a, b = parse_generate(pruned.stdout), parse_generate(unpruned.stdout)
    assert len(a["H"]) == N_TEST and set(a["H"]) == set(b["H"])
    for sid in a["H"]:
        assert a["H"][sid][1] == b["H"][sid][1], f"sentence {sid}: hypotheses differ"
        assert abs(a["H"][sid][0] - b["H"][sid][0]) < 1e-4, f"sentence {sid}: scores differ"
        pa, pb = a["P"][sid], b["P"][sid]
        assert len(pa) == len(pb), f"sentence {sid}: P- lines differ"
        assert max(abs(x - y) for x, y in zip(pa, pb)) <= 1e-4 + 1e-9, f"sentence {sid}: P- lines differ"
    if check_alignment:
        assert len(a["A"]) == N_TEST and a["A"] == b["A"]
    return a


def log_records(log, tag="train_inner"):
    """The stats dicts of fairseq's --log-format json lines with this tag (train_inner / train / valid)."""
    records = []
    for line in log.splitlines():
        m = re.search(r"\| (\w+) \| (\{.*\})\s*$", line)
        if m and m.group(1) == tag:
            records.append(json.loads(m.group(2)))
    return records


def safe_load(path):
    """torch's safe loader, in this process (fairseq_sparse is imported: its allowlist is active).
    Every checkpoint written here goes through it: a class missing from the allowlist fails the test."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert "model" in state
    return state


def file_fingerprint(path):
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return digest, os.stat(path).st_mtime_ns


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_mixed_gates(ckpt, data_bin, out_path):
    """A copy of an L0Drop checkpoint whose gate biases are shifted so that each gate closes (g_hat = 0)
    for about half of the test set's source states: a briefly trained model may prune nothing, or
    everything, and pruned decoding is only tested where it drops some states and keeps others."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": data_bin})
    model, encoder = models[0].eval(), models[0].encoder
    task.load_dataset("test")
    data = task.dataset("test")
    batch = data.collater([data[i] for i in range(len(data))])["net_input"]
    real = batch["src_tokens"].ne(task.source_dictionary.pad())
    q = -DEFAULT_GAMMA / (DEFAULT_ZETA - DEFAULT_GAMMA)  # g_hat = 0 iff sigmoid(log alpha) <= q
    threshold = math.log(q / (1 - q))
    gates = list(encoder.layer_l0drops or []) + [encoder.l0drop]  # in the order the forward pass meets them
    for gate in gates:
        captured = []
        hook = gate.log_alpha_proj.register_forward_hook(lambda module, inputs, output: captured.append(output))
        with torch.no_grad():
            encoder(batch["src_tokens"], batch["src_lengths"])
        hook.remove()
        log_alpha = captured[0].squeeze(-1).t()[real]
        gate.log_alpha_proj.bias.data += threshold - float(log_alpha.median())
    state = safe_load(ckpt)
    for name, value in model.state_dict().items():
        if name.endswith("log_alpha_proj.bias"):
            state["model"][name] = value.clone()
    torch.save(state, out_path)
    return out_path


OUTPUT = ("S-", "T-", "H-", "D-", "P-", "A-", "C-")  # what fairseq-generate / -interactive print per sentence


def per_sentence_lines(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith(OUTPUT)]
    assert any(line.startswith("H-") for line in lines), stdout[-2000:]
    return lines


def generate_argv(corpus, path, flags):
    return [corpus["bin"], "--user-dir", USER_DIR, "--path", path, "--gen-subset", "test", "--cpu",
            "--max-tokens", "2000"] + IN_PROCESS_LOADER + list(flags)


def run_main(script, argv, stdin=None):
    """fairseq-generate's or fairseq-interactive's main on ``argv``, in this process; what it printed."""
    from fairseq import options
    from fairseq_cli import generate, interactive

    parser = options.get_generation_parser() if script == "generate" else options.get_interactive_generation_parser()
    args = options.parse_args_and_arch(parser, argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.ExitStack() as stack:
        if stdin is not None:
            stack.enter_context(pytest.MonkeyPatch.context()).setattr("sys.stdin", io.StringIO(stdin))
        (generate if script == "generate" else interactive).main(args)
    return out.getvalue()


SIMPLIFIED = ["--arch", "transformer_simplified_decoder", "--criterion", "label_smoothed_cross_entropy",
              "--label-smoothing", "0.1"]
