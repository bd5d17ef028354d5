"""The device rule of the tools, the recipe and the benchmarks (cli/common.py): cuda where torch sees a CUDA
device, else cpu; ``--device cuda`` without one refused in one line before any work; the recipe's command lines
follow --device (fairseq's --cpu only on the CPU). torch.cuda.is_available is patched: no GPU needed."""
import importlib
import os
from argparse import Namespace

import pytest
import torch

from fairseq_sparse.cli import common
from fairseq_sparse.recipe import commands, speed
from fairseq_sparse.recipe.decoding import Decoding
from fairseq_sparse.recipe.option_checks import parse_args
from fairseq_sparse.recipe.options import get_parser
from fairseq_sparse.recipe.methods import BY_NAME

RECIPE = ["--corpus", "c", "-s", "en", "-t", "de", "--work-dir", "w"]


@pytest.fixture
def cuda(monkeypatch):
    """set(True / False): whether torch 'sees' a CUDA device."""
    return lambda available: monkeypatch.setattr(torch.cuda, "is_available", lambda: available)


@pytest.mark.parametrize("available, device, cpu, expected", [
    (False, None, False, "cpu"), (True, None, False, "cuda"), (True, None, True, "cpu"), (True, "cpu", False, "cpu"),
    (True, "cuda", False, "cuda"),
])
def test_the_default_follows_cuda(cuda, available, device, cpu, expected):
    cuda(available)
    args = Namespace(device=device, cpu=cpu)
    assert common.check_device(args) == expected == args.device and args.cpu == (expected == "cpu")


@pytest.mark.parametrize("device, cpu, message", [("cuda", False, "--device cuda: torch"),
                                                  ("cuda", True, "contradict")])
def test_cuda_refused_without_a_gpu(cuda, device, cpu, message):
    cuda(False)
    with pytest.raises(common.ToolError, match=message):
        common.check_device(Namespace(device=device, cpu=cpu))


