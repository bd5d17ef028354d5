"""Speed benchmarks that time the plugin's models against stock fairseq side by side in one run (one module per
comparison, ``python -m fairseq_sparse.benchmarks.<name> --help``; their shared harness in :mod:`.bench_common`).
Not imported by the plugin: fairseq's ``--user-dir`` loads models, tasks and criterions only."""
