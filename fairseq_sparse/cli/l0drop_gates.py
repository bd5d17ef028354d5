"""Dump the L0Drop gate of every source token of a data split, and the sparsity rate.

    fairseq-sparse-gates DATA --user-dir fairseq_sparse --path CKPT --gen-subset test \\
        --gates-output gates.tsv [--batch-size 64]

Writes one line per source token: sentence id, position, token, g_hat (paper 000 Eq. 13) and
whether the state is pruned (g_hat = 0); with ``--token-summary FILE`` also the sparsity per token
type (how often each word's encoding is pruned, paper 000 Sec. 6). Prints the sparsity rate
#(g_hat = 0) / #source tokens (padding excluded) to stdout.
"""
import collections
import logging
import os
import sys

import torch
from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

logger = logging.getLogger("fairseq_sparse.l0drop_gates")


def add_args(parser):
    group = parser.add_argument_group("L0Drop gate dump")
    group.add_argument("--gates-output", required=True, metavar="FILE", help="TSV: id, position, token, gate, pruned")
    group.add_argument("--token-summary", metavar="FILE", help="TSV: token, count, pruned count, sparsity")


def main(argv=None):
    parser = options.get_generation_parser()
    add_args(parser)
    args = options.parse_args_and_arch(parser, input_args=argv)
    for path in args.path.split(os.pathsep):
        if not os.path.exists(path):
            parser.error(f"checkpoint not found: {path}")
    out_dir = os.path.dirname(os.path.abspath(args.gates_output))
    if not os.path.isdir(out_dir):
        parser.error(f"directory of --gates-output does not exist: {out_dir}")
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr)

    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble(
        utils.split_paths(cfg.common_eval.path), arg_overrides=eval(cfg.common_eval.model_overrides), task=task
    )
    model = models[0]
    encoder = model.encoder
    if not hasattr(encoder, "l0drop"):
        raise SystemExit(f"error: {cfg.common_eval.path} has no L0Drop gates (arch {getattr(model.args, 'arch', '?')})")
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    if use_cuda:
        model.cuda()
    model.eval()
    encoder.pruned_decoding = False  # the gates are the same either way; keep the full layout

    task.load_dataset(cfg.dataset.gen_subset, task_cfg=cfg.task)
    dataset = task.dataset(cfg.dataset.gen_subset)
    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        num_workers=cfg.dataset.num_workers,
    ).next_epoch_itr(shuffle=False)
    src_dict = task.source_dictionary
    per_token = collections.defaultdict(lambda: [0, 0])
    total = pruned = 0
    with open(args.gates_output, "w") as out, torch.no_grad():
        out.write("id\tposition\ttoken\tgate\tpruned\n")
        for sample in itr:
            sample = utils.move_to_cuda(sample) if use_cuda else sample
            src = sample["net_input"]["src_tokens"]
            gates = encoder(src, sample["net_input"]["src_lengths"])["l0drop_gates"][0].float().cpu()
            src = src.cpu()
            for row, sid in enumerate(sample["id"].tolist()):
                real = src[row].ne(src_dict.pad()).nonzero().flatten().tolist()
                for pos, t in enumerate(real):
                    g = float(gates[row, t])
                    word = src_dict[src[row, t]]
                    out.write(f"{sid}\t{pos}\t{word}\t{g:.6g}\t{int(g == 0)}\n")
                    per_token[word][0] += 1
                    per_token[word][1] += int(g == 0)
                    total += 1
                    pruned += int(g == 0)
    if args.token_summary:
        with open(args.token_summary, "w") as f:
            f.write("token\tcount\tpruned\tsparsity\n")
            for word, (n, p) in sorted(per_token.items(), key=lambda kv: -kv[1][0]):
                f.write(f"{word}\t{n}\t{p}\t{p / n:.4f}\n")
    rate = pruned / max(total, 1)
    print(f"L0Drop sparsity rate {100 * rate:.2f}% ({pruned} of {total} source tokens pruned) on {cfg.dataset.gen_subset}")
    return rate


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
