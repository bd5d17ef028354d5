"""Head gates with the console scripts: the training flags, fairseq-sparse-prune-heads, a checkpoint with mixed head
gates, comparing two fairseq-generate runs' hypotheses."""
import torch
from fairseq import checkpoint_utils

import fairseq_sparse  # noqa: F401
from conftest import console, run
from fairseq_sparse.cli.prune_heads import save_state
from helpers.cli import ENV, parse_generate


HEAD_GATES = ["--arch", "transformer_head_gates", "--criterion", "label_smoothed_cross_entropy_with_sparsity",
              "--label-smoothing", "0.1"]


def prune(ckpt, out, extra=(), check=True):
    return run([console("fairseq-sparse-prune-heads"), "--path", ckpt, "--output", out] + list(extra),
               check=check, env=ENV)


def with_mixed_gates(ckpt, out):
    """The checkpoint with its head gates set to a mix of closed, fractional and open values."""
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    values = torch.tensor([-6.0, 0.0, 3.0, -0.5])  # g_hat: 0, 0.5, 1, 0.27
    for i, k in enumerate(sorted(k for k in state["model"] if k.endswith("head_gates.log_alpha"))):
        state["model"][k] = values.roll(i)
    save_state(state, out)
    return out


def assert_same_hypotheses(a, b, tol=1e-4):
    ha, hb = parse_generate(a.stdout)["H"], parse_generate(b.stdout)["H"]
    assert ha and ha.keys() == hb.keys()
    for sid in ha:
        assert ha[sid][1] == hb[sid][1], sid
        assert abs(ha[sid][0] - hb[sid][0]) < tol, sid
