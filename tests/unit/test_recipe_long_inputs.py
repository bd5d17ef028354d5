"""The recipe's long inputs without running fairseq: fairseq's BART layout and the tokeniser language, source
truncation and its counts, the positions read from a data-bin, the checks that nothing is dropped or skipped,
the decoding settings on every fairseq-generate, and what the report states of them (issue 24, item 2)."""
import json
from argparse import Namespace

import numpy as np
import pytest
import torch

from fairseq_sparse.recipe import commands, corpus, lengths, methods
from fairseq_sparse.recipe.option_checks import parse_args
from fairseq_sparse.recipe.options import decoding_changes, get_parser
from fairseq_sparse.recipe.report import length_lines, render
from fairseq_sparse.recipe.workdir import WorkDir


def bart_corpus(root, docs=("a b c d e", "f g", "h i j"), summaries=("a", "f", "h")):
    for split in ("train", "valid", "test"):
        (root / f"{split}.source").write_text("".join(d + "\n" for d in docs))
        (root / f"{split}.target").write_text("".join(s + "\n" for s in summaries))
    return root


def parsed(*argv):
    return parse_args(["--work-dir", "w"] + list(argv))


def refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--work-dir", "w"] + list(argv))
    return capsys.readouterr().err


def test_bart_layout_is_found_without_suffixes(tmp_path, capsys):
    c = str(bart_corpus(tmp_path))
    a = parsed("--corpus", c)
    assert (a.source_lang, a.target_lang) == ("source", "target")
    assert (parsed("--corpus", c, "-s", "source", "-t", "target").source_lang) == "source"  # explicit: the same
    (tmp_path / "train.target").unlink()
    assert "-s/--source-lang and -t/--target-lang are required" in refused(["--corpus", c], capsys)
    assert "give both -s/--source-lang and -t/--target-lang, or neither" in refused(["--corpus", c, "-s", "en"], capsys)


def test_data_bin_bart_layout_and_truncation_refused_there(tmp_path, capsys):
    (tmp_path / "dict.source.txt").write_text("a 1\n")
    (tmp_path / "dict.target.txt").write_text("a 1\n")
    assert parsed("--data-bin", str(tmp_path)).target_lang == "target"
    assert "--truncate-source cuts the prepared text before it is binarised" in refused(
        ["--data-bin", str(tmp_path), "--truncate-source", "10"], capsys)


@pytest.mark.parametrize("extra,message", [
    (["--truncate-source", "-1"], "--truncate-source must not be negative"),
    (["--min-len", "0"], "--min-len must be at least 1"),
    (["--min-len", "50", "--max-len-b", "20"], "--min-len 50 is longer than the longest output --max-len-b 20"),
    (["--no-repeat-ngram-size", "-2"], "--no-repeat-ngram-size must not be negative"),
    (["--lenpen", "nan"], "--lenpen must be a number"),
    (["--tokenizer-lang", "en,de,fr"], "--tokenizer-lang: one Moses language code (both sides) or two"),
    (["-s", "en", "-t", "en"], "-s and -t are the same suffix 'en'"),
])
def test_bad_long_input_options_are_refused(extra, message, capsys):
    argv = ["--corpus", "c"] + ([] if "-s" in extra else ["-s", "en", "-t", "de"]) + extra
    assert message in refused(argv, capsys)


def test_max_len_is_gone():
    """--max-len ('drop training pairs longer than this') was never read: removed; nothing is dropped."""
    with pytest.raises(SystemExit):
        get_parser().parse_args(["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w", "--max-len", "100"])


def test_tokeniser_language_of_the_bart_layout(tmp_path):
    c = str(bart_corpus(tmp_path))
    with pytest.raises(SystemExit) as e:
        corpus.check_inputs(parsed("--corpus", c), "unused")
    message = str(e.value)
    assert "no Moses tokeniser rules for language code 'source' (the suffix of the .source files)" in message
    assert "--tokenizer-lang en" in message and "\n" not in message
    corpus.check_inputs(parsed("--corpus", c, "--tokenizer-lang", "en"), "unused")  # accepted
    corpus.check_inputs(parsed("--corpus", c, "--tokenizer", "none"), "unused")
    assert corpus.tokenizer_langs(parsed("--corpus", c, "--tokenizer-lang", "en")) == {"source": "en", "target": "en"}
    a = parsed("--corpus", c, "-s", "source", "-t", "target", "--tokenizer-lang", "en,de")
    assert corpus.tokenizer_langs(a) == {"source": "en", "target": "de"}
    with pytest.raises(SystemExit, match="language code 'xx' \\(given by --tokenizer-lang\\)"):
        corpus.check_inputs(parsed("--corpus", c, "--tokenizer-lang", "xx"), "unused")
    (tmp_path / "valid.source").rename(tmp_path / "valid.src")
    with pytest.raises(SystemExit, match="missing corpus file .*valid.source"):
        corpus.check_inputs(parsed("--corpus", c, "--tokenizer-lang", "en"), "unused")


