"""What the analysis tools share: registering the plugin, loading a checkpoint with its task, and layer lists."""
import argparse
import logging
import os
import sys
from typing import List, Optional


def setup_logging():
    """fairseq-style INFO logs on stderr. force: importing fairseq's models (wav2vec) already configured the
    root logger at DEBUG level."""
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)


def import_plugins(user_dir: Optional[str] = None):
    """Register fairseq_sparse (models, safe checkpoint loading) and another --user-dir plugin if given."""
    from fairseq import utils

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    utils.import_user_module(argparse.Namespace(user_dir=package_dir))
    if user_dir:
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))


def load_checkpoint(path: str, data: str, source_lang: Optional[str] = None, target_lang: Optional[str] = None,
                    task=None):
    """(model, cfg, task) of a translation checkpoint read with the dictionaries of ``data`` (with ``task``
    given: that task, and cfg of this checkpoint). Raises ValueError with a message for the user."""
    from fairseq import checkpoint_utils

    overrides = {"data": os.path.abspath(data)}
    if source_lang:
        overrides["source_lang"] = source_lang
    if target_lang:
        overrides["target_lang"] = target_lang
    try:
        if task is None:
            models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
        else:
            models, cfg = checkpoint_utils.load_model_ensemble([path], arg_overrides=overrides, task=task)
    except Exception as e:  # not a checkpoint, or dictionaries missing in DATA
        raise ValueError(f"cannot load {path} with data {data}: {type(e).__name__}: {e}") from e
    return models[0], cfg, task


def parse_layers(spec: str, n_layers: int, option: str = "--layers") -> List[int]:
    """``all``, ``last`` or comma-separated 0-based layer indices (negative ones count from the top)."""
    spec = spec.strip().lower()
    if spec == "all":
        return list(range(n_layers))
    if spec == "last":
        return [n_layers - 1]
    out = []
    for part in spec.split(","):
        try:
            k = int(part)
        except ValueError:
            raise ValueError(f"{option}: {part!r} is not a layer index (use 'all', 'last' or e.g. '2,3')") from None
        if not -n_layers <= k < n_layers:
            raise ValueError(f"{option}: layer {k} does not exist, the decoder has {n_layers} layers (0-based)")
        out.append(k % n_layers)
    return sorted(set(out))