TOOLS = {
    "attention_analysis": ["DATA", "--path", "NO.pt", "--output-dir", "OUT"],
    "head_analysis": ["DATA", "--path", "NO.pt", "--output-dir", "OUT"],
    "probe": ["DATA", "--path", "NO.pt", "--output-dir", "OUT"],
    "sparsity_curve": ["DATA", "--checkpoints", "NO.pt", "--output-prefix", "OUT/curve"],
    "head_importance": ["importance", "DATA", "--path", "NO.pt", "--output-dir", "OUT"],
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_tools_refuse_cuda_without_a_gpu_before_any_work(cuda, tool, tmp_path, capsys):
    cuda(False)
    main = importlib.import_module(f"fairseq_sparse.cli.{tool}").main
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / a) if a.isupper() or a.startswith("NO") else a for a in TOOLS[tool]]
             + ["--device", "cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--device cuda: torch" in err[0], err
    assert os.listdir(tmp_path) == []


def test_recipe_commands_follow_the_device(cuda):
    cuda(True)
    a = get_parser().parse_args(RECIPE)  # the default is read when the parser is built
    assert a.device == "cuda"
    fairseq_runs = [commands.generate(a, "bin", "l0drop", "x.pt"), commands.generate_train_shard(a, "bin", 5, 0, 2),
                    commands.common_train_flags(a)]
    assert not any("--cpu" in cmd for cmd in fairseq_runs)
    assert commands.decoding_flags(a)[4:6] == ["--device", "cuda"]
    assert "--device" in commands.attention_analysis(a, "bin", "l0drop")
    assert speed.timing_flags(a)[:4] == ["--device", "cuda", "--clock", "wall"]
    assert Decoding(a, None, "bin").decoding_settings()["device"] == "cuda"
    a = get_parser().parse_args(RECIPE + ["--device", "cpu"])
    assert all("--cpu" in cmd for cmd in (commands.generate(a, "bin", "l0drop", "x.pt"),
                                           commands.generate_train_shard(a, "bin", 5, 0, 2),
                                           commands.common_train_flags(a)))
    assert speed.timing_flags(a)[:6] == ["--device", "cpu", "--threads", "1", "--clock", "cpu"]
    assert "device" not in Decoding(a, None, "bin").decoding_settings()  # CPU decodings keep their cache key


def test_recipe_refuses_cuda_without_a_gpu_in_one_line(cuda, capsys):
    cuda(False)
    assert get_parser().parse_args(RECIPE).device == "cpu"
    with pytest.raises(SystemExit) as e:
        parse_args(RECIPE + ["--device", "cuda"])
    assert str(e.value).startswith("fairseq-sparse-recipe: error: --device cuda: torch") and "\n" not in str(e.value)
    assert capsys.readouterr().err == ""  # no usage block


BENCHMARKS = ("l0drop_decoding", "composed", "head_pruning", "simplified_decoder")


@pytest.fixture
def benchmark(monkeypatch):
    return lambda name: importlib.import_module(f"fairseq_sparse.benchmarks.{name}")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmarks_refuse_cuda_without_a_gpu_in_one_line(cuda, benchmark, name):
    cuda(False)
    bench = benchmark(name)
    assert bench.parse_args(["--no-memory"]).device == "cpu"
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--device", "cuda", "--fp16"])
    assert ": error: --device cuda: torch" in str(e.value) and "\n" not in str(e.value)  # prog: error: ...


@pytest.mark.parametrize("name", BENCHMARKS)
@pytest.mark.parametrize("argv, device", [([], "cuda"), (["--cpu"], "cpu"), (["--clock", "cpu"], "cpu"),
                                          (["--device", "cuda", "--fp16"], "cuda")])
def test_benchmarks_default_to_cuda_where_there_is_one(cuda, benchmark, name, argv, device):
    cuda(True)
    assert benchmark(name).parse_args(argv).device == device


def test_batch_size_and_mixed_precision_follow_the_device(cuda, capsys):
    cuda(True)
    assert parse_args(RECIPE).max_tokens == 16384 and parse_args(RECIPE + ["--device", "cpu"]).max_tokens == 4096
    assert parse_args(RECIPE + ["--max-tokens", "3000"]).max_tokens == 3000  # the user's own, on any device
    assert "--amp" in commands.common_train_flags(parse_args(RECIPE + ["--amp"]))
    on_gpu, on_cpu = parse_args(RECIPE), parse_args(RECIPE + ["--device", "cpu"])
    assert (on_gpu.amp, on_gpu.validate_interval_updates) == (True, 500)
    assert (on_cpu.amp, on_cpu.validate_interval_updates) == (False, 0)
    assert "--amp" not in commands.common_train_flags(parse_args(RECIPE + ["--no-amp"]))
    with pytest.raises(SystemExit):
        parse_args(RECIPE + ["--device", "cpu", "--amp"])
    assert "--amp is mixed precision on CUDA" in capsys.readouterr().err


def test_model_width_dropout_and_lr_follow_the_device_unless_given(cuda):
    """On CUDA the recipe's default model is 3+3 x 256 (FFN 1,024, dropout 0.2, lr 1.5e-3), on the CPU x 128 (FFN 512,
    dropout 0.1, lr 2e-3); an option given is kept on either device."""
    cuda(True)
    sizes = ("embed_dim", "ffn_dim", "dropout", "lr")
    on_gpu, on_cpu = parse_args(RECIPE), parse_args(RECIPE + ["--device", "cpu"])
    assert tuple(getattr(on_gpu, k) for k in sizes) == (256, 1024, 0.2, 1.5e-3)
    assert tuple(getattr(on_cpu, k) for k in sizes) == (128, 512, 0.1, 2e-3)
    given = parse_args(RECIPE + ["--embed-dim", "64", "--ffn-dim", "128", "--dropout", "0.3", "--lr", "1e-3"])
    assert tuple(getattr(given, k) for k in sizes) == (64, 128, 0.3, 1e-3)
    train = commands.train_from_scratch(on_gpu, "DATA", BY_NAME["baseline"])
    assert train[train.index("--encoder-embed-dim") + 1] == "256" and train[train.index("--lr") + 1] == "0.0015"
