"""fairseq_sparse: a fairseq plugin (``--user-dir fairseq_sparse``) for sparser, faster Transformers.

Importing the package registers its models and criterions with fairseq, lets torch's safe
checkpoint loader (weights_only=True, the default since torch 2.6) read fairseq checkpoints, keeps
the last batch that fairseq drops when its size is not a multiple of --required-batch-size-multiple, and makes
--no-repeat-ngram-size block repeats where fairseq runs it without its CUDA extension (patches/ngram_block.py).

Bibliography (docstrings and ``--help`` texts cite these by authors and year):

- Zhang, Titov & Sennrich 2021: On Sparsifying Encoder Outputs in Sequence-to-Sequence Models
  (Findings of ACL 2021). L0Drop: HardConcrete gates on encoder outputs, pruned decoding (Algorithm 1).
- Voita, Talbot, Moiseev, Sennrich & Titov 2019: Analyzing Multi-Head Self-Attention: Specialized Heads
  Do the Heavy Lifting, the Rest Can Be Pruned (ACL 2019). Head gates with an L0 penalty, head functions.
- Zhang, Zhao, Li & Zong 2019: Attention With Sparsity Regularization for Neural Machine Translation and
  Summarization (IEEE/ACM TASLP 27(3)). Minimum-entropy and max-L-inf attention regularisers, AER / SAER.
- Michel, Levy & Neubig 2019: Are Sixteen Heads Really Better than One? (NeurIPS 2019). Head masks,
  importance scores, pruning curves.
- Yang, Wang, Shi, Tadepalli, Lee & Tu 2020: On the Sub-Layer Functionalities of Transformer Decoder
  (Findings of EMNLP 2020). Simplified decoder, sub-layer orders, the universal probing decoder.
- Xia, Zhong & Chen 2022: Structured Pruning Learns Compact and Accurate Models (ACL 2022). CoFi's
  Lagrangian control of a target sparsity.
- Louizos, Welling & Kingma 2018: Learning Sparse Neural Networks through L0 Regularization (ICLR 2018).
  The HardConcrete distribution.
"""
from .patches import safe_globals  # noqa: F401  (first: fairseq tools may load checkpoints right after)
from .patches import last_batch, ngram_block  # noqa: F401
from . import checkpoint_safety, criterions, models, modules, optim, search, tasks  # noqa: F401
