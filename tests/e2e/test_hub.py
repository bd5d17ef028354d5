"""fairseq's hub interface (from_pretrained / translate) works on transformer_l0drop checkpoints."""
import os


def test_from_pretrained_translate_pruned_equals_unpruned(l0drop_ckpt, corpus):
    from fairseq_sparse.models.transformer_l0drop import L0DropTransformerModel

    hub = L0DropTransformerModel.from_pretrained(
        os.path.dirname(l0drop_ckpt), checkpoint_file=os.path.basename(l0drop_ckpt),
        data_name_or_path=corpus["bin"], source_lang="src", target_lang="tgt",
    )
    with open(os.path.join(corpus["raw"], "test.src")) as f:
        sources = [line.strip() for line in f][:8]
    encoder = hub.models[0].encoder
    assert encoder.pruned_decoding
    pruned = hub.translate(sources, beam=4)
    encoder.pruned_decoding = False
    full = hub.translate(sources, beam=4)
    assert pruned == full
    assert all(isinstance(t, str) for t in pruned) and any(t for t in pruned)
    # the sources contain content words w<i>; a trained model emits their translations T<i>
    assert any(tok.startswith("T") for t in pruned for tok in t.split())
