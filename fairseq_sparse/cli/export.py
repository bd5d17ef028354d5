"""Export a checkpoint to one TorchScript file: the model, fairseq's beam search and the dictionaries.

    fairseq-sparse-export --path checkpoints/checkpoint_best.pt --output model.ts.pt --beam 5
    fairseq-sparse-export --path pruned.pt --output model.int8.ts.pt --int8

The file runs with torch alone (torch.jit.load; no fairseq, no --user-dir), on binarised ids or on
whitespace-separated tokens through its encode / decode methods, with the generation options given here
(fairseq-generate's defaults otherwise). Exported: stock fairseq transformer checkpoints, physically head-pruned
checkpoints (fairseq-sparse-prune-heads), transformer_simplified_decoder, and transformer_l0drop (its compressed
memory, the compacted encoder between layers, so the composed model too); refused before any work, with the
reason: models with head gates (prune them first), the POS encoder output pattern (it reads tags), non-softmax attention
normalisers and the coverage model. --int8: dynamic int8 quantisation of every linear layer. docs/deployment.md
says how to load and call the file.
"""
import hashlib
import logging
import os

from ..checkpoint_safety import data_dir, model_options, read_state
from . import common

logger = logging.getLogger("fairseq_sparse.export")
PROG = "fairseq-sparse-export"


def get_parser():
    from ..export import GENERATION_DEFAULTS as D

    p = common.doc_parser(PROG, __doc__)
    p.add_argument("--path", required=True, metavar="CKPT", help="checkpoint to export")
    p.add_argument("--output", required=True, metavar="FILE", help="the TorchScript file to write")
    p.add_argument("--data", metavar="DIR",
                   help="data directory with the dictionaries (default: the checkpoint's own, if it still exists)")
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--int8", action="store_true",
                   help="dynamic int8 quantisation of every linear layer (torch.ao.quantization.quantize_dynamic)")
    p.add_argument("--no-attention", action="store_true",
                   help="the beam search keeps no attention over the source (no hypotheses x source x steps buffer "
                        "copied at every step): each hypothesis' 'attention' is an empty tensor, its tokens and "
                        "scores are the same (docs/deployment.md)")
    g = p.add_argument_group("generation, fixed in the file (fairseq-generate's options and defaults)")
    g.add_argument("--beam", type=int, default=D["beam"])
    g.add_argument("--max-len-a", type=float, default=D["max_len_a"])
    g.add_argument("--max-len-b", type=int, default=D["max_len_b"])
    g.add_argument("--min-len", type=int, default=D["min_len"])
    g.add_argument("--lenpen", type=float, default=D["lenpen"])
    g.add_argument("--unkpen", type=float, default=D["unkpen"])
    g.add_argument("--no-repeat-ngram-size", type=int, default=D["no_repeat_ngram_size"])
    p.add_argument("--user-dir", help="ignored (the plugin imports itself); accepted for symmetry with fairseq")
    common.add_overwrite_arg(p)  # never lets --output replace --path
    return p


def generation_options(args) -> dict:
    from ..export import GENERATION_DEFAULTS

    return {k: getattr(args, k) for k in GENERATION_DEFAULTS}


def validate(args) -> dict:
    """Every check before a model is built: options, the output (never the input, an existing file only with
    --overwrite), the checkpoint (complete, readable, of an exportable kind). Returns the checkpoint's state."""
    from ..export import refusal

    common.check_finite(args)
    if args.beam < 1:
        raise common.ToolError("--beam must be >= 1")
    if args.min_len < 1 or args.max_len_b < 0 or args.max_len_a < 0 or args.no_repeat_ngram_size < 0:
        raise common.ToolError("--min-len must be >= 1; --max-len-a, --max-len-b and --no-repeat-ngram-size >= 0")
    if args.max_len_a == 0 and args.min_len > args.max_len_b:
        raise common.ToolError(f"--min-len {args.min_len} is longer than the longest output --max-len-b "
                               f"{args.max_len_b}: every translation would fail")
    common.check_output_files([("--output", args.output)], args.overwrite, inputs=[args.path], data=args.data)
    common.check_checkpoint_file(args.path)
    if args.data is not None:
        common.check_data_dir(args.data, "--data")
    try:
        state = read_state(args.path)
        options = model_options(state)
    except Exception as e:
        raise common.ToolError(f"--path: cannot read {args.path}: {type(e).__name__}: {e}") from None
    if args.data is None:  # the checkpoint's own data folder holds the dictionaries it is read with
        common.check_output_files([("--output", args.output)], args.overwrite, data=data_dir(state))
    reason = refusal(options)
    if reason:
        raise common.ToolError(f"cannot export {args.path}: {reason}")
    return state


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv=None):
    from .. import export

    args = get_parser().parse_args(argv)
    try:
        state = validate(args)
        data = args.data or data_dir(state)
        if not os.path.isdir(data):
            raise common.ToolError(f"the checkpoint's data directory {data or '(none)'} is gone: pass --data DIR "
                                   "with its dictionaries")
        del state
        common.setup_logging()
        common.import_plugins()
        model, cfg, task = common.load_checkpoint(args.path, data, args.source_lang, args.target_lang)
        model.eval()
        if args.int8:
            model = export.quantise_int8(model)
        import fairseq
        import torch

        options = generation_options(args)
        arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None)
        metadata = {"format": export.FORMAT_VERSION, "checkpoint": os.path.abspath(args.path),
                    "checkpoint_sha256": sha256(args.path), "arch": arch, "int8": bool(args.int8),
                    "generation": options, "attention": not args.no_attention,
                    "source_lang": task.cfg.source_lang, "target_lang": task.cfg.target_lang,
                    "torch": torch.__version__, "fairseq": fairseq.__version__}
        try:
            scripted = export.script_translator(model, task, options, metadata, beam_attention=not args.no_attention)
        except ValueError as e:
            raise common.ToolError(f"cannot export {args.path}: {e}") from None
    except common.ToolError as e:
        common.fail(PROG, str(e))
    common.write_or_fail(PROG, [(args.output, lambda part: export.save(scripted, part, metadata))])
    size = os.path.getsize(args.output)
    print(f"wrote {args.output} ({size / 2 ** 20:.1f} MiB): {arch}{' int8' if args.int8 else ''}, beam {args.beam}"
          f"{', no attention' if args.no_attention else ''}; "
          "load it with torch.jit.load (docs/deployment.md)")
    return metadata


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