def test_a_suffix_corpus_with_bart_files_names_the_layout(tmp_path):
    c = str(bart_corpus(tmp_path))
    with pytest.raises(SystemExit, match="train.en \\(the folder has fairseq's BART layout: -s source -t target"):
        corpus.check_inputs(parsed("--corpus", c, "-s", "en", "-t", "de"), "unused")


def test_truncation_cuts_and_counts_every_split(tmp_path):
    (tmp_path / "c").mkdir()
    c = bart_corpus(tmp_path / "c", docs=("a b c d e", "f g", "h  i\tj k", ""), summaries=("a", "f", "h", "x"))
    work = tmp_path / "w"
    (work / "tok").mkdir(parents=True)
    a = parsed("--corpus", str(c), "--tokenizer", "none", "--bpe-merges", "0", "--truncate-source", "3")
    wd = WorkDir(str(work))
    prefix = {split: str(c / split) for split in ("train", "valid", "test")}
    new = lengths.truncate_sources(a, wd, prefix)
    assert new == {split: f"tok/{split}.trunc" for split in ("train", "valid", "test")}
    assert (work / "tok" / "test.trunc.source").read_text() == "a b c\nf g\nh i j\n\n"
    assert (work / "tok" / "test.trunc.target").read_text() == (c / "test.target").read_text()
    counts = json.loads((work / "truncation.json").read_text())
    assert counts["tokens"] == 3
    assert counts["splits"]["valid"] == {"documents": 4, "truncated": 2, "longest": 5, "tokens_cut": 3}
    recorded = (work / "commands" / "prepare.sh").read_text()
    assert "awk -v n=3 '{NF = NF > n ? n : NF} 1' < CORPUS/SPLIT.source" in recorded
    assert corpus.source_text(a, "test") == "tok/test.trunc.source"
    # without truncation: counted, nothing written, the prefix kept
    a0 = parsed("--corpus", str(c), "--tokenizer", "none", "--bpe-merges", "0")
    assert lengths.truncate_sources(a0, wd, prefix) == prefix
    assert json.loads((work / "truncation.json").read_text())["splits"]["test"]["truncated"] == 0


