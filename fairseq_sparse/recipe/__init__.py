"""From a raw parallel corpus (or a fairseq data-bin) to the papers' result tables.

    fairseq-sparse-recipe --corpus DIR --source-lang en --target-lang de --work-dir runs/mine

DIR holds ``{train,valid,test}.{src,tgt}`` (one sentence per line, aligned), or fairseq's BART layout
``{train,valid,test}.source/.target`` (``-s/-t`` may be left out; ``--tokenizer-lang`` gives Moses the text's
language). The steps, each a plain console command that the report repeats, each skipped on a re-run once its
output is complete:

1. ``prepare``: Moses tokenisation (sacremoses; ``--tokenizer none`` for a tokenised corpus), joint BPE
   (subword-nmt; ``--bpe-merges 0``: none), sources cut to ``--truncate-source`` tokens (counted per split),
   ``fairseq-preprocess`` (``--data-bin DIR`` instead: an existing binarised corpus with a joined dictionary).
2. one step per row of the method table (:data:`.methods.METHODS`): the stock ``baseline`` every method starts
   from, and each method next to its equal-updates control (the same start trained for the same extra updates
   without the method, so extra training is not mistaken for a method effect).
3. ``speed``: the benchmark scripts on the trained models' shapes, each against stock fairseq side by side.
4. ``report``: the score of every model on the test split, sparsity, parameters, speed, the plots and every
   command, in ``WORK/results.json`` and ``WORK/REPORT.md`` (rendered from results.json alone).

Layout: :mod:`.methods` (the table), :mod:`.options` (the command line), :mod:`.option_checks` (its values
checked before work), :mod:`.paths` (where the plugin, the console scripts and the benchmarks are),
:mod:`.commands` (pure command builders), :mod:`.workdir` (running, logging, results keyed by the checkpoints that
produced them), :mod:`.corpus`, :mod:`.lengths` (truncation, positions, nothing dropped or skipped),
:mod:`.training`, :mod:`.decoding` (each model's test-set score), :mod:`.analyses` (the analyses beside it),
:mod:`.budget`, :mod:`.speed`, :mod:`.report` (pure), :mod:`.main`.
Every size and budget is an option (``--help``). Each step evaluates its own model when it finishes, so steps
after the baseline may run as parallel processes (``--steps``); ``report`` gathers what is there.
"""
