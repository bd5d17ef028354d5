"""torch's safe loader after the plugin allowlists fairseq's checkpoint classes (the console-script
tests of tests/e2e/test_cli.py need it to load checkpoints)."""

import numpy as np
import pytest
import torch

import fairseq_sparse  # noqa: F401  (allowlists fairseq's checkpoint classes in this process too)


class NotAllowlisted:
    pass


def test_safe_loader_still_refuses_other_classes(tmp_path):
    """The plugin allowlists fairseq's classes, it does not switch the safe loader off."""
    for payload in (NotAllowlisted(), np.array(["text"], dtype=object)):
        path = str(tmp_path / "other.pt")
        torch.save({"model": {}, "extra": payload}, path)
        with pytest.raises(Exception, match="(?i)weights only load failed"):
            torch.load(path, weights_only=True)


def test_an_unreadable_checkpoint_is_named_in_one_line(tmp_path):
    """A checkpoint truncated by a full disk is named, with what to do (torch's own error names no file)."""
    import torch

    from fairseq_sparse.checkpoint_safety import UnreadableCheckpoint, read_state

    path = tmp_path / "checkpoint_last.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnreadableCheckpoint) as e:
        read_state(str(path))
    assert str(path) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)


def _data(folder, words, bins=False):
    """A data folder of dictionaries dict.src.txt, dict.tgt.txt (WORDS) and the file names fairseq infers the language
    pair from (with BINS: the binary splits the recipe checks for, empty)."""
    folder.mkdir()
    for lang in ("src", "tgt"):
        (folder / f"dict.{lang}.txt").write_text("".join(f"{w} 1\n" for w in words))
        for split in ("train", "valid", "test") if bins else ("train",):
            (folder / f"{split}.src-tgt.{lang}.bin").write_bytes(b"")
    return str(folder)


def _checkpoint(path, data, rows, sizes=None):
    """A checkpoint trained on DATA without -s/-t (its cfg names no languages) with ROWS embeddings."""
    weight = torch.zeros(rows, 2)
    torch.save({"model": {"encoder.embed_tokens.weight": weight, "decoder.embed_tokens.weight": weight},
                "cfg": {"task": {"data": data, "source_lang": None, "target_lang": None}, "model": sizes or {}}}, path)
    return str(path)


def test_a_teacher_with_a_dictionary_of_other_symbols_is_refused(tmp_path):
    """Only sizes were compared where the teacher was trained without -s/-t: a teacher over other words of the same
    number was accepted, and distilled nonsense."""
    from argparse import Namespace

    from fairseq.data import Dictionary

    from fairseq_sparse.checkpoint_safety import check_teacher_checkpoint

    data = _data(tmp_path / "data", ["a", "b", "c", "d"])
    task = Namespace(source_dictionary=Dictionary.load(f"{data}/dict.src.txt"),
                     target_dictionary=Dictionary.load(f"{data}/dict.tgt.txt"))
    other = _checkpoint(tmp_path / "other.pt", _data(tmp_path / "other", ["a", "b", "x", "d"]), len(task.source_dictionary))
    with pytest.raises(ValueError, match=r"--distill-teacher .*other.pt was trained with the dictionary .*other/dict.src.txt, "
                                         r"whose symbols differ from the data's"):
        check_teacher_checkpoint(other, task)
    same = _checkpoint(tmp_path / "same.pt", _data(tmp_path / "same", ["a", "b", "c", "d"]), len(task.source_dictionary))
    check_teacher_checkpoint(same, task)


def test_a_baseline_checkpoint_with_a_dictionary_of_other_symbols_is_refused(tmp_path, capsys):
    """fairseq-sparse-recipe --baseline-checkpoint compared the embeddings' number with --data-bin's dictionary only;
    refused before any work now (the work dir is not made)."""
    from conftest import refused_in_process
    from fairseq_sparse.recipe.main import main

    data = _data(tmp_path / "data-bin", ["a", "b", "c", "d"], bins=True)
    sizes = {"encoder_layers": 2, "decoder_layers": 2, "encoder_embed_dim": 32, "encoder_ffn_embed_dim": 64,
             "encoder_attention_heads": 2}
    ckpt = _checkpoint(tmp_path / "baseline.pt", _data(tmp_path / "other", ["a", "b", "x", "d"]), 8, sizes)
    work = tmp_path / "work"
    err = refused_in_process(main, ["--data-bin", data, "-s", "src", "-t", "tgt", "--work-dir", str(work),
                                    "--baseline-checkpoint", ckpt, "--layers", "2", "--embed-dim", "32", "--ffn-dim",
                                    "64", "--heads", "2"], capsys, status=None)
    assert f"--baseline-checkpoint {ckpt} was trained with the dictionary {tmp_path}/other/dict.src.txt, whose " \
           f"symbols differ from --data-bin's {data}/dict.src.txt" in err, err
    assert not work.exists()


def test_a_corrupt_teacher_is_named_in_one_line_before_any_work(tmp_path):
    """A teacher with a corrupt tensor passed the memory-mapped check and ended in torch's own RuntimeError ("failed
    reading file data/3: invalid header"), naming neither the file nor --distill-teacher, once fairseq loaded it."""
    from argparse import Namespace

    from fairseq.data import Dictionary

    from fairseq_sparse.checkpoint_safety import check_teacher_checkpoint
    from fairseq_sparse.criterions.label_smoothed_cross_entropy_with_sparsity import load_teacher

    data = _data(tmp_path / "data", ["a", "b", "c", "d"])
    task = Namespace(source_dictionary=Dictionary.load(f"{data}/dict.src.txt"),
                     target_dictionary=Dictionary.load(f"{data}/dict.tgt.txt"))
    path = tmp_path / "teacher.pt"
    torch.save({"model": {f"w{i}": torch.randn(50) for i in range(6)}, "cfg": {"task": {"data": data}}}, path)
    archive = bytearray(path.read_bytes())
    headers = [i for i in range(len(archive)) if archive[i:i + 4] == b"PK\x03\x04"]
    archive[headers[len(headers) // 2]:headers[len(headers) // 2] + 4] = b"XXXX"  # one member's local header
    path.write_bytes(bytes(archive))
    with pytest.raises(ValueError, match=rf"--distill-teacher {path} is not a readable fairseq checkpoint \(its member "
                                         r".* is corrupt\): truncated or corrupt"):
        check_teacher_checkpoint(str(path), task)
    with pytest.raises(SystemExit) as e:
        load_teacher(str(path), task)
    message = str(e.value.code)
    assert message.startswith(f"error: --distill-teacher {path} ") and "\n" not in message, message
    assert path.read_bytes() == bytes(archive)
