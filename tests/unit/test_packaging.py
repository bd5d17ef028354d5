"""setup.py's requirements, read with ast (no pip, no setup() run): installing the plugin must not replace a
user's torch, and what the features import is declared."""
import ast
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _setup_kwargs() -> dict:
    tree = ast.parse((ROOT / "setup.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup"]
    assert len(calls) == 1, "setup.py should call setup() once"
    return {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords
            if k.arg in ("install_requires", "extras_require", "license")}


def _by_name(reqs) -> dict:
    parsed = [Requirement(r) for r in reqs]
    return {r.name.lower().replace("_", "-"): r for r in parsed}


def test_torch_has_a_lower_bound_and_no_exact_pin():
    torch = _by_name(_setup_kwargs()["install_requires"])["torch"]
    ops = {s.operator for s in torch.specifier}
    assert not ops & {"==", "===", "~="}, f"torch is pinned: {torch}"
    assert ">=" in ops, f"torch needs a lower bound: {torch}"
    assert not any(s.operator in ("<", "<=") for s in torch.specifier), f"no upper bound on torch: {torch}"


def test_what_the_features_import_is_required():
    reqs = _by_name(_setup_kwargs()["install_requires"])
    for name in ("matplotlib", "sacrebleu", "numpy", "sacremoses", "subword-nmt", "rouge-score"):
        assert name in reqs, f"{name} missing from install_requires"


def test_optional_extras_and_license():
    kw = _setup_kwargs()
    extras = {k: _by_name(v) for k, v in kw["extras_require"].items()}
    assert "spacy" in extras["pos"] and "ctranslate2" in extras["ctranslate2"] and "entmax" in extras["entmax"]
    assert kw["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
