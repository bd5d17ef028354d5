"""The recipe's character-level corpus without running fairseq (issue 24, item 4): words split into characters
with a word-boundary symbol fairseq joins back, no BPE, the options that cannot go with it refused, the decoding
and the tools told how to join the pieces, and the pruned characters' positions in the report."""
import json

import pytest

from fairseq_sparse.recipe import commands, corpus
from fairseq_sparse.recipe.option_checks import parse_args
from fairseq_sparse.recipe.options import CHAR_BOUNDARY
from fairseq_sparse.recipe.report import attention_lines
from fairseq_sparse.recipe.workdir import WorkDir


def parsed(*argv):
    return parse_args(["--work-dir", "w"] + list(argv))


def test_characters_round_trip_through_fairseqs_sentencepiece_rule():
    from fairseq.data.data_utils import post_process

    for line in ("Das ist ein Haus .", "a", "  zwei   Leerzeichen ", "über-groß , 3.5 %"):
        pieces = corpus.characters(line)
        assert pieces.split() == [c for c in pieces if c != " "]  # one character a piece
        assert pieces.count(CHAR_BOUNDARY) == len(line.split()) - 1
        assert post_process(pieces, "sentencepiece") == " ".join(line.split())  # what fairseq-generate prints
    assert corpus.characters("ab cd") == f"a b {CHAR_BOUNDARY} c d"


def test_char_level_takes_no_bpe_and_no_data_bin(tmp_path, capsys):
    assert parsed("--corpus", "c", "-s", "en", "-t", "de").bpe_merges == 8000  # the default without it
    a = parsed("--corpus", "c", "-s", "en", "-t", "de", "--char-level")
    assert a.bpe_merges == 0 and a.char_level
    assert parsed("--corpus", "c", "-s", "en", "-t", "de", "--char-level", "--bpe-merges", "0").bpe_merges == 0
    for extra, message in ((["--corpus", "c", "--bpe-merges", "8000"], "--char-level splits words into characters"),
                           (["--data-bin", str(tmp_path)], "--char-level splits the corpus while it is prepared"),
                           (["--corpus", "c", "--steps", "baseline,pattern_pos"], "pattern_pos tags words")):
        with pytest.raises(SystemExit):
            parsed(*extra, "-s", "en", "-t", "de", "--char-level")
        assert message in capsys.readouterr().err


def test_a_corpus_holding_the_boundary_symbol_is_refused_before_work(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.en").write_text("a b\n")
        (tmp_path / f"{split}.de").write_text("c d\n")
    a = parsed("--corpus", str(tmp_path), "-s", "en", "-t", "de", "--char-level")
    corpus.check_inputs(a, "unused")
    (tmp_path / "valid.de").write_text(f"c d\nsee {CHAR_BOUNDARY} here\n")
    (tmp_path / "valid.en").write_text("a b\nc\n")
    with pytest.raises(SystemExit, match=r"valid.de line 2 holds --char-level's word-boundary symbol"):
        corpus.check_inputs(a, "unused")
    corpus.check_inputs(parsed("--corpus", str(tmp_path), "-s", "en", "-t", "de"), "unused")  # BPE: any text


def test_prepare_splits_every_split_into_characters(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.en").write_text("ab c\nd\n")
        (tmp_path / f"{split}.de").write_text("xy\nz w\n")
    work = tmp_path / "w"
    (work / "tok").mkdir(parents=True)
    a = parsed("--corpus", str(tmp_path), "-s", "en", "-t", "de", "--char-level", "--tokenizer", "none")
    prefix = corpus._characters(a, WorkDir(str(work)), {s: str(tmp_path / s) for s in ("train", "valid", "test")})
    assert prefix == {s: f"tok/{s}.char" for s in ("train", "valid", "test")}
    assert (work / "tok" / "test.char.en").read_text() == f"a b {CHAR_BOUNDARY} c\nd\n"
    assert (work / "tok" / "valid.char.de").read_text() == f"x y\nz {CHAR_BOUNDARY} w\n"
    assert corpus.source_text(a, "test") == "tok/test.char.en"
    assert "tok/SPLIT.char.LANG" in (work / "commands" / "prepare.sh").read_text()


def test_decoding_and_tools_join_characters_back():
    a = parsed("--corpus", "c", "-s", "en", "-t", "de", "--char-level")
    bpe = parsed("--corpus", "c", "-s", "en", "-t", "de")

    def after(cmd, flag):
        return cmd[cmd.index(flag) + 1] if flag in cmd else None

    gen = commands.generate(a, "bin", "l0drop", "l0drop/checkpoint_last.pt")
    assert after(gen, "--remove-bpe") == "sentencepiece" and after(gen, "--tokenizer") == "moses"
    assert after(commands.validation_flags(a), "--eval-bleu-remove-bpe") == "sentencepiece"
    for cmd in (commands.head_importance(a, "bin"), commands.sparsity_curve(a, "bin")):
        assert after(cmd, "--remove-bpe") == "sentencepiece"
    assert after(commands.sparsity_curve(a, "bin"), "--char-boundary") == CHAR_BOUNDARY  # Fig. 6 in the curve step
    # the longest output follows the source (fairseq's 200 would cut a quarter of DDTP's German test sentences)
    a.max_source_positions = a.max_target_positions = 1024
    for cmd in (gen, commands.sparsity_curve(a, "bin"), commands.head_importance(a, "bin")):
        assert (after(cmd, "--max-len-a"), after(cmd, "--max-len-b")) == ("2.0", "10")
    assert json.loads(after(commands.validation_flags(a), "--eval-bleu-args")) == {"beam": 1, "max_len_a": 2.0,
                                                                                  "max_len_b": 10}
    given = parsed("--corpus", "c", "-s", "en", "-t", "de", "--char-level", "--max-len-a", "0", "--max-len-b", "300")
    assert (given.max_len_a, given.max_len_b) == (0.0, 300)
    assert (bpe.max_len_a, bpe.max_len_b) == (0.0, 200)  # fairseq's defaults at the subword level
    assert json.loads(after(commands.validation_flags(bpe), "--eval-bleu-args")) == {"beam": 1}
    # BPE runs as before: '--remove-bpe' alone ('@@ '), no character analysis
    gen = commands.generate(bpe, "bin", "l0drop", "l0drop/checkpoint_last.pt")
    assert "--remove-bpe" in gen and after(gen, "--remove-bpe") != "sentencepiece"
    assert "--char-boundary" not in commands.sparsity_curve(bpe, "bin")


def test_report_gives_the_pruned_characters_by_position():
    rows = [{"from": 0.0, "to": 0.5, "chars": 10, "pruned": 2, "share_pruned": 0.2, "share_of_pruned": 0.25},
            {"from": 0.5, "to": 1.0, "chars": 12, "pruned": 6, "share_pruned": 0.5, "share_of_pruned": 0.75}]
    line = " ".join(attention_lines({"l0drop": {"char_positions": rows, "entropy": 1.0, "max_weight": 0.5}}))
    assert "by their relative position inside the word" in line
    assert "0.0-0.5 20.0% of 10" in line and "0.5-1.0 50.0% of 12" in line
    boundary = {"chars": 8, "pruned": 6, "share_pruned": 0.75}
    line = " ".join(attention_lines({"l0drop": {"char_positions": rows, "char_boundary": boundary,
                                                "entropy": 1.0, "max_weight": 0.5}}))
    assert f"Word-boundary symbols ({CHAR_BOUNDARY}) L0Drop prunes: 75.0% of 8" in line
