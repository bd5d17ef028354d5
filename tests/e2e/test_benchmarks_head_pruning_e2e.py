"""Smoke test of the benchmark head_pruning.py: its tiniest run completes, prints the tables, and the
pruned models decode exactly like the full model with the same heads masked. No timing assertions.
Here the tests that train or run console scripts; the pure ones are in tests/unit/test_benchmarks_head_pruning.py."""
import json
import subprocess
import sys

from conftest import REPO

SCRIPT = "fairseq_sparse.benchmarks.head_pruning"
VARIANTS = ("full-stock", "full-same-path", "pruned-25%", "pruned-50%", "pruned-75%", "pruned-100%")


def test_head_pruning_benchmark_smoke(tmp_path):
    out_json = tmp_path / "hp.json"
    cmd = [sys.executable, "-m", SCRIPT, "--quick", "--size", "tiny", "--repeats", "1", "--batch-sizes", "1,4",
           "--src-len", "8", "--out-len", "6", "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "equivalence check: PASS" in out, out
    assert "FAIL" not in out and "DIFFER" not in out, out
    # the parameter table and the timing table, one row per variant and batch size
    assert "heads kept" in out and "attn params" in out, out
    assert "vs same-path" in out and "decode MB" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]
    for B in ("1", "4"):
        assert sorted(r[1] for r in rows if r[0] == B) == sorted(VARIANTS), out
    assert "attention's share of the decoding time" in out, out

    res = json.loads(out_json.read_text())
    assert set(res["rows"]) == {"1", "4"}
    assert all(c["passed"] for c in res["equivalence"].values())
    v = res["variants"]
    assert v["full-stock"]["heads_kept"] == v["full-stock"]["heads_total"] == 24  # tiny: 2 layers x 3 types x 4
    assert [v[f"pruned-{p}%"]["heads_kept"] for p in (25, 50, 75, 100)] == [18, 12, 6, 0]
    assert v["pruned-50%"]["kept_per_layer"] == {"enc": [2, 2], "dec": [2, 2], "encdec": [2, 2]}
    assert v["full-stock"]["params"] > v["pruned-25%"]["params"] > v["pruned-50%"]["params"]
    assert v["full-same-path"]["params"] == v["full-stock"]["params"]
    for r in res["rows"]["4"].values():
        assert r["out_lengths"] == [7] and len(r["times_s"]) == 1 and r["sent_per_s"] > 0
