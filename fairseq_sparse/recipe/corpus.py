"""The recipe's data: the raw corpus (or data-bin) checked before any work, then tokenised (sacremoses), split
into joint BPE (subword-nmt) and binarised (fairseq-preprocess)."""
import os
import shutil

from . import commands
from .lengths import truncate_sources
from .options import CHAR_BOUNDARY, SPLITS, fail
from .workdir import file_identity


def _check_split(a, split):
    counts = {}
    for lang in (a.source_lang, a.target_lang):
        path = os.path.join(a.corpus, f"{split}.{lang}")
        if not os.path.isfile(path):
            bart = os.path.isfile(os.path.join(a.corpus, f"{split}.source")) and a.source_lang != "source"
            fail(f"missing corpus file {path}" + (" (the folder has fairseq's BART layout: -s source -t target, or "
                                                  "leave -s/-t out)" if bart else ""))
        try:
            with open(path, encoding="utf-8", errors="strict") as f:
                counts[path] = 0
                for line in f:
                    counts[path] += 1
                    if a.char_level and CHAR_BOUNDARY in line:
                        fail(f"{path} line {counts[path]} holds --char-level's word-boundary symbol "
                             f"{CHAR_BOUNDARY!r} (U+2581) itself: it could not be told from a word boundary")
        except UnicodeDecodeError as e:
            fail(f"{path} is not UTF-8 text: {e}")
    (p1, n1), (p2, n2) = counts.items()
    if n1 != n2:
        fail(f"{p1} has {n1} lines but {p2} has {n2}: the sides are not aligned")
    if n1 == 0:
        fail(f"{p1} is empty")
    if split == "test" and a.gold_alignments:
        with open(a.gold_alignments) as f:
            n_gold = sum(1 for _ in f)
        if n_gold != n1:
            fail(f"--gold-alignments {a.gold_alignments} has {n_gold} lines but the test split {n1}")


def tokenizer_langs(a):
    """{suffix: the Moses language code its text is tokenised with}: --tokenizer-lang (one code for both sides,
    or SRC,TGT), else the suffixes themselves."""
    if a.tokenizer_lang:
        codes = [c for c in a.tokenizer_lang.split(",") if c]
        return {a.source_lang: codes[0], a.target_lang: codes[-1]}
    return {a.source_lang: a.source_lang, a.target_lang: a.target_lang}


def _check_raw(a):
    if a.tokenizer == "moses":
        from sacremoses.corpus import NonbreakingPrefixes

        known = NonbreakingPrefixes().available_langs
        for suffix, code in tokenizer_langs(a).items():
            if code not in known:
                given = "given by --tokenizer-lang" if a.tokenizer_lang else f"the suffix of the .{suffix} files"
                fail(f"no Moses tokeniser rules for language code {code!r} ({given}): give the text's language with "
                     f"--tokenizer-lang (e.g. --tokenizer-lang en), or --tokenizer none for a corpus that is "
                     f"tokenised already; known codes: {', '.join(sorted(known))}")
    for split in SPLITS:
        _check_split(a, split)


def _check_data_bin(a, data):
    for lang in (a.source_lang, a.target_lang):
        for name in [f"dict.{lang}.txt"] + [f"{s}.{a.source_lang}-{a.target_lang}.{lang}.bin" for s in SPLITS]:
            if not os.path.isfile(os.path.join(data, name)):
                fail(f"data-bin {data} lacks {name}")
    with open(os.path.join(data, f"dict.{a.source_lang}.txt"), "rb") as f1, \
            open(os.path.join(data, f"dict.{a.target_lang}.txt"), "rb") as f2:
        if f1.read() != f2.read():
            fail(f"data-bin {data}: the recipe shares all embeddings and needs a joined dictionary "
                 "(fairseq-preprocess --joined-dictionary)")


def _check_baseline_checkpoint(a, data):
    """A brought baseline must be a readable checkpoint of the recipe's sizes over the data-bin's dictionary."""
    from ..checkpoint_safety import dictionary_files, dictionary_symbols, model_options, read_state

    path = a.baseline_checkpoint
    if a.corpus:
        fail("--baseline-checkpoint needs --data-bin (the binarised data the checkpoint was trained on): a corpus "
             "the recipe prepares gets a new dictionary")
    if not os.path.isfile(path):
        fail(f"--baseline-checkpoint: no such file {path}")
    try:
        state = read_state(path)
        options, weights = model_options(state), state["model"]
    except Exception as e:
        fail(f"--baseline-checkpoint {path} is not a readable fairseq checkpoint ({type(e).__name__}: {e})")
    want = {"encoder_layers": commands.depths(a)[0], "decoder_layers": commands.depths(a)[1], "encoder_embed_dim": a.embed_dim,
            "encoder_ffn_embed_dim": a.ffn_dim, "encoder_attention_heads": a.heads}
    differ = [f"{k} {options.get(k)} (recipe: {v})" for k, v in want.items() if options.get(k) != v]
    if differ:
        fail(f"--baseline-checkpoint {path} has other sizes than the recipe's options: {', '.join(differ)}; pass "
             "the matching --encoder-layers/--decoder-layers/--embed-dim/--ffn-dim/--heads")
    with open(os.path.join(data, f"dict.{a.source_lang}.txt"), encoding="utf-8") as f:
        words = sum(1 for _ in f) + 4  # fairseq adds 4 special symbols
    rows = weights.get("encoder.embed_tokens.weight")
    if rows is not None and rows.size(0) != words:
        fail(f"--baseline-checkpoint {path} has {rows.size(0)} embeddings but --data-bin's dictionary {words}: it was "
             "trained on other data")
    theirs = dictionary_files(state)  # where its data directory is still there: the symbols, not only their number
    for side, lang in (("source", a.source_lang), ("target", a.target_lang)):
        ours = os.path.join(data, f"dict.{lang}.txt")
        if side in theirs and dictionary_symbols(theirs[side]) != dictionary_symbols(ours):
            fail(f"--baseline-checkpoint {path} was trained with the dictionary {theirs[side]}, whose symbols differ "
                 f"from --data-bin's {ours}: it was trained on other data")


