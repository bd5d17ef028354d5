"""The task ``translation_source_tags``: fairseq's translation task with part-of-speech tags of the source side
carried as a side input, for the POS pattern of Zhang, Titov & Sennrich 2021 (Sec. 7).

    fairseq-train DATA --user-dir fairseq_sparse --task translation_source_tags --arch transformer_l0drop \\
        --encoder-output-pattern pos ...
    fairseq-generate DATA --user-dir fairseq_sparse --task translation_source_tags --path CKPT ...

Every split read needs ``{split}.tags`` in ``--source-tags-dir`` (default: the data folder): one line per
sentence of the split, whitespace-separated Penn Treebank tags, one per word (subword pieces joined at
``@@``, subword-nmt's marker, which the POS pattern also reads) or one per piece (``fairseq-sparse-pos-tags``
writes them with spaCy). Each
batch gets ``net_input["src_tags"]``: the tag id of every source token (0 at EOS and padding), which the model
never learns from: the training and decoding read the same tags. A file that does not match the split is an
error naming its line when the split is loaded, before training or decoding starts.
"""
import os
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from fairseq.data import BaseWrapperDataset
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..modules.encoder_patterns import BPE_MARKER, UNTAGGED_INPUT
from ..modules.token_tags import NO_TAG, piece_tag_ids, read_tags


@dataclass
class TranslationSourceTagsConfig(TranslationConfig):
    source_tags_dir: Optional[str] = field(
        default=None,
        metadata={"help": "folder of {split}.tags, the part-of-speech tags of each split's source side (one line per "
                          "sentence, one Penn Treebank tag per word or per subword piece); default: the data folder"},
    )


class SourceTagsDataset(BaseWrapperDataset):
    """A LanguagePairDataset whose batches also hold ``net_input["src_tags"]`` (B x S tag ids, padded like the
    source tokens)."""

    def __init__(self, dataset, tags: List[torch.Tensor]):
        super().__init__(dataset)
        if len(tags) != len(dataset):
            raise ValueError(f"{len(tags)} tag rows for {len(dataset)} sentences")
        self.tags = tags

    def __getattr__(self, name):  # src, src_sizes, left_pad_source, ... of the pair dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index):
        item = dict(self.dataset[index])
        item["source_tags"] = self.tags[index]
        return item

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch:
            return batch
        by_id = {int(s["id"]): s["source_tags"] for s in samples}
        src = batch["net_input"]["src_tokens"]
        tags = torch.full_like(src, NO_TAG)
        for row, i in enumerate(batch["id"].tolist()):
            t = by_id[i]
            if self.dataset.left_pad_source:
                tags[row, src.size(1) - t.numel():] = t
            else:
                tags[row, :t.numel()] = t
        batch["net_input"]["src_tags"] = tags
        return batch


@register_task("translation_source_tags", dataclass=TranslationSourceTagsConfig)
class TranslationSourceTagsTask(TranslationTask):
    """fairseq's translation task; its datasets carry the source side's part-of-speech tags (module docstring)."""

    carries_source_tags = True
    _building_model = False

    def build_model(self, cfg, from_checkpoint=False):
        self._building_model = True  # fairseq's --eval-bleu builds a generator here, before any split is loaded
        try:
            return super().build_model(cfg, from_checkpoint)
        finally:
            self._building_model = False

    def build_generator(self, models, args, **kwargs):
        """fairseq-interactive builds the generator right after loading the models and never loads a split: a model
        that reads tags is refused here, when it is loaded, not at the first sentence (raw input carries no tags)."""
        if not self.datasets and not self._building_model and any(
                getattr(getattr(m, "encoder", None), "reads_source_tags", False) for m in models):
            raise ValueError(UNTAGGED_INPUT)
        return super().build_generator(models, args, **kwargs)

    def tags_path(self, split: str) -> str:
        folder = self.cfg.source_tags_dir or self.cfg.data.split(os.pathsep)[0]
        return os.path.join(folder, f"{split}.tags")

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        pairs = self.datasets[split]
        path = self.tags_path(split)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--task translation_source_tags: no tags file {path} for split '{split}' "
                                    "(one line per source sentence; fairseq-sparse-pos-tags writes it)")
        d, marker = self.src_dict, BPE_MARKER
        specials = {d.eos(), d.bos(), d.pad()}
        tokens = [pairs.src[i].tolist() for i in range(len(pairs))]
        sentences = [[d[t] for t in row if t not in specials] for row in tokens]
        per_sentence = read_tags(path, sentences, marker)
        tags = []
        for row, pieces, sentence_tags in zip(tokens, sentences, per_sentence):
            ids = iter(piece_tag_ids(pieces, sentence_tags, marker))
            tags.append(torch.tensor([NO_TAG if t in specials else next(ids) for t in row], dtype=torch.long))
        self.datasets[split] = SourceTagsDataset(pairs, tags)
