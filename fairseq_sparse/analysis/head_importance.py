"""Head importance, ablation and importance-ordered pruning (Michel, Levy & Neubig 2019,
"Are Sixteen Heads Really Better than One?").

Pure functions on a fairseq encoder-decoder transformer (stock ``transformer`` or this plugin's
models, physically pruned ones included); the console tool is :mod:`fairseq_sparse.cli.head_importance`,
the head mask format (read, validate, write) lives in :mod:`fairseq_sparse.modules.head_gates`.
Heads are masked with the mask variables xi_h of Michel et al. (2019) Sec. 2.3 (``set_head_masks`` of
:mod:`fairseq_sparse.modules.head_gates`): MHAtt(x, q) = sum_h xi_h Att_h(x, q).

Importance (Sec. 4.1, Eq. 2): I_h = E_{x ~ X} |dL(x) / dxi_h| at xi = 1 (the full model), where
L(x) = -log p(y | x) of one sentence pair (the summed token NLL of the reference translation, teacher
forced, model in eval mode: no dropout, no label smoothing). The expectation is the mean over the
*sentences* of the chosen data:

* ``per_sentence=True`` (default, exact): every sentence of a batch gets its own mask variable
  xi_{b,h} (a [batch x heads] tensor of ones multiplied into head h's output of sentence b); since the
  sentences of a batch do not interact in eval mode, d(sum_b L_b)/dxi_{b,h} = dL_b/dxi_h exactly, and
  I_h = (1/N) sum_x |dL(x)/dxi_h| for any batch size.
* ``per_sentence=False``: one xi_h per batch (``set_head_masks`` with a ones tensor requiring
  grad); I_h = (1/N) sum_batches |d(sum_{x in batch} L(x))/dxi_h|. This is exact for batches of one
  sentence and, for larger batches, a lower bound of the exact value (triangle inequality), as in the
  paper authors' code, which takes |.| of the gradient of each batch's loss.

With ``normalise_by_layer`` (paper: "we normalize the importance scores by layer (using the l2
norm)") each layer's vector (I_h)_h is divided by its l2 norm.

BLEU: generation with fairseq's SequenceGenerator (``task.build_generator``), hypotheses and
references detokenised with the target dictionary's ``string(tokens, bpe_symbol)``, corpus BLEU with
sacrebleu (``tokenize="none"`` on the tokenised text reproduces the paper's tokenised BLEU).
Significance: sacrebleu's paired bootstrap resampling (Koehn 2004; paper: 1000 resamples, p < 0.01). BLEU and the
test are the package's one scorer, :mod:`.scores`.
"""
import math
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .scores import bleu, bleu_metric, paired_bootstraps
from ..modules.head_gates import (ATTENTION_TYPES, HeadKey, HeadlessAttention, attention_modules,
                                  enable_head_scaling, head_ids, head_layout, masks_to_matrix, set_head_masks)

LossFn = Callable[[torch.nn.Module, dict], Tensor]


# ----------------------------------------------------------------------------------------------
# layout and masks


def original_head_ids(model) -> "OrderedDict[HeadKey, List[int]]":
    """Original head indices of the heads each layer still has (a subset after physical pruning)."""
    return OrderedDict((k, [] if isinstance(m, HeadlessAttention) else head_ids(m))
                       for k, m in attention_modules(model).items())


def full_masks(layout: Dict[HeadKey, int], value: float = 1.0, device=None) -> Dict[HeadKey, Tensor]:
    """xi = value on every head of every layer."""
    return {k: torch.full((n,), float(value), device=device) for k, n in layout.items()}


# ----------------------------------------------------------------------------------------------
# importance (Michel et al. 2019, Sec. 4.1)


def sentence_nll(model, sample) -> Tensor:
    """L(x) per sentence: -log p(y | x) summed over the reference tokens (EOS included, padding not)."""
    net_output = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    target = model.get_targets(sample, net_output)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return nll.masked_fill(target.eq(model.decoder.dictionary.pad()), 0.0).sum(-1)