#: the options that make the prepared data what it is
PREPARATION = ("source_lang", "target_lang", "tokenizer", "tokenizer_lang", "bpe_merges", "char_level",
               "truncate_source", "train_fraction")


def data_key(a, data):
    """What every model of the work dir is trained on: with --corpus, the preparation options and the corpus
    files' content (sha1); with --data-bin, its dictionaries' content and its binary files' sizes."""
    if a.data_bin:
        return {name: file_identity(os.path.join(data, name)) if name.startswith("dict.")
                else os.path.getsize(os.path.join(data, name))
                for name in sorted(os.listdir(data)) if name.startswith("dict.") or name.endswith(".bin")}
    key = {"--" + o.replace("_", "-"): getattr(a, o) for o in PREPARATION
           if not (o == "train_fraction" and a.train_fraction == 1)}  # (work dirs made before the option: the same key)
    key.update({f"{split}.{lang}": file_identity(os.path.join(a.corpus, f"{split}.{lang}"))
                for split in SPLITS for lang in (a.source_lang, a.target_lang)})
    return key


def check_prepared(a, wd, data, keep=True):
    """A work dir whose data was made from another corpus or with other preparation options (or another
    --data-bin) is refused before any work, with the options that differ: its data-bin would be used as it is.
    The data's key is kept in the work dir unless KEEP is false (the checks before any work write nothing)."""
    made = any(os.path.exists(wd.path(p)) for p in ("data-bin", "tok", "baseline"))
    wd.keep_key("keys/data.json", data_key(a, data), "the data", "use a new --work-dir, or the same options and "
                "corpus", exists=made, keep=keep)


def check_inputs(a, data):
    """Every input problem, reported before any work starts."""
    if a.corpus:
        _check_raw(a)
    else:
        _check_data_bin(a, data)
    if a.baseline_checkpoint:
        _check_baseline_checkpoint(a, data)
    if a.function_words:
        from ..analysis.token_types import read_function_words

        try:
            read_function_words(a.function_words)
        except ValueError as e:
            fail(str(e))


def prepare(a, wd, data):
    """WORK/data-bin from the raw corpus (nothing to do for --data-bin; skipped once it exists)."""
    check_prepared(a, wd, data)
    if a.data_bin:
        print("  data-bin given: nothing to prepare")
        return
    if os.path.exists(os.path.join(data, f"dict.{a.target_lang}.txt")):
        print(f"  prepare: done already ({data}); skipped")
        return
    os.makedirs(wd.path("tok"), exist_ok=True)
    if a.tokenizer == "moses":
        _tokenise(a, wd)
        prefix = {split: f"tok/{split}" for split in SPLITS}
    else:
        prefix = {split: os.path.join(os.path.abspath(a.corpus), split) for split in SPLITS}
    if a.bpe_merges:
        prefix = _bpe(a, wd, prefix)
    if a.char_level:
        prefix = _characters(a, wd, prefix)
    prefix = truncate_sources(a, wd, prefix)  # counted (WORK/truncation.json) with or without a cut
    tmp = data + ".tmp"
    dictionary = None
    if a.train_fraction < 1:  # the whole training split's dictionary, a share of its pairs binarised
        wd.run("prepare", commands.preprocess(a, prefix, "dict.tmp", dict_only=True), "dictionary.log")
        dictionary = f"tok/dict.{a.source_lang}.txt"
        os.replace(wd.path("dict.tmp", f"dict.{a.source_lang}.txt"), wd.path(dictionary))
        shutil.rmtree(wd.path("dict.tmp"))
        prefix = {**prefix, "train": train_share(a, wd, prefix["train"])}
    wd.run("prepare", commands.preprocess(a, prefix, os.path.basename(tmp), dictionary), "preprocess.log")
    os.replace(tmp, data)


