"""Dump the L0Drop gate of every source token of a data split, and the sparsity rate.

    fairseq-sparse-l0drop-gates DATA --user-dir fairseq_sparse --path CKPT --gen-subset test \\
        --gates-output gates.tsv [--token-summary gates_by_token.tsv] [--batch-size 64] [--overwrite]

Writes one line per source token: sentence id, position, token, g_hat (Zhang, Titov & Sennrich 2021,
Eq. 13) and whether the state is pruned (g_hat = 0); with ``--token-summary FILE`` also the sparsity per
token type (how often each word's encoding is pruned, Sec. 6); with ``--content-probe FILE`` how much of each pruned
piece the states the decoder still sees hold (a probe against the floor of the kept pieces' embeddings). Prints the sparsity rate
#(g_hat = 0) / #source tokens (padding excluded) to stdout. Existing output files are replaced only with
``--overwrite``; every checkpoint of ``--path`` is checked before anything is loaded or written. The
options are fairseq-generate's (batching, ``--cpu``, ``--model-overrides``).
"""
import logging
import os

from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.translation import TranslationTask

from fairseq_sparse.analysis import attention as att
from fairseq_sparse.analysis import content_probe as content
from fairseq_sparse.cli import common

logger = logging.getLogger("fairseq_sparse.l0drop_gates")

PROG = "fairseq-sparse-l0drop-gates"


def add_args(parser):
    group = parser.add_argument_group("L0Drop gate dump")
    group.add_argument("--gates-output", required=True, metavar="FILE", help="TSV: id, position, token, gate, pruned")
    group.add_argument("--token-summary", metavar="FILE", help="TSV: token, count, pruned count, sparsity")
    group.add_argument("--content-probe", metavar="FILE",
                       help="JSON: how well a probe recovers each pruned source piece from the states the decoder "
                            "still sees, against the floor of the kept pieces' embeddings (trained on the first 80%% "
                            "of the split's sentences read, scored on the rest; fairseq_sparse.analysis.content_probe)")
    group.add_argument("--content-probe-sentences", type=int, default=5000, metavar="N",
                       help="sentences of the split the content probe reads")
    common.add_overwrite_arg(group)


def validate(args):
    """Every checkpoint readable, the outputs new (or --overwrite) and none of them an input or each other, the
    dictionaries of DATA there."""
    common.check_finite(args)
    paths = args.path.split(os.pathsep)
    for path in paths:
        common.check_checkpoint_file(path, "--path")
    if args.content_probe_sentences < 10:
        raise common.ToolError(f"--content-probe-sentences must be at least 10, got {args.content_probe_sentences}")
    outputs = [args.gates_output, args.token_summary, args.content_probe]
    named = [os.path.abspath(p) for p in outputs if p is not None]
    if len(set(named)) < len(named):
        raise common.ToolError("--gates-output, --token-summary and --content-probe must name different files")
    common.check_output_files([("--gates-output", args.gates_output), ("--token-summary", args.token_summary),
                               ("--content-probe", args.content_probe)], args.overwrite, inputs=paths, data=args.data)
    if issubclass(tasks.TASK_REGISTRY.get(args.task, object), TranslationTask):  # fairseq's FileNotFoundError else
        common.check_dictionaries(args.data, args.source_lang, args.target_lang)


def load(args):
    """(cfg, task, model, dataset)."""
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    try:
        task = tasks.setup_task(cfg.task)
    except Exception as e:  # a task of another plugin whose files are missing or unreadable
        raise common.ToolError(f"cannot set up --task {args.task} on {args.data}: {type(e).__name__}: {e}") from e
    try:
        models, _ = checkpoint_utils.load_model_ensemble(
            utils.split_paths(cfg.common_eval.path), arg_overrides=eval(cfg.common_eval.model_overrides), task=task)
    except Exception as e:  # a checkpoint that passed the archive check but is no model of this task
        raise common.ToolError(f"cannot load {cfg.common_eval.path}: {type(e).__name__}: {e}") from e
    model = models[0]
    if not hasattr(model.encoder, "l0drop"):
        raise common.ToolError(f"{cfg.common_eval.path} has no L0Drop gates (arch {getattr(model.args, 'arch', '?')})")
    return cfg, task, model, common.load_split(task, cfg, cfg.dataset.gen_subset)


def main(argv=None):
    parser = options.get_generation_parser()
    add_args(parser)
    args = options.parse_args_and_arch(parser, input_args=argv)
    try:
        validate(args)
        cfg, task, model, dataset = load(args)
    except common.ToolError as e:
        common.fail(PROG, str(e))
    cuda = common.use_cuda(cfg.common.cpu)
    if cuda:
        model.cuda()
    model.eval()
    model.encoder.pruned_decoding = False  # the gates are the same either way; keep the full layout
    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        num_workers=cfg.dataset.num_workers,
    ).next_epoch_itr(shuffle=False)
    samples = (utils.move_to_cuda(s) if cuda else s for s in itr)
    rows = [(sid, pos, token, g, int(g == 0))
            for sid, pos, token, g in att.source_token_gates(model.encoder, samples, task.source_dictionary)]
    common.write_tsv(args.gates_output, ["id", "position", "token", "gate", "pruned"], rows, float_spec="{:.6g}")
    if args.token_summary:
        common.write_tsv(args.token_summary, ["token", "count", "pruned", "sparsity"], att.token_sparsity(rows))
    if args.content_probe:
        content_probe(args, model, task, dataset, cuda)
    pruned = sum(r[4] for r in rows)
    rate = pruned / max(len(rows), 1)
    print(f"L0Drop sparsity rate {100 * rate:.2f}% ({pruned} of {len(rows)} source tokens pruned) on "
          f"{cfg.dataset.gen_subset}")
    return rate


def content_probe(args, model, task, dataset, cuda):
    """--content-probe: the probe and its floor on the split's first --content-probe-sentences sentences."""
    samples = task.get_batch_iterator(dataset=dataset, max_tokens=args.max_tokens or 4096,
                                      max_sentences=args.batch_size).next_epoch_itr(shuffle=False)
    samples = (utils.move_to_cuda(s) if cuda else s for s in samples)
    sentences = content.memory_sentences(model.encoder, samples, args.content_probe_sentences)
    try:
        result = content.probe_content(sentences, len(task.source_dictionary))
    except ValueError as e:
        common.fail(PROG, f"--content-probe: {e}")
    result["sentences"] = len(sentences)
    common.write_json(args.content_probe, result)
    print(f"content probe: pruned pieces recovered from the kept states {result['states']['accuracy']:.1%} "
          f"({result['states']['nll_bits']:.2f} bits), from the kept pieces' embeddings {result['embeddings']['accuracy']:.1%} "
          f"({result['embeddings']['nll_bits']:.2f} bits); the states add {result['gain_bits']:.2f} bits")


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
