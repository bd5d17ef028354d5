"""Deployable artefacts: a checkpoint's model with fairseq's beam search (``SequenceGenerator``) and the two
dictionaries, compiled with ``torch.jit.script`` into one TorchScript file that runs with torch alone (no
fairseq, no plugin, no ``--user-dir``), from C++ too. ``fairseq-sparse-export`` (``cli/export.py``) is the
command; this module is its logic: which checkpoints can be exported (:func:`refusal`, read from the
checkpoint's options before anything is built), the wrapper module (:class:`ScriptedTranslator`), int8 dynamic
quantisation (:func:`quantise_int8`) and :func:`export`.

The artefact translates binarised ids (what fairseq-preprocess wrote: word ids ending with EOS) with the
generation options fixed at export; ``encode`` / ``decode`` map whitespace-separated tokens (after the
tokeniser and BPE the model was trained with: they are not in the file) to ids and back with the checkpoint's
dictionaries. See docs/deployment.md.
"""
import copy
import json
import os
from typing import Dict, List, Mapping, Optional

import torch
from torch import Tensor, nn

#: the artefact's JSON metadata, also readable without running it: torch.jit.load(path, _extra_files=...)
METADATA_FILE = "fairseq_sparse_export.json"
FORMAT_VERSION = 1

#: fairseq-generate's defaults for the generation options the artefact fixes
GENERATION_DEFAULTS = dict(beam=5, max_len_a=0.0, max_len_b=200, min_len=1, lenpen=1.0, unkpen=0.0,
                           no_repeat_ngram_size=0)

#: the only encoder-decoder attention normaliser that scripts (the others call Python-only code)
_SCRIPTABLE_NORMALISERS = (None, "softmax")


def refusal(model_options: Mapping) -> Optional[str]:
    """Why a checkpoint with these model options (``checkpoint_safety.model_options``) cannot be exported
    faithfully, or None. Read before any model is built, so a refusal costs nothing."""
    arch = str(model_options.get("arch") or model_options.get("_name") or "")
    if not arch.startswith("transformer"):
        return f"architecture {arch or '(unknown)'}: only fairseq transformer checkpoints are exported"
    if model_options.get("encoder_output_pattern") == "pos":
        return ("--encoder-output-pattern pos reads part-of-speech tags that travel with fairseq's data "
                "(--task translation_source_tags); the artefact takes token ids only. Decode it with "
                "fairseq-generate --user-dir fairseq_sparse --task translation_source_tags")
    normaliser = model_options.get("encdec_attention_normaliser")
    if normaliser not in _SCRIPTABLE_NORMALISERS:
        return (f"--encdec-attention-normaliser {normaliser}: only softmax attention is exported (the sparse "
                "normalisers and the Gumbel noise call Python-only code)")
    if model_options.get("encdec_attention_coverage"):
        return "--encdec-attention-coverage: the coverage model is not scriptable; it is not exported"
    # last: the one refusal with a remedy, given only where the pruned model would then export
    gates = [t for t in str(model_options.get("head_gates") or "").split(",") if t.strip()]
    if gates:
        return (f"the model has head gates ({','.join(gates)}): cut the closed heads out first "
                "(fairseq-sparse-prune-heads --path CKPT --output pruned.pt) and export pruned.pt; the gates' "
                "forward hooks do not script, and a pruned model computes what the gated one does")
    return None


