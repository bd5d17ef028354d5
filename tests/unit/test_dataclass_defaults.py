"""fill_dataclass_defaults: the one rule by which every model fills the options an args namespace lacks."""
import argparse
from dataclasses import dataclass
from typing import Optional

from fairseq_sparse.modules.options import fill_dataclass_defaults


@dataclass
class Config:
    rate: float = 0.5
    kind: str = "mean"
    types: Optional[str] = None


def test_missing_and_none_take_the_default_set_values_stay():
    args = argparse.Namespace(rate=None, kind="sum")
    fill_dataclass_defaults(args, Config)
    assert vars(args) == {"rate": 0.5, "kind": "sum", "types": None}


def test_overrides_replace_the_default_only_where_it_is_filled_in():
    args = argparse.Namespace(kind="sum")
    fill_dataclass_defaults(args, Config, kind="max", types="enc")
    assert vars(args) == {"rate": 0.5, "kind": "sum", "types": "enc"}
