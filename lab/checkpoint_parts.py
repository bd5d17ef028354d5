#!/usr/bin/env python3
"""Checkpoints that come back from a device call (docs/gpu.md): at most 8 files of 16 MiB each come back, so a
checkpoint is brought back model-only in fp16 (fairseq reads a checkpoint without its optimiser state), and one
over the limit in parts, each a loadable torch file with a share of the model's tensors; `join` puts them together
into one checkpoint that fairseq-generate, the benchmarks and `--baseline-checkpoint` read.

    python3 lab/checkpoint_parts.py split CHECKPOINT DEST.pt [--max-mib 15.5]
        # DEST.pt where it fits, else DEST.part1of2.pt, DEST.part2of2.pt, ...
    python3 lab/checkpoint_parts.py join DEST.pt DEST.part1of2.pt DEST.part2of2.pt
"""
import argparse
import hashlib
import io
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_sparse.checkpoint_safety import read_state  # noqa: E402  (the safe loader, fairseq's classes allowed)


def saved_size(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.tell()


def model_only_fp16(state):
    """STATE without its optimiser state, the model's floating-point tensors in fp16."""
    state = {k: v for k, v in state.items() if k != "last_optimizer_state"}
    state["model"] = {k: v.half() if v.is_floating_point() else v for k, v in state["model"].items()}
    return state


def fingerprint(model):
    """sha1 of the model's tensors (names, shapes, types and bytes, in order): what every part carries and what the
    joined model must have again, so that parts of two checkpoints of one architecture are never mixed."""
    h = hashlib.sha1()
    for name, tensor in model.items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def split(state, max_bytes):
    """STATE as a list of states each saved in at most MAX_BYTES: one where it fits, else parts that each hold
    some of the model's tensors (in order) and the first the rest of the state, numbered "part"/"parts"."""
    if saved_size(state) <= max_bytes:
        return [state]
    rest, empty = {k: v for k, v in state.items() if k != "model"}, saved_size({})
    groups, group, size = [], {}, saved_size(rest)
    for name, tensor in state["model"].items():
        need = tensor.numel() * tensor.element_size() + 1024  # the tensor and its pickled entry
        if need + empty > max_bytes:
            raise ValueError(f"{name}: one tensor of {need / 2**20:.1f} MiB is over the limit of a part")
        if group and size + need > max_bytes:
            groups.append(group)
            group, size = {}, empty
        group[name] = tensor
        size += need
    groups.append(group)
    sha1 = fingerprint(state["model"])
    parts = [{"model": g, "part": i + 1, "parts": len(groups), "names": list(state["model"]), "model_sha1": sha1}
             for i, g in enumerate(groups)]
    parts[0].update(rest)
    return parts


def join(parts):
    """The state the parts of :func:`split` came from; ValueError where parts are missing, repeated or mixed."""
    if len(parts) == 1 and "parts" not in parts[0]:
        return parts[0]
    numbers = sorted(p.get("part", 0) for p in parts)
    if numbers != list(range(1, parts[0].get("parts", 0) + 1)) or len({tuple(p["names"]) for p in parts}) != 1:
        raise ValueError(f"parts {numbers} of {parts[0].get('parts')}: not one checkpoint's parts, each once")
    sha1 = {p.get("model_sha1") for p in parts}
    if len(sha1) != 1 or None in sha1:
        raise ValueError("the parts come from different checkpoints (their model fingerprints differ)")
    state = {k: v for k, v in next(p for p in parts if p["part"] == 1).items()
             if k not in ("part", "parts", "names", "model_sha1")}
    model = {k: v for p in parts for k, v in p["model"].items()}
    state["model"] = {name: model[name] for name in parts[0]["names"]}
    if fingerprint(state["model"]) != sha1.pop():
        raise ValueError("the joined model is not the one that was split (a part was changed or mixed in)")
    return state


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="CHECKPOINT model-only in fp16 as DEST.pt, or in parts DEST.partKofN.pt")
    s.add_argument("checkpoint")
    s.add_argument("dest")
    s.add_argument("--max-mib", type=float, default=15.5, help="the largest file written (default: 15.5 MiB)")
    j = sub.add_parser("join", help="the parts of `split` as one checkpoint DEST")
    j.add_argument("dest")
    j.add_argument("parts", nargs="+")
    a = ap.parse_args(argv)
    dest = a.dest
    if not dest.endswith(".pt"):
        ap.error(f"DEST must end in .pt: {dest}")
    inputs = [a.checkpoint] if a.command == "split" else a.parts
    for path in inputs:
        if not os.path.isfile(path):
            ap.error(f"no such file: {path}")
        if os.path.abspath(path) == os.path.abspath(dest):
            ap.error(f"DEST is an input: {dest}")
    if os.path.exists(dest):
        ap.error(f"DEST exists, not overwritten: {dest}")
    if a.command == "split":
        if not 0 < a.max_mib < 2**20:  # NaN and inf too
            ap.error(f"--max-mib must be > 0 and finite, got {a.max_mib}")
        try:
            parts = split(model_only_fp16(read_state(a.checkpoint)), int(a.max_mib * 2**20))
        except (ValueError, KeyError) as e:  # not a checkpoint (UnreadableCheckpoint), no model, a tensor too big
            ap.error(f"{a.checkpoint}: {e}")
        names = [dest] if len(parts) == 1 else [f"{dest[:-3]}.part{p['part']}of{p['parts']}.pt" for p in parts]
        for name in names:
            if os.path.exists(name):
                ap.error(f"{name} exists, not overwritten")
        for state, name in zip(parts, names):
            torch.save(state, name)
        print("\n".join(names))
    else:
        try:
            state = join([read_state(p) for p in a.parts])
        except ValueError as e:
            ap.error(str(e))
        torch.save(state, dest)
        print(dest)


if __name__ == "__main__":
    main()
