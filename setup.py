from setuptools import find_packages, setup

setup(
    name="fairseq_sparse",
    version="0.1.0",
    description="fairseq plugin: L0Drop, head gates and pruning, sparse attention, simplified decoder",
    packages=find_packages(include=["fairseq_sparse", "fairseq_sparse.*"]),
    python_requires=">=3.10",
    # fairseq itself (fairseq-fixed==0.12.3.1) is installed with --no-deps by scripts/setup_env.sh;
    # listing it here would drag in torchaudio and another torch.
    install_requires=["torch==2.13.0", "sacrebleu", "numpy"],
    entry_points={
        "console_scripts": [
            # each named like the module it runs
            "fairseq-sparse-l0drop-gates = fairseq_sparse.cli.l0drop_gates:cli_main",
            "fairseq-sparse-synthetic-corpus = fairseq_sparse.synthetic_corpus:main",
            "fairseq-sparse-prune-heads = fairseq_sparse.cli.prune_heads:cli_main",
            "fairseq-sparse-head-analysis = fairseq_sparse.cli.head_analysis:cli_main",
            "fairseq-sparse-head-importance = fairseq_sparse.cli.head_importance:cli_main",
            "fairseq-sparse-attention-analysis = fairseq_sparse.cli.attention_analysis:cli_main",
            "fairseq-sparse-probe = fairseq_sparse.cli.probe:cli_main",
            "fairseq-sparse-sparsity-curve = fairseq_sparse.cli.sparsity_curve:cli_main",
            "fairseq-sparse-pos-tags = fairseq_sparse.cli.pos_tags:cli_main",
            "fairseq-sparse-recipe = fairseq_sparse.recipe.main:cli_main",
            # the names of earlier releases, still working
            "fairseq-sparse-gates = fairseq_sparse.cli.l0drop_gates:cli_main",
            "fairseq-sparse-corpus = fairseq_sparse.synthetic_corpus:main",
            "fairseq-sparse-heads = fairseq_sparse.cli.head_importance:cli_main",
            "fairseq-sparse-attention = fairseq_sparse.cli.attention_analysis:cli_main",
        ]
    },
)
