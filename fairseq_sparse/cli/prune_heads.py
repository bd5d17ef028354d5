"""Export a physically smaller checkpoint: attention heads cut out of the q/k/v and output projections.

    # heads whose trained gate is closed (g_hat = 0; transformer_head_gates or --head-gates models)
    fairseq-sparse-prune-heads --path gated/checkpoint_best.pt --output pruned.pt
    # heads masked by a head mask JSON (e.g. written by fairseq-sparse-heads prune-curve --write-mask)
    fairseq-sparse-prune-heads --path stock/checkpoint_best.pt --head-mask mask.json --output pruned.pt

Gate values between 0 and 1 (and mask values) are folded into the kept heads' output-projection
columns, so the exported model computes what the gated / masked model computed (paper 001: at test
time the gated model is a standard Transformer with a subset of heads; paper 003 Sec. 4.2: actually
pruning the heads, not just masking, is what makes it faster). Layers may keep different numbers of
heads; the kept head ids go into the checkpoint's model args (``--kept-heads``), so plain
``fairseq-generate --user-dir fairseq_sparse --path pruned.pt`` builds the smaller model. A stock
``transformer`` checkpoint is exported as ``transformer_head_gates`` without gates.
"""
import argparse
import json
import logging
import os
import sys

from fairseq import checkpoint_utils, tasks

logger = logging.getLogger("fairseq_sparse.prune_heads")


def get_parser():
    p = argparse.ArgumentParser(
        prog="fairseq-sparse-prune-heads",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--path", required=True, metavar="CKPT", help="checkpoint to prune")
    p.add_argument("--output", required=True, metavar="FILE", help="where to write the pruned checkpoint")
    p.add_argument("--head-mask", metavar="JSON", help="head mask {\"enc\": [[1, 0, ...], ...], \"dec\": ..., "
                   "\"encdec\": ...}: heads with value 0 are removed, other values are folded into the weights; "
                   "without it, heads whose gate g_hat is 0 are removed (the model must have head gates)")
    p.add_argument("--min-heads-per-layer", type=int, default=0, metavar="N",
                   help="refuse to prune a layer below N heads (default 0: a layer may lose every head and then "
                        "outputs its constant output-projection bias)")
    p.add_argument("--data", metavar="DIR", help="data directory with the dictionaries, if the checkpoint's is gone")
    p.add_argument("--user-dir", help="ignored (the plugin imports itself); accepted for symmetry with fairseq")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    return p


def load(path, data=None):
    """model, its checkpoint state (cfg, extra state), from any fairseq transformer checkpoint."""
    state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides={"data": data} if data else None)
    cfg = state["cfg"]
    try:
        task = tasks.setup_task(cfg.task)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"cannot read the dictionaries of {path} ({e}); pass --data DIR") from None
    model = task.build_model(cfg.model)
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    model.eval()
    return model, state


def read_mask(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"--head-mask: no such file: {path}")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"--head-mask {path} is not valid JSON: {e}") from None


def heads_to_keep(model, mask_matrix=None):
    """(type, layer) -> positions of the heads that stay: value > 0 under the mask, or g_hat > 0."""
    from ..modules.head_gates import attention_modules, gate_values, masks_from_matrix, set_head_masks

    modules = attention_modules(model)
    if mask_matrix is not None:
        set_head_masks(model, masks_from_matrix(model, mask_matrix))
    elif not any(getattr(m, "head_gates", None) is not None for m in modules.values()):
        raise ValueError("the model has no head gates: pass --head-mask to say which heads to remove")
    return {key: [h for h, v in enumerate(values.tolist()) if v > 0] for key, values in gate_values(model).items()}


def save_state(state, path):
    """Save like fairseq's trainer does: cfg as plain containers, so torch's safe loader reads it back."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(state.get("cfg")):
        state = dict(state, cfg=OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True))
    checkpoint_utils.torch_persistent_save(state, path)


def set_model_arg(model_cfg, name, value):
    from omegaconf import DictConfig, open_dict

    if isinstance(model_cfg, DictConfig):
        with open_dict(model_cfg):
            model_cfg[name] = value
    else:
        setattr(model_cfg, name, value)


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    if not os.path.exists(args.path):
        parser.error(f"checkpoint not found: {args.path}")
    if os.path.exists(args.output) and not args.overwrite:
        parser.error(f"{args.output} exists; pass --overwrite to replace it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        parser.error(f"directory of --output does not exist: {args.output}")
    if args.min_heads_per_layer < 0:
        parser.error("--min-heads-per-layer must be >= 0")
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    import fairseq_sparse  # noqa: F401  (registers our models before the checkpoint is read)
    from ..modules.head_gates import attention_modules, prune_heads

    try:
        mask = read_mask(args.head_mask) if args.head_mask else None
        model, state = load(args.path, args.data)
        keep = heads_to_keep(model, mask)
        modules = attention_modules(model)
        for key, heads in keep.items():
            if len(heads) < min(args.min_heads_per_layer, modules[key].num_heads):
                raise ValueError(f"{key[0]} layer {key[1]} would keep {len(heads)} heads, fewer than "
                                 f"--min-heads-per-layer {args.min_heads_per_layer}")
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    before = sum(p.numel() for p in model.parameters())
    heads_before = {k: m.num_heads for k, m in modules.items()}
    spec = prune_heads(model, keep, allow_empty_layers=True)
    after = sum(p.numel() for p in model.parameters())

    model_cfg = state["cfg"]["model"]
    if not type(model).__module__.startswith("fairseq_sparse."):
        # a stock transformer: our model class builds the pruned shapes from --kept-heads
        set_model_arg(model_cfg, "arch", "transformer_head_gates")
        set_model_arg(model_cfg, "_name", "transformer_head_gates")
    set_model_arg(model_cfg, "kept_heads", json.dumps(spec))
    set_model_arg(model_cfg, "head_gates", "")  # gates are folded into the weights
    state["model"] = model.state_dict()
    state["last_optimizer_state"] = None  # shapes changed: a pruned model starts a fresh optimizer
    save_state(state, args.output)

    total_before, total_after = sum(heads_before.values()), sum(len(v) for v in keep.values())
    print(f"kept {total_after} of {total_before} heads; parameters {before} -> {after} "
          f"({100.0 * (before - after) / before:.1f}% fewer); wrote {args.output}")
    for t in ("enc", "dec", "encdec"):
        rows = [len(keep[k]) for k in keep if k[0] == t]
        if rows:
            print(f"  {t:6s} heads per layer: {rows}")
    with open(os.path.splitext(args.output)[0] + ".kept_heads.json", "w") as f:
        json.dump(spec, f, indent=1)
    return spec


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