def _data_bin(root, src_lens, tgt_lens, langs=("source", "target")):
    from fairseq.data import indexed_dataset

    root.mkdir(exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang, lens in zip(langs, (src_lens, tgt_lens)):
            prefix = str(root / f"{split}.{langs[0]}-{langs[1]}.{lang}")
            b = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
            for n in lens:
                b.add_item(torch.full((n,), 5, dtype=torch.int32))
            b.finalize(prefix + ".idx")
    return str(root)


def test_positions_follow_the_truncation_and_the_longest_target():
    longest = {"train": {"source": 3000, "target": 40}, "test": {"source": 12, "target": 1500}}
    assert lengths.positions(400, longest) == (401, 1500)
    assert lengths.positions(0, longest) == (3000, 1500)
    assert lengths.positions(0, {"t": {"source": 9, "target": 9}}) == (1024, 1024)  # fairseq's default floor


def test_fit_reads_the_data_bin_and_refuses_what_would_be_dropped(tmp_path):
    data = _data_bin(tmp_path / "bin", [5, 1300, 7], [3, 4, 2000])
    work = tmp_path / "w"
    a = parsed("--data-bin", data, "-s", "source", "-t", "target", "--max-tokens", "4096")
    found = lengths.fit(a, WorkDir(str(work)), data)
    assert (a.max_source_positions, a.max_target_positions) == (1300, 2000)
    assert found["positions"] == [1300, 2000] and found["longest"]["test"] == {"source": 1300, "target": 2000}
    flags = commands.common_train_flags(a)
    assert flags[flags.index("--max-source-positions") + 1] == "1300"
    with pytest.raises(SystemExit, match="the longest train pair has 2000 tokens, more than --max-tokens 1000"):
        lengths.fit(parsed("--data-bin", data, "-s", "source", "-t", "target", "--max-tokens", "1000"),
                    WorkDir(str(work)), data)


def test_speed_lengths_must_fit_the_truncated_positions(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "truncation.json").write_text(json.dumps({"tokens": 20, "splits": {}}))
    data = _data_bin(work / "data-bin", [5, 21], [2, 3])
    c = str(bart_corpus(tmp_path))
    a = parsed("--corpus", c, "--truncate-source", "20", "--steps", "speed", "--speed-lengths", "10,25")
    with pytest.raises(SystemExit, match="--speed-lengths 10,25: the models hold 20 source tokens and EOS .* up to 20"):
        lengths.fit(a, WorkDir(str(work)), data)
    lengths.fit(parsed("--corpus", c, "--truncate-source", "20", "--steps", "speed", "--speed-lengths", "10,20"),
                WorkDir(str(work)), data)


def test_a_work_dir_prepared_with_another_truncation_is_refused(tmp_path):
    check_prepared = corpus.check_prepared
    work = tmp_path / "w"
    work.mkdir()
    data = _data_bin(work / "data-bin", [5, 6], [2, 3])
    c = str(bart_corpus(tmp_path))
    check_prepared(parsed("--corpus", c), WorkDir(str(work)), data)  # the data's key, as the prepare step keeps it
    with pytest.raises(SystemExit, match=r"the data in .* was made with --truncate-source 0 \(this run: 4\): use a "
                                         "new --work-dir"):
        check_prepared(parsed("--corpus", c, "--truncate-source", "4"), WorkDir(str(work)), data)
    a = parsed("--corpus", c)
    check_prepared(a, WorkDir(str(work)), data)
    lengths.fit(a, WorkDir(str(work)), data)
    assert a.max_source_positions == 1024


def test_every_test_document_must_be_decoded(tmp_path):
    data = _data_bin(tmp_path / "bin", [5, 6, 7], [2, 3, 4])
    a = parsed("--data-bin", data, "-s", "source", "-t", "target")
    all_three = {"D": {0: ["-1", "x"], 1: ["-1", "y"], 2: ["-1", "z"]}}
    lengths.check_decoded(a, data, "baseline", all_three)
    with pytest.raises(SystemExit, match="baseline: fairseq-generate decoded 2 of the 3 test documents"):
        lengths.check_decoded(a, data, "baseline", {"D": {0: ["-1", "x"], 2: ["-1", "z"]}})


def test_decoding_settings_reach_every_fairseq_generate():
    a = parsed("--corpus", "c", "-s", "en", "-t", "de", "--lenpen", "2.0", "--min-len", "5", "--max-len-a", "0.5",
               "--max-len-b", "30", "--no-repeat-ngram-size", "3")
    a.max_source_positions, a.max_target_positions = 401, 1024
    want = ["--lenpen", "2.0", "--min-len", "5", "--max-len-a", "0.5", "--max-len-b", "30",
            "--no-repeat-ngram-size", "3", "--max-source-positions", "401", "--max-target-positions", "1024"]
    for cmd in (commands.generate(a, "bin", "l0drop", "l0drop/checkpoint_last.pt"),
                commands.generate_train_shard(a, "bin", 5, 0, 2)):
        assert " ".join(want) in " ".join(cmd)
        assert "--skip-invalid-size-inputs-valid-test" not in cmd  # nothing is skipped silently
    for cmd in (commands.head_importance(a, "bin"), commands.sparsity_curve(a, "bin")):  # the tools' BLEU decoding
        assert " ".join(["--lenpen", "2.0", "--max-len-a", "0.5", "--max-len-b", "30"]) in " ".join(cmd)
    train = commands.finetune(a, "bin", methods.BY_NAME["l0drop"])
    assert train[train.index("--max-source-positions") + 1] == "401"


def test_decoding_settings_key_the_cache_only_where_they_differ_from_fairseqs():
    from fairseq_sparse.recipe.decoding import Decoding

    base = parsed("--corpus", "c", "-s", "en", "-t", "de")
    assert decoding_changes(base) == {}  # results decoded before these options keep their key
    dec = Decoding(base, None, "bin")
    assert set(dec.decoding_settings()) == {"beam", "batch_size", "metric", "tokenizer", "bpe", "overrides"}
    changed = parsed("--corpus", "c", "-s", "en", "-t", "de", "--lenpen", "0.6", "--no-repeat-ngram-size", "3")
    # n-gram blocking also names the plugin's blocker: decodings cached while fairseq's blocked nothing are stale
    assert Decoding(changed, None, "bin").decoding_settings() == dict(
        dec.decoding_settings(), lenpen=0.6, no_repeat_ngram_size=3, ngram_blocking="fairseq's kernel rule")


def test_the_report_states_truncation_positions_and_decoding():
    a = parsed("--corpus", "c", "-s", "en", "-t", "de", "--truncate-source", "400", "--lenpen", "2.0")
    found = {"truncation": {"tokens": 400, "splits": {
        "train": {"documents": 500, "truncated": 120, "longest": 1800, "tokens_cut": 9000},
        "valid": {"documents": 30, "truncated": 7, "longest": 900, "tokens_cut": 1000},
        "test": {"documents": 25, "truncated": 5, "longest": 1200, "tokens_cut": 2000}}},
        "positions": [401, 1024], "longest": {}}
    lines = length_lines(Namespace(**vars(a)), found)
    assert lines[0] == ("- Sources cut to their first 400 tokens after tokenisation and BPE (--truncate-source): "
                        "train 120 of 500, valid 7 of 30, test 5 of 25 documents cut (the longest had 1,800 tokens).")
    assert lines[1].startswith("- Model positions: 401 source, 1,024 target")
    assert "--lenpen 2.0" in lines[2] and "--no-repeat-ngram-size 0" in lines[2]
    plain = length_lines(Namespace(**vars(a)), {"truncation": {"tokens": 0, "splits": {}}, "positions": [1024, 1024],
                                                 "longest": {"train": {"source": 35, "target": 9}}})
    assert plain[0] == "- Sources not truncated (the longest has 34 tokens after tokenisation and BPE)."
    # a --data-bin's sources are as it was binarised (maybe cut then): the report does not say "not truncated"
    given = length_lines(Namespace(**vars(parsed("--data-bin", "bin", "-s", "en", "-t", "de"))),
                         {"truncation": {"tokens": 0, "splits": {}}, "positions": [1024, 1024],
                          "longest": {"train": {"source": 35, "target": 9}}})
    assert given[0] == "- Sources as the --data-bin holds them (the longest has 34 tokens)."
    assert length_lines(a, None) == []  # results.json of a run before these lines


def test_report_renders_the_lengths_from_results_json_alone(tmp_path, monkeypatch):
    settings = vars(parsed("--corpus", "c", "-s", "en", "-t", "de", "--truncate-source", "3"))
    row = {"score": 10.0, "sentences": 3, "checkpoint": "x", "l0drop_sparsity": None, "parameters": 1000}
    results = {"models": {"baseline": row}, "heads": {}, "attention": {}, "curve": [], "speed": [],
               "settings": settings, "lengths": {"truncation": {"tokens": 3, "splits": {
                   "test": {"documents": 3, "truncated": 1, "longest": 5, "tokens_cut": 2}}},
                   "positions": [4, 1024], "longest": {"test": {"source": 4, "target": 2}}}}
    monkeypatch.chdir(tmp_path)
    lines = render(json.loads(json.dumps(results)))
    assert any(l.startswith("- Sources cut to their first 3 tokens") and "test 1 of 3" in l for l in lines)


def test_a_brought_baseline_must_hold_the_longest_test_document(tmp_path, monkeypatch):
    """Without truncation the positions follow the data, but a brought baseline keeps its own: a longer test
    source is refused before work (fairseq-generate would stop on it)."""
    import fairseq_sparse.checkpoint_safety as cs

    data = _data_bin(tmp_path / "bin", [5, 6, 1500], [2, 3, 4])
    monkeypatch.setattr(cs, "read_state", lambda path: {"path": path})
    monkeypatch.setattr(cs, "model_options", lambda state: {"max_source_positions": 1024})
    a = parsed("--data-bin", data, "-s", "source", "-t", "target", "--baseline-checkpoint", "mine.pt")
    with pytest.raises(SystemExit, match="the longest test source has 1500 tokens .* more than the 1024 positions "
                                         "of the brought baseline"):
        lengths.fit(a, WorkDir(str(tmp_path / "w")), data)


def test_rouge_rows_get_a_paired_test_against_their_control():
    """With --metric rouge every model against its control gets the paired bootstrap over documents (the BLEU
    runs keep sacrebleu's), and the report names the test."""
    from fairseq_sparse.recipe.decoding import significance
    from fairseq_sparse.recipe.report import test_name

    a = parsed("--corpus", "c", "-s", "en", "-t", "de", "--metric", "rouge")
    refs = ["the cat sat on the mat.", "a dog ran in the park.", "birds fly south in winter."] * 4
    control = {"hypotheses": [(r, -1.0) for r in refs], "references": refs}
    worse = {"hypotheses": [(r.split()[0], -1.0) for r in refs], "references": refs}
    test = significance(a, {"control": control, "l0drop": worse}, {"l0drop": "control"})["l0drop"]
    assert test["delta"] < -50 and test["p_value"] < 0.01
    assert "documents" in test_name(a) and "sacrebleu" in test_name(parsed("--corpus", "c", "-s", "en", "-t", "de"))
