"""Smoke test of the benchmark simplified_decoder.py: its --quick run (speed and a tiny BLEU part) completes,
prints both tables and writes consistent JSON. No timing assertions."""
import json
import subprocess
import sys

from conftest import REPO

SCRIPT = "fairseq_sparse.benchmarks.simplified_decoder"
VARIANTS = ["standard", "simplified", "simplified-sem-ifm"]


def test_simplified_decoder_benchmark_smoke(tmp_path):
    out_json = tmp_path / "sd.json"
    cmd = [sys.executable, "-m", SCRIPT, "--quick", "--repeats", "1", "--variants", ",".join(VARIANTS[1:]),
           "--bleu", "--bleu-updates", "4", "--workdir", str(tmp_path / "work"), "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)  # ~40 s on 2 idle cores
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "words/s" in out and "sent/s" in out and "vs standard" in out and "BLEU4" in out, out
    assert "simplified - standard" in out, out

    res = json.loads(out_json.read_text())
    speed = res["speed"]
    assert list(speed["variants"]) == VARIANTS  # the stock baseline is always there, first
    v = speed["variants"]
    assert v["standard"]["blocks"] == "self,cross,ffn" and v["simplified"]["blocks"] == "self,cross"
    assert v["simplified-sem-ifm"]["blocks"] == "cross"
    # tiny: 2 decoder layers, dim 64, FFN 128: the simplified decoder lacks fc1, fc2 and final_layer_norm
    ffn = 2 * (64 * 128 + 128 + 128 * 64 + 64 + 2 * 64)
    assert v["standard"]["params"] - v["simplified"]["params"] == ffn
    assert v["standard"]["decoder_layer_params"] - v["simplified"]["decoder_layer_params"] == ffn
    for part in ("train", "infer"):
        assert list(speed[part]) == VARIANTS
        for r in speed[part].values():
            assert len(r["times_s"]) == 1 and r["per_s"] > 0 and r["vs_standard"] > 0
        assert speed[part]["standard"]["vs_standard"] == 1.0
    assert speed["train_tokens"] == 200  # 25 sentences x 8 target tokens
    q = res["quality"]
    assert set(q) == {"standard", "simplified"}
    for r in q.values():
        assert r["test_sentences"] == 20 and r["bleu"] is not None and r["wps"] and r["gen_sent_per_s"]
    assert q["standard"]["params"] > q["simplified"]["params"]
    # identical fairseq-train command lines apart from the architecture
    strip = [a for a in q["standard"]["train_cmd"] if a not in ("transformer", q["standard"]["save"])]
    assert strip == [a for a in q["simplified"]["train_cmd"]
                     if a not in ("transformer_simplified_decoder", q["simplified"]["save"])]