def train_share(a, wd, train):
    """--train-fraction F: the first round(F x N) pairs of the training split in one shuffle (seed 1, whatever
    --seed: every work dir of a data-size study gets nested shares), written next to the prepared text."""
    import random

    sides = {}
    for lang in (a.source_lang, a.target_lang):
        with open(wd.path(f"{train}.{lang}"), encoding="utf-8") as f:
            sides[lang] = f.readlines()
    order = list(range(len(sides[a.source_lang])))
    random.Random(1).shuffle(order)
    keep = sorted(order[:max(1, round(a.train_fraction * len(order)))])
    share = f"{train}.share"
    for lang, lines in sides.items():
        with open(wd.path(f"{share}.{lang}.tmp"), "w", encoding="utf-8") as g:
            g.writelines(lines[i] for i in keep)
        os.replace(wd.path(f"{share}.{lang}.tmp"), wd.path(f"{share}.{lang}"))
    wd.record("prepare", f"(the first {len(keep)} of {len(order)} training pairs in one shuffle, seed 1: "
                         f"--train-fraction {a.train_fraction:g}; the dictionary from all of them)")
    return share


def _tokenise(a, wd):
    """Moses tokenisation of every split (the recorded command is the equivalent sacremoses CLI)."""
    from sacremoses import MosesTokenizer

    for lang, code in tokenizer_langs(a).items():
        tok = MosesTokenizer(lang=code)
        for split in SPLITS:
            out = wd.path("tok", f"{split}.{lang}")
            if os.path.exists(out):
                continue
            with open(os.path.join(a.corpus, f"{split}.{lang}"), encoding="utf-8") as f, \
                    open(out + ".tmp", "w", encoding="utf-8") as g:
                for line in f:
                    g.write(tok.tokenize(line.strip(), escape=False, return_str=True) + "\n")
            os.replace(out + ".tmp", out)
        wd.record("prepare", f"sacremoses -l {code} -j 2 tokenize -x < CORPUS/SPLIT.{lang} > tok/SPLIT.{lang}")


def _bpe(a, wd, prefix):
    """Joint BPE learnt on both sides of the training split, applied to every split."""
    both = wd.path("tok", "train.both")
    if not os.path.exists(both):
        with open(both + ".tmp", "w", encoding="utf-8") as g:
            for lang in (a.source_lang, a.target_lang):
                with open(wd.path(f"{prefix['train']}.{lang}"), encoding="utf-8") as f:
                    g.write(f.read())
        os.replace(both + ".tmp", both)
    codes = wd.path("tok", "bpe.codes")
    if not os.path.exists(codes):
        wd.run("prepare", commands.learn_bpe(a.bpe_merges, "tok/train.both", "tok/bpe.codes.tmp"), "learn_bpe.log")
        os.replace(codes + ".tmp", codes)
    for split in SPLITS:
        for lang in (a.source_lang, a.target_lang):
            out = wd.path("tok", f"{split}.bpe.{lang}")
            if not os.path.exists(out):
                wd.run("prepare", commands.apply_bpe("tok/bpe.codes", f"{prefix[split]}.{lang}",
                                                     f"tok/{split}.bpe.{lang}.tmp"), f"apply_bpe.{split}.{lang}.log")
                os.replace(out + ".tmp", out)
    return {split: f"tok/{split}.bpe" for split in SPLITS}


def characters(line):
    """A tokenised line as characters: every word's characters, the word-boundary symbol between words."""
    return f" {CHAR_BOUNDARY} ".join(" ".join(w) for w in line.split())


def _characters(a, wd, prefix):
    """--char-level: tok/SPLIT.char.LANG, every split's words split into characters (Zhang, Titov & Sennrich
    2021 Sec. 6)."""
    for split in SPLITS:
        for lang in (a.source_lang, a.target_lang):
            out = wd.path("tok", f"{split}.char.{lang}")
            if os.path.exists(out):
                continue
            with open(wd.path(f"{prefix[split]}.{lang}"), encoding="utf-8") as f, \
                    open(out + ".tmp", "w", encoding="utf-8") as g:
                for line in f:
                    g.write(characters(line) + "\n")
            os.replace(out + ".tmp", out)
    shown = "tok/SPLIT" if a.tokenizer == "moses" else "CORPUS/SPLIT"
    wd.record("prepare", "python3 -c \"import sys; [print(' \u2581 '.join(' '.join(w) for w in l.split())) for l in "
                         f"sys.stdin]\" < {shown}.LANG > tok/SPLIT.char.LANG")
    return {split: f"tok/{split}.char" for split in SPLITS}


def source_text(a, split):
    """The source text of SPLIT as binarised (after tokenisation, BPE and truncation; relative to WORK, or the
    corpus file itself)."""
    if a.truncate_source:
        return f"tok/{split}.trunc.{a.source_lang}"
    if a.bpe_merges:
        return f"tok/{split}.bpe.{a.source_lang}"
    if a.char_level:
        return f"tok/{split}.char.{a.source_lang}"
    if a.tokenizer == "moses":
        return f"tok/{split}.{a.source_lang}"
    return os.path.join(os.path.abspath(a.corpus), f"{split}.{a.source_lang}")
