"""Export a physically smaller checkpoint: attention heads cut out of the q/k/v and output projections.

    # heads whose trained gate is closed (g_hat = 0; transformer_head_gates or --head-gates models)
    fairseq-sparse-prune-heads --path gated/checkpoint_best.pt --output pruned.pt
    # heads masked by a head mask JSON (e.g. written by fairseq-sparse-head-importance prune-curve --write-mask)
    fairseq-sparse-prune-heads --path stock/checkpoint_best.pt --head-mask mask.json --output pruned.pt

Gate values between 0 and 1 (and mask values) are folded into the kept heads' output-projection
columns, so the exported model computes what the gated / masked model computed (Voita et al. 2019: at
test time the gated model is a standard Transformer with a subset of heads; Michel et al. 2019, Sec. 4.2:
actually pruning the heads, not just masking, is what makes it faster). Layers may keep different numbers of
heads; the kept head ids go into the checkpoint's model args (``--kept-heads``), so plain
``fairseq-generate --user-dir fairseq_sparse --path pruned.pt`` builds the smaller model. A stock
``transformer`` checkpoint is exported as ``transformer_head_gates`` without gates.
"""
import json
import logging

from fairseq import checkpoint_utils, tasks

from ..checkpoint_safety import data_dir, read_state
from ..modules.head_gates import ATTENTION_TYPES, check_head_mask, head_layout, read_head_mask
from . import common

logger = logging.getLogger("fairseq_sparse.prune_heads")
PROG = "fairseq-sparse-prune-heads"


def get_parser():
    p = common.doc_parser(PROG, __doc__)
    p.add_argument("--path", required=True, metavar="CKPT", help="checkpoint to prune")
    p.add_argument("--output", required=True, metavar="FILE", help="where to write the pruned checkpoint")
    p.add_argument("--head-mask", metavar="JSON", help="head mask {\"enc\": [[1, 0, ...], ...], \"dec\": ..., "
                   "\"encdec\": ...} of values in [0, 1]: heads with value 0 are removed, other values are folded "
                   "into the weights; "
                   "without it, heads whose gate g_hat is 0 are removed (the model must have head gates)")
    p.add_argument("--min-heads-per-layer", type=int, default=0, metavar="N",
                   help="refuse to prune a layer below N heads (default 0: a layer may lose every head and then "
                        "outputs its constant output-projection bias)")
    p.add_argument("--data", metavar="DIR", help="data directory with the dictionaries, if the checkpoint's is gone")
    p.add_argument("--user-dir", help="ignored (the plugin imports itself); accepted for symmetry with fairseq")
    common.add_overwrite_arg(p)  # never lets --output replace --path
    return p


def load(path, data=None):
    """model, its checkpoint state (cfg, extra state) and task, from any fairseq transformer checkpoint."""
    state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides={"data": data} if data else None)
    cfg = state["cfg"]
    try:
        task = tasks.setup_task(cfg.task)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"cannot read the dictionaries of {path} ({e}); pass --data DIR") from None
    model = task.build_model(cfg.model)
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    model.eval()
    return model, state, task


def heads_to_keep(model, masks=None):
    """(type, layer) -> positions of the heads that stay: value > 0 under the head masks, or g_hat > 0."""
    from ..modules.head_gates import attention_modules, gate_values, set_head_masks

    modules = attention_modules(model)
    if masks is not None:
        set_head_masks(model, masks)
    elif not any(getattr(m, "head_gates", None) is not None for m in modules.values()):
        raise ValueError("the model has no head gates: pass --head-mask to say which heads to remove")
    return {key: [h for h, v in enumerate(values.tolist()) if v > 0] for key, values in gate_values(model).items()}


def save_state(state, path):
    """Save like fairseq's trainer does: cfg as plain containers, so torch's safe loader reads it back. torch.save
    itself, not fairseq's torch_persistent_save: on a failed write (a full disk) that one retries twice, 5 s of sleep,
    and logs the traceback as an ERROR before raising, ahead of the tool's one-line refusal (issue 62). A write that
    fails is an OSError, also where torch's zip writer turns it into a RuntimeError raised while handling it."""
    import torch
    from omegaconf import OmegaConf

    if OmegaConf.is_config(state.get("cfg")):
        state = dict(state, cfg=OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True))
    try:
        with open(path, "wb") as f:
            torch.save(state, f)
    except RuntimeError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, OSError):
            if cause.filename is None:
                cause.filename = path
            raise cause from None
        raise


def set_model_arg(model_cfg, name, value):
    from omegaconf import DictConfig, open_dict

    if isinstance(model_cfg, DictConfig):
        with open_dict(model_cfg):
            model_cfg[name] = value
    else:
        setattr(model_cfg, name, value)


