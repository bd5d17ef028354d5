"""Options are fairseq dataclass fields; this fills in the ones an args namespace lacks."""
from dataclasses import fields


def fill_dataclass_defaults(args, config, **overrides):
    """Every field of the dataclass ``config`` that ``args`` lacks or holds as None takes its default, or its
    value in ``overrides`` (older checkpoints, architecture presets, other models' args)."""
    for f in fields(config):
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, overrides.get(f.name, f.default))
