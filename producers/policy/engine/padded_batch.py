"""`PaddedBatch`: the rows of one adapter group decoded together, with one transformers
`DynamicCache` holding every row's keys and values, left-padded to a common length.

Why one padded cache: a decode step is then one forward pass over `[rows, 1]` input ids, with a 2-D
attention mask that hides each row's padding and explicit `position_ids` (each row's own length),
so a row's keys, values and logits are those it would have alone (padded keys get exactly zero
attention weight). The alternative, a cache per sequence stacked into a batch at every step, copies
every cache every step; here a row is copied only when it joins (padding it, or the batch, on the
left to the longer of the two) and when rows leave (`select`). Columns that are padding in every
row are cut off when rows leave, so a long-finished prompt does not keep the batch wide.

Only plain `DynamicLayer` caches are merged (`mergeable`): a sliding-window or quantized layer is
not a list of columns that can be padded, so the scheduler runs such a model one request at a time.

torch / transformers are imported inside the functions; nothing here touches the model.
"""

from __future__ import annotations

from typing import Any


def mergeable(cache: Any) -> bool:
    """Whether every layer of `cache` is a plain `DynamicLayer` (keys/values `[rows, heads, T, dim]`)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def _pad_left(cache: Any, columns: int) -> None:
    import torch.nn.functional as F

    if columns:
        for layer in cache.layers:
            layer.keys = F.pad(layer.keys, (0, 0, columns, 0))
            layer.values = F.pad(layer.values, (0, 0, columns, 0))


class PaddedBatch:
    """Rows decoded together: their cache, attention mask, next positions, next input tokens and the
    job each row belongs to (a job's rows are contiguous, in the job's own order)."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.mask: Any = None  # bool [rows, columns]: False where a row is padded
        self.positions: Any = None  # long [rows]: the position of each row's next token
        self.next_tokens: Any = None  # long [rows]: the token each row feeds next
        self.owners: list[Any] = []  # the job of each row

    def __len__(self) -> int:
        return len(self.owners)

    def admit(self, cache: Any, mask: Any, rows: list[int], owners: list[Any], tokens: list[int]) -> None:
        """Add one row per entry of `rows`: the prefill row it continues (of `cache` and its bool
        `mask`, a left-padded prefill of one or more prompts), its job (`owners`) and its first
        sampled token (`tokens`)."""
        import torch

        device = mask.device
        if rows != list(range(mask.shape[0])):  # choices of one prompt share its prefill row
            index = torch.tensor(rows, dtype=torch.long, device=device)
            cache.batch_select_indices(index)
            mask = mask[index]
        positions = mask.sum(dim=1)
        next_tokens = torch.tensor(tokens, dtype=torch.long, device=device)
        if self.cache is None:
            self.cache, self.mask, self.positions, self.next_tokens = cache, mask, positions, next_tokens
        else:
            width, length = self.mask.shape[1], mask.shape[1]
            _pad_left(cache, max(0, width - length))
            _pad_left(self.cache, max(0, length - width))
            self.mask = torch.cat([self._padded(self.mask, length), self._padded(mask, width)])
            for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
                mine.keys = torch.cat([mine.keys, theirs.keys])
                mine.values = torch.cat([mine.values, theirs.values])
            self.positions = torch.cat([self.positions, positions])
            self.next_tokens = torch.cat([self.next_tokens, next_tokens])
        self.owners += owners
        self._trim()

    @staticmethod
    def _padded(mask: Any, width: int) -> Any:
        import torch.nn.functional as F

        return F.pad(mask, (max(0, width - mask.shape[1]), 0), value=False)

    def step_inputs(self) -> dict:
        """The model's keyword arguments for one decode step of every row."""
        import torch

        ones = torch.ones(len(self), 1, dtype=torch.bool, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)  # the column this step's keys go into
        return {
            "input_ids": self.next_tokens[:, None],
            "attention_mask": self.mask,
            "position_ids": self.positions[:, None],
            "past_key_values": self.cache,
        }

    def stepped(self, tokens: list[int], ended: list[bool]) -> None:
        """After a step: every row advanced one position; rows that `ended` leave the batch, the
        others feed `tokens` next."""
        import torch

        self.positions = self.positions + 1
        keep = [row for row, end in enumerate(ended) if not end]
        if len(keep) == len(ended):
            self.next_tokens = torch.tensor(tokens, dtype=torch.long, device=self.mask.device)
            return
        self.owners = [self.owners[row] for row in keep]
        if not keep:
            self.cache = self.mask = self.positions = self.next_tokens = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.next_tokens = torch.tensor([tokens[row] for row in keep], dtype=torch.long, device=index.device)
        self._trim()

    def _trim(self) -> None:
        """Cut the leading columns that are padding in every row."""
        first = int(self.mask.any(dim=0).to(dtype=self.positions.dtype).argmax())
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]

    def drop_all(self) -> list[Any]:
        """Empty the batch; the jobs that had rows in it."""
        jobs = list(dict.fromkeys(self.owners))
        self.owners = []
        self.cache = self.mask = self.positions = self.next_tokens = None
        return jobs
