"""fairseq-sparse-recipe on a tiny summarisation corpus in fairseq's BART layout ({split}.source/.target, raw
English text): Moses with --tokenizer-lang, sources cut to --truncate-source BPE tokens and counted per split,
positions following the cut, the decoding settings on fairseq-generate, every test document decoded (issue 24)."""
import json

import pytest

from fairseq_sparse.analysis.scores import corpus_score, lead

from conftest import console, run
from helpers.recipe import bart_corpus

RECIPE = [console("fairseq-sparse-recipe")]
N = 40  # --truncate-source: BPE tokens
TINY = ["--layers", "2", "--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--bpe-merges", "60",
        "--baseline-updates", "20", "--warmup-updates", "10", "--beam", "2", "--max-tokens", "2000",
        "--baseline-patience", "0", "--threads", "1", "--metric", "rouge"]
DECODING = ["--lenpen", "1.5", "--min-len", "2", "--max-len-a", "0.1", "--max-len-b", "12",
            "--no-repeat-ngram-size", "2"]


def test_summarisation_with_truncated_long_documents(tmp_path):
    corpus, work = bart_corpus(tmp_path), tmp_path / "work"
    # raw English in .source/.target: Moses needs the text's language; one line, nothing written
    proc = run(RECIPE + ["--corpus", str(corpus), "--work-dir", str(work)] + TINY, check=False)
    assert proc.returncode != 0 and "no Moses tokeniser rules for language code 'source'" in proc.stderr
    assert "--tokenizer-lang" in proc.stderr.strip().splitlines()[-1] and not work.exists()

    run(RECIPE + ["--corpus", str(corpus), "--work-dir", str(work), "--tokenizer-lang", "en", "--truncate-source",
                  str(N), "--steps", "prepare,baseline,report"] + TINY + DECODING)
    counts = json.loads((work / "truncation.json").read_text())
    assert counts["tokens"] == N
    for split in ("train", "valid", "test"):
        before = (work / "tok" / f"{split}.bpe.source").read_text().splitlines()
        after = (work / "tok" / f"{split}.trunc.source").read_text().splitlines()
        assert after == [" ".join(line.split()[:N]) for line in before]
        long = sum(len(line.split()) > N for line in before)
        assert counts["splits"][split] == {"documents": len(before), "truncated": long,
                                           "longest": max(len(line.split()) for line in before),
                                           "tokens_cut": sum(max(0, len(line.split()) - N) for line in before)}
        assert long > 0  # some documents of every split were cut
    results = json.loads((work / "results.json").read_text())
    assert results["models"]["baseline"]["sentences"] == 10  # every test document decoded
    # the lead baseline beside the models: ROUGE of each test source's first sentence (Moses tokens leave ROUGE's
    # lowercased alphanumeric tokens as they are), the baseline's paired test against it; distinct outputs
    sources = (corpus / "test.source").read_text().splitlines()
    targets = (corpus / "test.target").read_text().splitlines()
    expected, _ = corpus_score("rouge", [lead(s) for s in sources], targets)
    lead_row = results["lead"]
    assert lead_row["score"] == pytest.approx(expected, abs=0.01) and lead_row["documents"] == 10
    assert 0 <= lead_row["baseline_against_lead"]["p_value"] <= 1
    distinct = results["models"]["baseline"]["distinct_outputs"]
    assert 0 < distinct <= 1
    assert results["lengths"]["positions"][0] == N + 1
    test = counts["splits"]["test"]
    report = (work / "REPORT.md").read_text()
    assert f"- Sources cut to their first {N} tokens" in report and f"test {test['truncated']} of 10" in report
    assert f"ROUGE-L (summary-level) {lead_row['score']:.2f} [" in report and f"baseline {distinct:.0%}" in report
    # the positions follow the cut in training and decoding; the decoding settings reach fairseq-generate
    assert f"--max-source-positions {N + 1}" in (work / "commands" / "baseline.sh").read_text()
    generate = [l for l in (work / "commands" / "report.sh").read_text().splitlines() if "fairseq-generate" in l]
    assert generate and all(" ".join(DECODING) in l and f"--max-source-positions {N + 1}" in l for l in generate)
    assert all("--skip-invalid-size-inputs-valid-test" not in l for l in generate)
    assert "--source-lang source --target-lang target" in generate[0]
    assert "sacremoses -l en" in (work / "commands" / "prepare.sh").read_text()

    # a re-run asking for another cut of the prepared data is refused before work
    again = run(RECIPE + ["--corpus", str(corpus), "--work-dir", str(work), "--tokenizer-lang", "en",
                          "--truncate-source", "30", "--steps", "baseline"] + TINY, check=False)
    assert again.returncode != 0 and "was made with --truncate-source 40" in again.stderr