def validate(args):
    """Every check before the model is loaded: options, the checkpoint (complete, readable), the head mask
    (well-formed, values in [0, 1]), the outputs (never the input checkpoint, existing ones only with
    --overwrite). Returns the head mask JSON object or None."""
    if args.min_heads_per_layer < 0:
        raise common.ToolError("--min-heads-per-layer must be >= 0")
    common.check_checkpoint_file(args.path)
    if args.data is not None:
        common.check_data_dir(args.data, "--data")
    outputs = [("--output", args.output), ("--output (its kept heads)", common.kept_heads_path(args.output))]
    common.check_output_files(outputs, args.overwrite, inputs=[args.path, args.head_mask], data=args.data)
    if args.data is None:  # the checkpoint's own data folder holds the dictionaries it is read with
        try:
            own = data_dir(read_state(args.path))
        except Exception as e:
            raise common.ToolError(f"--path: cannot read {args.path}: {type(e).__name__}: {e}") from None
        common.check_output_files(outputs, args.overwrite, data=own)
    if args.head_mask is None:
        return None
    try:
        return read_head_mask(args.head_mask)
    except ValueError as e:
        raise common.ToolError(f"--head-mask: {e}") from None


def select_heads(model, args, matrix):
    """Head positions to keep per layer: from the head mask JSON object ``matrix`` of ``--head-mask``, or from
    the gates if None; at least ``--min-heads-per-layer`` per layer."""
    from ..modules.head_gates import attention_modules

    try:
        masks = None if matrix is None else check_head_mask(matrix, head_layout(model))
    except ValueError as e:
        raise common.ToolError(f"--head-mask: head mask {args.head_mask}: {e}") from None
    try:
        keep = heads_to_keep(model, masks)
    except ValueError as e:
        raise common.ToolError(str(e)) from None
    modules = attention_modules(model)
    for key, heads in keep.items():
        if len(heads) < min(args.min_heads_per_layer, modules[key].num_heads):
            raise common.ToolError(f"{key[0]} layer {key[1]} would keep {len(heads)} heads, fewer than "
                                   f"--min-heads-per-layer {args.min_heads_per_layer}")
    return keep


def prune(model, state, keep):
    """Prune ``model`` to ``keep`` and put the result into the checkpoint ``state`` (nothing written yet)."""
    from ..modules.head_gates import prune_heads

    spec = prune_heads(model, keep, allow_empty_layers=True)
    model_cfg = state["cfg"]["model"]
    if not type(model).__module__.startswith("fairseq_sparse."):
        # a stock transformer: our model class builds the pruned shapes from --kept-heads
        set_model_arg(model_cfg, "arch", "transformer_head_gates")
        set_model_arg(model_cfg, "_name", "transformer_head_gates")
    set_model_arg(model_cfg, "kept_heads", json.dumps(spec))
    set_model_arg(model_cfg, "head_gates", "")  # gates are folded into the weights
    state["model"] = model.state_dict()
    state["last_optimizer_state"] = None  # shapes changed: a pruned model starts a fresh optimizer
    return spec


def check_buildable(task, state):
    """Build the pruned model from the checkpoint's new args and load its weights, as fairseq-generate will;
    ToolError if that fails (e.g. a coverage model without some encoder-decoder heads), before anything is
    written."""
    cfg = state["cfg"]["model"]
    try:
        task.build_model(cfg).load_state_dict(state["model"], strict=True, model_cfg=cfg)
    except Exception as e:
        raise common.ToolError(f"the pruned model cannot be built, so nothing was written: {e}") from None


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        matrix = validate(args)
        common.setup_logging()
        common.import_plugins()  # registers our models before the checkpoint is read
        try:
            model, state, task = load(args.path, args.data)
        except Exception as e:  # complete but not a fairseq checkpoint, or the dictionaries are gone
            raise common.ToolError(f"cannot load {args.path}: {type(e).__name__}: {e}") from None
        keep = select_heads(model, args, matrix)
        before = sum(p.numel() for p in model.parameters())
        heads_before = sum(head_layout(model).values())
        spec = prune(model, state, keep)
        check_buildable(task, state)
    except common.ToolError as e:
        common.fail(PROG, str(e))
    kept_heads = common.kept_heads_path(args.output)
    common.write_or_fail(PROG, [(args.output, lambda part: save_state(state, part)),
                                (kept_heads, lambda part: common.write_json(part, spec))])
    after = sum(p.numel() for p in model.parameters())
    print(f"kept {sum(len(v) for v in keep.values())} of {heads_before} heads; parameters {before} -> {after} "
          f"({100.0 * (before - after) / before:.1f}% fewer); wrote {args.output}")
    for t in ATTENTION_TYPES:
        rows = [len(keep[k]) for k in keep if k[0] == t]
        if rows:
            print(f"  {t:6s} heads per layer: {rows}")
    return spec


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
