"""Helpers shared by the test files (a test file imports from here and from conftest.py, never from another test
file: tests/unit/test_test_layout.py). tests/ is on sys.path (pytest puts tests/conftest.py's folder there), so
``from helpers.cli import train``; conftest.py has pytest rewrite their asserts as it does a test file's.

* models: tiny random transformers built in-process, their batches, generation options, comparing hypotheses;
* checkpoints: a trained checkpoint loaded in-process, its test set, its gates, pruned against unpruned decoding;
* normalisers: the attention normalisers' sizes, batch and beam search;
* cli: fairseq-train and fairseq-generate as console scripts (commands, runs, parsing what they print), and
  fairseq-generate's and fairseq-interactive's main in this process;
* head_gates: head-gate flags, fairseq-sparse-prune-heads, mixed head gates;
* optim: adam_sparsity's settings and log line;
* analysis: head-analysis thresholds, gold alignment files, the tools' TSV output;
* recipe: fairseq-sparse-recipe's command, tiny settings and a run;
* criterion: label_smoothed_cross_entropy_with_sparsity built from its config, with options as keywords.
"""