class _SentenceMasks:
    """Multiply head h's output of sentence b by xi_{b,h} = 1 (a leaf requiring grad, one per layer).

    A forward pre-hook on each layer's out_proj (the concatenated heads, [time x batch x heads*dim]);
    the masks are created at the forward pass, when the batch size is known.
    """

    def __init__(self, model):
        self.modules = OrderedDict((k, m) for k, m in attention_modules(model).items()
                                   if not isinstance(m, HeadlessAttention) and m.num_heads > 0)
        self.masks: Dict[HeadKey, Tensor] = {}
        self.handles = []

    def _hook(self, key, mha):
        def pre_hook(module, args):
            (x,) = args
            if x.dim() != 3:
                raise RuntimeError(f"unexpected attention output shape {tuple(x.shape)} in {key}")
            t, b, e = x.shape
            xi = torch.ones(b, mha.num_heads, dtype=x.dtype, device=x.device, requires_grad=True)
            if key in self.masks:
                raise RuntimeError(f"{key}: attention called twice in one forward pass")
            self.masks[key] = xi
            return ((x.reshape(t, b, mha.num_heads, mha.head_dim) * xi[None, :, :, None]).reshape(t, b, e),)
        return pre_hook

    def __enter__(self):
        for key, mha in self.modules.items():
            enable_head_scaling(mha)  # the slow attention path, the only one that calls out_proj
            self.handles.append(mha.out_proj.register_forward_pre_hook(self._hook(key, mha)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []


@contextmanager
def _frozen_parameters(model):
    """Parameters need no gradient (only the masks do); restored afterwards."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


def mask_gradients(model, sample, loss_fn: LossFn = sentence_nll, per_sentence: bool = True
                   ) -> Tuple[Dict[HeadKey, Tensor], Tensor]:
    """dL/dxi at xi = 1 for one batch. Returns ({key: grad}, per-sentence losses).

    ``per_sentence``: grad [batch x heads], row b = dL(x_b)/dxi (exact); else [heads], the gradient
    of the batch's summed loss with one xi per batch (set with ``set_head_masks``).
    Head masks set on the model are cleared first (xi = 1); head gates, if any, stay as they are.
    """
    layout = head_layout(model)
    set_head_masks(model, None)
    with torch.enable_grad(), _frozen_parameters(model):
        if per_sentence:
            with _SentenceMasks(model) as sm:
                losses = loss_fn(model, sample)
                losses.sum().backward()
            grads = {k: sm.masks[k].grad.detach().clone() if sm.masks[k].grad is not None
                     else torch.zeros_like(sm.masks[k]) for k in sm.masks}
        else:
            param = next(model.parameters())
            dtype = torch.float64 if param.dtype == torch.float64 else torch.float32
            masks = {k: torch.ones(n, dtype=dtype, device=param.device, requires_grad=True)
                     for k, n in layout.items() if n > 0}
            set_head_masks(model, masks)
            try:
                losses = loss_fn(model, sample)
                losses.sum().backward()
            finally:
                set_head_masks(model, None)
            grads = {k: m.grad.detach().clone() if m.grad is not None else torch.zeros_like(m) for k, m in masks.items()}
    return grads, losses.detach()


def normalise_by_layer(importance: Dict[HeadKey, Tensor], eps: float = 1e-20) -> Dict[HeadKey, Tensor]:
    """Divide each layer's importance vector by its l2 norm (Michel et al. 2019, Sec. 4.1); all-zero layers stay 0."""
    return {k: v / (v.norm(p=2) + eps) if v.numel() else v.clone() for k, v in importance.items()}


def head_importance(model, batches: Iterable[dict], loss_fn: LossFn = sentence_nll, per_sentence: bool = True,
                    normalise: bool = True, progress: Optional[Callable[[Iterable], Iterable]] = None
                    ) -> Tuple[Dict[HeadKey, Tensor], dict]:
    """I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019, Eq. 2) over the sentences of ``batches`` (fairseq samples).

    Returns ({(type, layer): importance per current head} (l2-normalised per layer when
    ``normalise``), info) where info holds ``raw`` (unnormalised), ``sentences``, ``batches``,
    ``loss`` (mean L(x)) and the averaging mode. See the module docstring for what is averaged.
    The model is put in eval mode; no parameter gets a gradient.
    """
    layout = head_layout(model)
    was_training = model.training
    model.eval()
    set_head_masks(model, None)
    total = {k: torch.zeros(n, dtype=torch.float64) for k, n in layout.items()}
    n_sent = n_batches = 0
    loss_sum = 0.0
    try:
        for sample in (progress(batches) if progress is not None else batches):
            if sample is None or "net_input" not in sample:
                continue
            grads, losses = mask_gradients(model, sample, loss_fn, per_sentence)
            for k, g in grads.items():
                g = g.double().cpu().abs()
                total[k] += g.sum(0) if per_sentence else g
            n_sent += int(losses.numel())
            n_batches += 1
            loss_sum += float(losses.sum())
    finally:
        model.train(was_training)
    if n_sent == 0:
        raise ValueError("no sentences to estimate head importance on")
    raw = {k: (v / n_sent).float() for k, v in total.items()}
    info = {"raw": raw, "sentences": n_sent, "batches": n_batches, "loss": loss_sum / n_sent,
            "averaging": "per_sentence" if per_sentence else "per_batch", "normalized_by_layer": normalise}
    return (normalise_by_layer(raw) if normalise else raw), info


# ----------------------------------------------------------------------------------------------
# pruning order and levels (Michel et al. 2019, Sec. 4.2, 5, 6)


def pruning_order(importance: Dict[HeadKey, Tensor], types: Optional[Sequence[str]] = None) -> List[Tuple[HeadKey, int]]:
    """(key, head) of the heads of ``types`` (default all) by increasing importance.

    Ties keep model order (enc, dec, encdec; layer; head), so the order is deterministic.
    """
    types = ATTENTION_TYPES if types is None else tuple(types)
    heads = [(k, h, float(v[h])) for k, v in importance.items() if k[0] in types for h in range(v.numel())]
    return [(k, h) for k, h, _ in sorted(heads, key=lambda x: x[2])]  # sorted() is stable


def prune_levels(step: float = 0.1) -> List[float]:
    """Pruning fractions 0, step, 2 step, ..., 1 (1 appended if step does not divide it)."""
    if not 0 < step <= 1:
        raise ValueError(f"pruning step must be in (0, 1], got {step}")
    n = int(math.floor(1.0 / step + 1e-9))
    levels = [round(i * step, 10) for i in range(n + 1)]
    if levels[-1] < 1.0 - 1e-9:
        levels.append(1.0)
    return levels


def heads_to_prune(fraction: float, total: int) -> int:
    """round(fraction x total), halves rounded up (10% of 24 heads: 2; 30%: 7)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"prune fraction must be in [0, 1], got {fraction}")
    return int(math.floor(fraction * total + 0.5 + 1e-9))


def prunable_heads(layout: Dict[HeadKey, int], types: Optional[Sequence[str]] = None, min_heads_per_layer: int = 0) -> int:
    """How many heads of ``types`` can go while every layer keeps ``min_heads_per_layer`` of them."""
    types = ATTENTION_TYPES if types is None else tuple(types)
    return sum(max(0, n - min_heads_per_layer) for k, n in layout.items() if k[0] in types)


def select_pruned(importance: Dict[HeadKey, Tensor], n_prune: int, types: Optional[Sequence[str]] = None,
                  min_heads_per_layer: int = 0) -> Tuple[List[Tuple[HeadKey, int]], List[Tuple[HeadKey, int]]]:
    """The ``n_prune`` least important heads of ``types``, skipping a head whose removal would leave its
    layer with fewer than ``min_heads_per_layer`` heads. Returns (pruned, skipped); raises ValueError if
    fewer than ``n_prune`` heads can be pruned."""
    left = {k: v.numel() for k, v in importance.items()}
    pruned, skipped = [], []
    for key, h in pruning_order(importance, types):
        if len(pruned) == n_prune:
            break
        if left[key] - 1 < min_heads_per_layer:
            skipped.append((key, h))
            continue
        pruned.append((key, h))
        left[key] -= 1
    if len(pruned) < n_prune:
        raise ValueError(f"cannot prune {n_prune} heads of {'/'.join(types or ATTENTION_TYPES)}: only {len(pruned)} "
                         f"can go while every layer keeps at least {min_heads_per_layer} head(s)")
    return pruned, skipped


def masks_without(layout: Dict[HeadKey, int], heads: Iterable[Tuple[HeadKey, int]]) -> Dict[HeadKey, Tensor]:
    """All-ones masks with xi = 0 on ``heads``."""
    masks = full_masks(layout)
    for key, h in heads:
        masks[key][h] = 0.0
    return masks


def pruning_schedule(importance: Dict[HeadKey, Tensor], step: float = 0.1, types: Optional[Sequence[str]] = None,
                     min_heads_per_layer: int = 0) -> List[dict]:
    """One entry per pruning level: fraction, target count, the pruned heads (a prefix of the
    importance order, minus skipped heads) and their masks; levels that cannot be reached under
    ``min_heads_per_layer`` get ``reachable=False`` and no masks."""
    layout = OrderedDict((k, v.numel()) for k, v in importance.items())
    types = ATTENTION_TYPES if types is None else tuple(types)
    total = sum(n for k, n in layout.items() if k[0] in types)
    can = prunable_heads(layout, types, min_heads_per_layer)
    out = []
    for level in prune_levels(step):
        n = heads_to_prune(level, total)
        entry = {"fraction": level, "n_target": n, "n_total": total, "reachable": n <= can}
        if n <= can:
            pruned, skipped = select_pruned(importance, n, types, min_heads_per_layer)
            entry.update(pruned=pruned, skipped=skipped, masks=masks_without(layout, pruned))
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------------
# BLEU of a masked model


def mask_signature(masks: Optional[Dict[HeadKey, Tensor]]) -> tuple:
    """A hashable identity of a set of masks (None and all-ones differ only in the attention path)."""
    if masks is None:
        return ("none",)
    return tuple((k, tuple(float(x) for x in v.detach().cpu().tolist())) for k, v in sorted(masks.items()))


class BleuEvaluator:
    """Corpus BLEU of ``model`` under head masks on fixed sentences of one split (results cached).

    Args:
        model, task: a loaded fairseq model and its translation task (the split loaded).
        subset: the split's name; ``sentence_ids``: its sentences to translate (hypotheses keep this order).
        gen_args: namespace for ``task.build_generator`` (beam, lenpen, max_len_a, max_len_b, ...).
        bpe_symbol: ``--remove-bpe`` symbol for ``Dictionary.string`` (None: keep subwords).
        tokenize: sacrebleu tokenizer ("none": BLEU of the tokenised text, as in the paper).
    """

    def __init__(self, model, task, subset: str, sentence_ids: Sequence[int], gen_args, batch_size: int = 32,
                 bpe_symbol: Optional[str] = None, tokenize: str = "none", progress=None):
        self.model, self.task, self.subset = model, task, subset
        self.dataset = task.dataset(subset)
        self.ids = list(sentence_ids)
        if not self.ids:
            raise ValueError(f"no sentences of '{subset}' to evaluate")
        self.tgt_dict = task.target_dictionary
        self.bpe_symbol = bpe_symbol
        self.tokenize = tokenize
        self.bleu = bleu_metric(tokenize)  # its signature names the scores
        self.generator = task.build_generator([model], gen_args)
        self.progress = progress
        order = sorted(self.ids, key=lambda i: -int(self.dataset.src_sizes[i]))
        self.batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
        self.refs = [self.tgt_dict.string(self.dataset.tgt[i], bpe_symbol, escape_unk=True) for i in self.ids]
        self.cache: Dict[tuple, dict] = {}
        self.generations = 0

    def hypotheses(self, masks: Optional[Dict[HeadKey, Tensor]]) -> List[str]:
        device = next(self.model.parameters()).device
        set_head_masks(self.model, None if masks is None else {k: v.to(device) for k, v in masks.items()})
        self.model.eval()
        by_id = {}
        try:
            batches = self.progress(self.batches) if self.progress is not None else self.batches
            with torch.no_grad():
                for ids in batches:
                    sample = self.dataset.collater([self.dataset[i] for i in ids])
                    if device.type == "cuda":
                        from fairseq import utils
                        sample = utils.move_to_cuda(sample)
                    hypos = self.task.inference_step(self.generator, [self.model], sample)
                    for row, sid in enumerate(sample["id"].tolist()):
                        tokens = hypos[row][0]["tokens"].int().cpu()
                        by_id[sid] = self.tgt_dict.string(tokens, self.bpe_symbol)
        finally:
            set_head_masks(self.model, None)
        self.generations += 1
        return [by_id[i] for i in self.ids]

    def score(self, hyps: Sequence[str]) -> float:
        return bleu(hyps, self.refs, metric=self.bleu)

    def evaluate(self, masks: Optional[Dict[HeadKey, Tensor]]) -> dict:
        """{"bleu": corpus BLEU, "hyps": hypotheses in ``sentence_ids`` order} (cached per mask)."""
        sig = mask_signature(masks)
        if sig not in self.cache:
            hyps = self.hypotheses(masks)
            self.cache[sig] = {"bleu": self.score(hyps), "hyps": hyps}
        return self.cache[sig]


# ----------------------------------------------------------------------------------------------
# experiments


def ablate_heads(evaluator: BleuEvaluator, layout: Dict[HeadKey, int], types: Sequence[str] = ATTENTION_TYPES,
                 n_bootstrap: int = 1000, alpha: float = 0.01, progress=None) -> Tuple[dict, List[dict]]:
    """Michel et al. (2019) Sec. 3.2: each head masked alone (xi_h = 0, all others 1).

    Returns (base result, rows with type, layer, head, bleu, delta, p_value, significant);
    ``n_bootstrap=0`` skips the significance test (p_value None)."""
    base = evaluator.evaluate(full_masks(layout))
    rows, hyps = [], []
    jobs = [(key, h) for key, n in layout.items() if key[0] in types for h in range(n)]
    for key, h in (progress(jobs) if progress is not None else jobs):
        res = evaluator.evaluate(masks_without(layout, [(key, h)]))
        rows.append({"type": key[0], "layer": key[1], "head": h, "bleu": res["bleu"],
                     "delta": res["bleu"] - base["bleu"]})
        hyps.append(res["hyps"])
    if n_bootstrap > 0:
        tests = paired_bootstraps(base["hyps"], hyps, evaluator.refs, evaluator.tokenize, n_bootstrap)
        pvals = [t["p_value"] for t in tests]
    else:  # no significance test wanted
        pvals = [None] * len(rows)
    for row, p in zip(rows, pvals):
        row["p_value"] = p
        row["significant"] = None if p is None else bool(p < alpha)
    return base, rows


def keep_one_per_layer(evaluator: BleuEvaluator, layout: Dict[HeadKey, int], types: Sequence[str] = ATTENTION_TYPES,
                       importance: Optional[Dict[HeadKey, Tensor]] = None, select: str = "bleu",
                       n_bootstrap: int = 1000, alpha: float = 0.01, progress=None) -> Tuple[dict, List[dict]]:
    """Michel et al. (2019) Sec. 3.3 / Table 2: each layer reduced to one head, all other layers intact.

    ``select="bleu"`` (the paper's "best head"): every head of the layer is tried as the only one kept
    and the best BLEU is reported (ties: the lower head index); ``select="importance"``: the layer's
    most important head only. Returns (base result, one row per layer)."""
    if select not in ("bleu", "importance"):
        raise ValueError(f"select must be 'bleu' or 'importance', got {select!r}")
    if select == "importance" and importance is None:
        raise ValueError("select='importance' needs the importance scores")
    base = evaluator.evaluate(full_masks(layout))
    rows, hyps = [], []
    jobs = [(key, n) for key, n in layout.items() if key[0] in types and n > 0]
    for key, n in (progress(jobs) if progress is not None else jobs):
        if select == "bleu":
            candidates = list(range(n))
        else:
            candidates = [int(torch.argmax(importance[key]))]
        scores = []
        for h in candidates:
            res = evaluator.evaluate(masks_without(layout, [(key, j) for j in range(n) if j != h]))
            scores.append((res["bleu"], -h, h, res))
        best_bleu, _, best_h, best = max(scores, key=lambda s: (s[0], s[1]))
        rows.append({"type": key[0], "layer": key[1], "kept_head": best_h, "bleu": best_bleu,
                     "delta": best_bleu - base["bleu"], "heads": n,
                     "bleu_per_kept_head": {str(h): s for s, _, h, _ in scores}})
        hyps.append(best["hyps"])
    tests = paired_bootstraps(base["hyps"], hyps, evaluator.refs, evaluator.tokenize, n_bootstrap)
    pvals = [t["p_value"] for t in tests]
    for row, p in zip(rows, pvals):
        row["p_value"] = p
        row["significant"] = bool(p < alpha)
    return base, rows


def prune_curve(evaluator: BleuEvaluator, importance: Dict[HeadKey, Tensor], types: Optional[Sequence[str]] = None,
                step: float = 0.1, min_heads_per_layer: int = 0, progress=None) -> List[dict]:
    """Michel et al. (2019) Sec. 4.2 / 5: BLEU while pruning ``step`` of the heads of ``types`` at a time, in order
    of increasing importance (computed once, on the full model). One row per level; unreachable
    levels (``min_heads_per_layer``) have ``bleu`` None."""
    rows = []
    schedule = pruning_schedule(importance, step, types, min_heads_per_layer)
    for entry in (progress(schedule) if progress is not None else schedule):
        row = {k: entry[k] for k in ("fraction", "n_target", "n_total", "reachable")}
        if entry["reachable"]:
            res = evaluator.evaluate(entry["masks"])
            row.update(n_pruned=len(entry["pruned"]), bleu=res["bleu"],
                       pruned=[[k[0], k[1], h] for k, h in entry["pruned"]],
                       skipped=[[k[0], k[1], h] for k, h in entry["skipped"]])
        else:
            row.update(n_pruned=None, bleu=None, pruned=None, skipped=None)
        rows.append(row)
    return rows


def ablation_order_scores(layout: Dict[HeadKey, int], ablation_rows: Sequence[dict]) -> Dict[HeadKey, Tensor]:
    """Scores for pruning by "individual oracle performance difference" (Michel et al. 2019, Fig. 3, dashed):
    -delta BLEU of masking the head alone, so heads whose removal costs least (or helps) go first."""
    scores = {k: torch.zeros(n) for k, n in layout.items()}
    for row in ablation_rows:
        scores[(row["type"], row["layer"])][row["head"]] = -float(row["delta"])
    return scores


def types_of(modes: Sequence[str]) -> Tuple[str, ...]:
    """Attention types of a pruning mode ("all", "enc", "dec", "encdec") or of a list of modes."""
    modes = [modes] if isinstance(modes, str) else list(modes)
    return ATTENTION_TYPES if "all" in modes else tuple(modes)


def pruning_mask(importance: Dict[HeadKey, Tensor], layout: Dict[HeadKey, int], fraction: float,
                 types: Sequence[str] = ATTENTION_TYPES, min_heads_per_layer: int = 0) -> dict:
    """The head mask of ``fraction`` of the heads of ``types``, least important first (Michel et al. 2019,
    Sec. 4.2): {"matrix": head mask JSON object, "pruned", "skipped": [(key, head)], "n_total"}."""
    total = sum(n for k, n in layout.items() if k[0] in types)
    pruned, skipped = select_pruned(importance, heads_to_prune(fraction, total), types, min_heads_per_layer)
    return {"matrix": masks_to_matrix(masks_without(layout, pruned), layout), "pruned": pruned,
            "skipped": skipped, "n_total": total}


def mask_shortfall(layout: Dict[HeadKey, int], fraction: float, types: Sequence[str] = ATTENTION_TYPES,
                   min_heads_per_layer: int = 0) -> Optional[Tuple[int, int, int]]:
    """None if ``fraction`` of the heads of ``types`` can be masked while every layer keeps
    ``min_heads_per_layer`` heads, else (heads asked for, heads of ``types``, heads that can go)."""
    total = sum(n for k, n in layout.items() if k[0] in types)
    n, can = heads_to_prune(fraction, total), prunable_heads(layout, types, min_heads_per_layer)
    return (n, total, can) if n > can else None


def pruning_curves(evaluator: BleuEvaluator, importance: Dict[HeadKey, Tensor], layout: Dict[HeadKey, int],
                   modes: Sequence[str], orders: Sequence[str] = ("importance",), step: float = 0.1,
                   min_heads_per_layer: int = 0, progress=None) -> Tuple[float, List[dict]]:
    """Michel et al. (2019) Sec. 4.2, 5, 6: the :func:`prune_curve` of every mode ("all" or one type) and
    order ("importance": I_h; "ablation": the BLEU delta of masking each head alone, Fig. 3 dashed) of one
    model. ``progress``: None or label -> iterable wrapper. Returns (unpruned BLEU, [{"mode", "order",
    "rows"}]); each row also gets ``relative``, its BLEU over the unpruned BLEU (None if unreachable)."""
    def wrap(label):
        return None if progress is None else progress(label)

    base = evaluator.evaluate(full_masks(layout))["bleu"]
    scores = {"importance": importance}
    if "ablation" in orders:
        _, abl = ablate_heads(evaluator, layout, types_of(modes), n_bootstrap=0, progress=wrap("ablate"))
        scores["ablation"] = ablation_order_scores(layout, abl)
    curves = []
    for mode in modes:
        for order in orders:
            rows = prune_curve(evaluator, scores[order], types_of(mode), step, min_heads_per_layer,
                               progress=wrap(f"prune-curve {mode}/{order}"))
            for r in rows:
                r["relative"] = None if r["bleu"] is None else (r["bleu"] / base if base > 0 else float("nan"))
            curves.append({"mode": mode, "order": order, "rows": rows})
    return base, curves


def curve_table(curves: Sequence[dict]) -> List[dict]:
    """One row per curve and pruning level: checkpoint (the curve's label), mode, order and the level's
    values."""
    return [{"checkpoint": c["label"], "mode": c["mode"], "order": c["order"], **r} for c in curves for r in c["rows"]]


# ----------------------------------------------------------------------------------------------
# tables and [layers x heads] matrices of the results


def importance_rows(importance: Dict[HeadKey, Tensor], raw: Dict[HeadKey, Tensor],
                    ids: Dict[HeadKey, List[int]]) -> List[dict]:
    """One row per head: type, layer, head (current position), head_id (original index), importance,
    importance_raw and prune_rank (its place in :func:`pruning_order`)."""
    order = {kh: r for r, kh in enumerate(pruning_order(importance))}
    return [{"type": key[0], "layer": key[1], "head": h, "head_id": ids[key][h], "importance": float(v[h]),
             "importance_raw": float(raw[key][h]), "prune_rank": order[(key, h)]}
            for key, v in importance.items() for h in range(v.numel())]


def importance_record(importance: Dict[HeadKey, Tensor], info: dict, ids: Dict[HeadKey, List[int]]) -> dict:
    """The importance scores of :func:`head_importance` as plain lists per type (rows = layers)."""
    def by_type(d):
        return {t: [d[k] if isinstance(d[k], list) else d[k].tolist() for k in d if k[0] == t]
                for t in ATTENTION_TYPES if any(k[0] == t for k in d)}

    return {"sentences": info["sentences"], "batches": info["batches"], "mean_sentence_loss": info["loss"],
            "averaging": info["averaging"], "normalized_by_layer": info["normalized_by_layer"],
            "importance": by_type(importance), "importance_raw": by_type({k: info["raw"][k] for k in importance}),
            "head_ids": by_type(ids), "heads": importance_rows(importance, info["raw"], ids)}


def head_matrix(values: Dict[Tuple[HeadKey, int], object], ids: Dict[HeadKey, List[int]], t: str,
                fill=np.nan) -> np.ndarray:
    """[layers x original heads] array of attention type ``t`` from {(key, current head): value}; ``fill``
    where a head is absent (physically pruned) or has no value."""
    keys = [k for k in ids if k[0] == t]
    n_cols = max([max(ids[k]) + 1 for k in keys if ids[k]] + [1])
    m = np.full((len(keys), n_cols), fill, dtype=float if isinstance(fill, float) else object)
    for i, k in enumerate(keys):
        for pos, hid in enumerate(ids[k]):
            v = values.get((k, pos))
            if v is not None:
                m[i, hid] = v
    return m


def _delta_text(row: dict) -> str:
    return f"{row['delta']:+.2f}" + ("*" if row["significant"] else "")


def ablation_matrix(rows: Sequence[dict], ids: Dict[HeadKey, List[int]], t: str) -> Tuple[np.ndarray, np.ndarray]:
    """(BLEU deltas, cell texts "+0.12*" with * = significant) of the :func:`ablate_heads` rows of type ``t``
    as [layers x original heads] arrays."""
    sel = [r for r in rows if r["type"] == t]
    vals = head_matrix({((t, r["layer"]), r["head"]): r["delta"] for r in sel}, ids, t)
    text = head_matrix({((t, r["layer"]), r["head"]): _delta_text(r) for r in sel}, ids, t, fill="")
    return vals, text


def keep_one_matrix(rows: Sequence[dict]) -> Tuple[np.ndarray, np.ndarray, List[str]]:
    """(BLEU deltas, cell texts "+0.12* (h3)", types) of the :func:`keep_one_per_layer` rows (with
    ``kept_head_id``) as [layers x attention types] arrays."""
    types = [t for t in ATTENTION_TYPES if any(r["type"] == t for r in rows)]
    n_layers = max(r["layer"] for r in rows) + 1 if rows else 0
    m = np.full((n_layers, len(types)), np.nan)
    text = np.full(m.shape, "", dtype=object)
    for r in rows:
        j = types.index(r["type"])
        m[r["layer"], j] = r["delta"]
        text[r["layer"], j] = f"{_delta_text(r)} (h{r['kept_head_id']})"
    return m, text, types


def symmetric_limit(values: np.ndarray) -> float:
    """max |value| of the finite values (at least 1e-6): the colour range of a diverging heat map."""
    finite = np.isfinite(values)
    return max(float(np.abs(values[finite]).max()) if finite.any() else 0.0, 1e-6)