def quantise_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantisation of every ``nn.Linear`` but the L0Drop gates' (weights int8, activations quantised
    per call), torch.ao.quantization.quantize_dynamic; the gates stay float32 (they read the int8 layers' outputs),
    and so does the output projection of an attention layer whose heads were all pruned (only its bias is used).
    fairseq's attention fast path (``F.multi_head_attention_forward``) reads ``q_proj.bias`` / ``.weight`` as
    tensors, which a quantised Linear has only as methods: every attention module is switched to fairseq's own
    path (``skip_embed_dim_check``, as head scaling does), which calls the projections as modules. TorchScript
    never takes the fast path, so this matters to eager use only."""
    from fairseq.modules import MultiheadAttention

    from .modules.head_gates import HeadlessAttention
    from .modules.l0drop import L0Drop

    # the gates, and attention layers without heads (they only add their output bias: no product to quantise)
    kept_float = {id(m) for owner in model.modules() if isinstance(owner, (L0Drop, HeadlessAttention))
                  for m in owner.modules()}
    linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) not in kept_float}
    quantised = torch.ao.quantization.quantize_dynamic(model, linears, dtype=torch.qint8)
    for module in quantised.modules():
        if isinstance(module, MultiheadAttention):
            module.skip_embed_dim_check = True
    return quantised


class FlatLinear(nn.Module):
    """A float ``nn.Linear`` applied as one 2-D matrix product over every leading dimension. Scripted, fairseq's
    output projection of the decoder's B x 1 x C states otherwise runs as a batched product against the weight
    expanded to B x C x V (one 2-D product in eager mode): on CPU at an 8k vocabulary that made the float32
    artefact slower than fairseq-generate. Same weight and bias (shared, not copied)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        out = nn.functional.linear(x.reshape(-1, x.size(-1)), self.weight, self.bias)
        return out.view(list(x.size()[:-1]) + [out.size(-1)])


def flatten_output_projection(model: nn.Module):
    """The decoder's float output projection as a :class:`FlatLinear` (an int8 one flattens its input itself)."""
    decoder = getattr(model, "decoder", None)
    if type(getattr(decoder, "output_projection", None)) is nn.Linear:
        decoder.output_projection = FlatLinear(decoder.output_projection)


class ScriptedTranslator(nn.Module):
    """What the artefact holds: fairseq's SequenceGenerator over the model, the dictionaries' symbols, the source
    padding side and the longest source the model reads. ``forward(src_tokens, src_lengths)`` is fairseq's batch
    interface (padded ids, as fairseq-generate's batches); ``translate`` pads a list of id tensors itself;
    ``encode`` / ``decode`` map tokens to ids and back. A source longer than the model's positions is refused with a
    ValueError naming both lengths (fairseq-generate refuses it too); an empty list translates to an empty list."""

    def __init__(self, generator: nn.Module, src_symbols: List[str], tgt_symbols: List[str], pad: int, eos: int,
                 unk: int, left_pad_source: bool, metadata: str, max_source_positions: int = 1024):
        super().__init__()
        self.generator = generator
        self.src_symbols: List[str] = list(src_symbols)
        self.tgt_symbols: List[str] = list(tgt_symbols)
        # the first occurrence wins, as in fairseq's Dictionary.indices
        src_index: Dict[str, int] = {}
        for i, s in enumerate(src_symbols):
            if s not in src_index:
                src_index[s] = i
        self.src_index: Dict[str, int] = src_index
        self.pad, self.eos, self.unk = int(pad), int(eos), int(unk)
        self.left_pad_source = bool(left_pad_source)
        self.metadata = metadata
        self.max_source_positions = int(max_source_positions)

    def forward(self, src_tokens: Tensor, src_lengths: Tensor) -> List[List[Dict[str, Tensor]]]:
        """n-best hypotheses of each sentence of a padded batch (B x T ids, left-padded as fairseq pads
        sources by default): a list per sentence of dicts with ``tokens`` (ending with EOS), ``score`` (natural
        log; fairseq-generate prints score / ln 2), ``positional_scores``, ``attention``, ``alignment``."""
        if src_tokens.size(1) > self.max_source_positions:
            raise ValueError("a source of " + str(src_tokens.size(1)) + " tokens: the model reads at most "
                             + str(self.max_source_positions) + " (its --max-source-positions); split or cut it")
        sample: Dict[str, Dict[str, Tensor]] = {"net_input": {"src_tokens": src_tokens, "src_lengths": src_lengths}}
        with torch.no_grad():
            return self.generator(sample)

    @torch.jit.export
    def translate(self, sentences: List[Tensor]) -> List[List[Dict[str, Tensor]]]:
        """Hypotheses of sentences given as 1-D id tensors (each ending with EOS, as binarised), padded here the
        way fairseq's collater pads them, in one batch."""
        if len(sentences) == 0:
            return []
        lengths: List[int] = [int(s.size(0)) for s in sentences]
        width = max(lengths)
        batch = torch.full([len(sentences), width], self.pad, dtype=torch.long)
        for i, s in enumerate(sentences):
            n = lengths[i]
            if self.left_pad_source:
                batch[i, width - n:] = s
            else:
                batch[i, :n] = s
        return self.forward(batch, torch.tensor(lengths, dtype=torch.long))

    @torch.jit.export
    def encode(self, line: str) -> Tensor:
        """Source ids of a line of whitespace-separated tokens, EOS appended (fairseq's encode_line; unknown
        tokens map to unk)."""
        ids: List[int] = []
        for token in line.split():
            ids.append(self.src_index.get(token, self.unk))
        ids.append(self.eos)
        return torch.tensor(ids, dtype=torch.long)

    @torch.jit.export
    def decode(self, tokens: Tensor) -> str:
        """Target tokens as a string (EOS and padding left out), as fairseq-generate's H lines print them."""
        words: List[str] = []
        ids: List[int] = tokens.tolist()
        for t in ids:
            if t != self.eos and t != self.pad:
                words.append(self.tgt_symbols[t])
        return " ".join(words)


def build_generator(model: nn.Module, tgt_dict, options: Mapping):
    """fairseq's SequenceGenerator with fairseq-generate's meaning of each option."""
    from fairseq.sequence_generator import SequenceGenerator

    return SequenceGenerator([model], tgt_dict, beam_size=int(options["beam"]), max_len_a=float(options["max_len_a"]),
                             max_len_b=int(options["max_len_b"]), min_len=int(options["min_len"]),
                             len_penalty=float(options["lenpen"]), unk_penalty=float(options["unkpen"]),
                             no_repeat_ngram_size=int(options["no_repeat_ngram_size"]))


def script_translator(model: nn.Module, task, options: Mapping, metadata: Mapping, beam_attention: bool = True):
    """The scripted :class:`ScriptedTranslator` of an eval-mode model (quantise first for int8).
    ``beam_attention`` False: the beam search keeps no attention over the source (each hypothesis' ``attention``
    is an empty tensor; tokens and scores as with it, modules/beam_attention.py).
    Raises ValueError with torch.jit's message when something does not script."""
    from .modules.beam_attention import add_beam_attention_option

    model = copy.deepcopy(model)  # the caller's model is left as it is
    add_beam_attention_option(model.decoder)
    model.decoder.beam_attention = bool(beam_attention)
    for p in model.parameters():  # inference only: no autograd graph in the file's calls
        p.requires_grad_(False)
    flatten_output_projection(model)
    generator = build_generator(model, task.target_dictionary, options)
    src, tgt = task.source_dictionary, task.target_dictionary
    left_pad = bool(getattr(getattr(task, "cfg", None), "left_pad_source", True))
    wrapper = ScriptedTranslator(generator, src.symbols, tgt.symbols, tgt.pad(), tgt.eos(), tgt.unk(), left_pad,
                                 json.dumps(dict(metadata), sort_keys=True), int(model.encoder.max_positions()))
    if src.pad() != tgt.pad() or src.eos() != tgt.eos():
        raise ValueError("source and target dictionaries disagree on pad / eos ids: not supported")
    try:
        return torch.jit.script(wrapper)
    except Exception as e:  # torch.jit's frontend errors have several types
        raise ValueError(f"torch.jit.script failed: {type(e).__name__}: {e}") from e


def save(scripted, path: str, metadata: Mapping):
    """The artefact written beside PATH and renamed onto it: a full disk or a killed run leaves no half file there.
    It is serialised in memory first: libtorch's own file writer ends the process from its destructor when the disk
    is full (no Python exception, the temporary file left behind); Python's write raises an OSError instead."""
    import io

    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer, _extra_files={METADATA_FILE: json.dumps(dict(metadata), sort_keys=True)})
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_metadata(path: str) -> dict:
    """The JSON metadata of an artefact, without running it."""
    files = {METADATA_FILE: ""}
    torch.jit.load(path, map_location="cpu", _extra_files=files)
    return json.loads(files[METADATA_FILE])
