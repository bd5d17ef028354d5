"""The maths of every analysis tool, as a library: tensors and dicts in, dicts and arrays out.

No argparse and no process exits here; the command lines in :mod:`fairseq_sparse.cli` parse, validate,
load, call these functions, write and print. One module per subject:

- ``alignment``: AER / SAER against gold alignments, subword merging, cumulative coverage, entropy
- ``attention``: encoder-decoder attention statistics per layer and head, the corpus accumulator,
  L0Drop kept/pruned attention statistics (Zhang et al. 2021, Figs. 1, 7, 8)
- ``heads``: what attention heads do: confidence, positional, rare-word and syntactic heads
  (Voita et al. 2019, Sec. 4-5)
- ``head_importance``: head masks, importance scores, ablation and pruning curves (Michel et al. 2019)
- ``probing``: the universal probing decoder and its training loop (Yang et al. 2020)
- ``sparsity_curve``: the checkpoints of a target-sparsity schedule: targets, measured sparsities, the
  BLEU/sparsity curve (Zhang et al. 2021, Fig. 4; Voita et al. 2019, Fig. 7)
- ``token_types``: punctuation / function / content words of source pieces (Zhang et al. 2021, Fig. 5)
- ``decoding_traffic``: bytes and FLOPs of a beam-search decoding step, a roofline prediction of decoding
  time (Williams, Waterman & Patterson 2009; fairseq_sparse/benchmarks/composed.py prints it)
- ``plotting``: every figure; the one place that chooses matplotlib's backend
"""
