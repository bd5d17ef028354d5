"""The cases issue 45 left to decide, each decided and tested: the exported artefact refuses a source longer than
the model's positions (as fairseq-generate does) and translates an empty list to an empty list; the recipe reads a
gold alignment file before any work; --metric rouge on text that is not English says how it tokenises."""
from typing import Dict, List

import pytest
import torch
from torch import Tensor, nn

from fairseq_sparse.export import ScriptedTranslator


class NoHypotheses(nn.Module):
    """A generator (fairseq's interface) that returns no hypotheses: what the artefact's own checks are tried on."""

    def forward(self, sample: Dict[str, Dict[str, Tensor]]) -> List[List[Dict[str, Tensor]]]:
        out: List[List[Dict[str, Tensor]]] = []
        for _ in range(sample["net_input"]["src_tokens"].size(0)):
            out.append(torch.jit.annotate(List[Dict[str, Tensor]], []))
        return out


@pytest.mark.parametrize("scripted", [False, True], ids=["eager", "torchscript"])
def test_the_artefact_refuses_a_source_beyond_its_positions_and_takes_an_empty_list(scripted):
    symbols = ["<s>", "<pad>", "</s>", "<unk>", "a", "b"]
    translator = ScriptedTranslator(NoHypotheses(), symbols, symbols, 1, 2, 3, True, "{}", max_source_positions=6)
    if scripted:
        translator = torch.jit.script(translator)
    assert translator.translate([]) == []
    assert len(translator.translate([translator.encode("a b a b a")])) == 1  # 6 tokens with EOS: the limit
    with pytest.raises(Exception, match="a source of 7 tokens: the model reads at most 6"):
        translator.translate([translator.encode("a b a b a b")])


def test_a_malformed_gold_alignment_file_is_refused_before_any_work(tmp_path, capsys):
    from fairseq_sparse.recipe.option_checks import parse_args

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        for side in ("en", "de"):
            (corpus / f"{split}.{side}").write_text("a b c\n")
    gold = tmp_path / "gold.txt"
    gold.write_text("0-0 1-x\n")
    work = tmp_path / "work"
    with pytest.raises(SystemExit):
        parse_args(["--corpus", str(corpus), "-s", "en", "-t", "de", "--work-dir", str(work),
                    "--gold-alignments", str(gold)])
    err = capsys.readouterr().err
    assert "--gold-alignments" in err and "gold.txt:1" in err, err
    assert not work.exists()


@pytest.mark.parametrize("lang, warned", [("de", True), ("en", False)])
def test_rouge_on_text_that_is_not_english_says_how_it_tokenises(tmp_path, capsys, lang, warned):
    from fairseq_sparse.recipe.option_checks import parse_args

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        for side in ("src", lang):
            (corpus / f"{split}.{side}").write_text("a b c\n")
    parse_args(["--corpus", str(corpus), "-s", "src", "-t", lang, "--work-dir", str(tmp_path / "work"),
                "--metric", "rouge"])
    err = capsys.readouterr().err
    assert ("warning: --metric rouge" in err) == warned, err
