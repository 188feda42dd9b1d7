"""Length-grouped shuffling: batches of similar length waste less compute on padding."""
from __future__ import annotations

import torch
from torch.utils.data import Sampler


class LengthGroupedSampler(Sampler[int]):
    """Shuffle, cut into megabatches of 50 batches, sort each by length, shuffle the batches.

    Keeps the randomness of a shuffle while each batch holds examples of similar length.
    """

    def __init__(self, ds, batch_size: int, generator: torch.Generator, mega: int = 50):
        self.lengths = [len(x) for x in ds.with_format(None)["input_ids"]]
        self.batch_size, self.gen, self.mega = batch_size, generator, mega

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.gen).tolist()
        size = self.batch_size * self.mega
        batches = []
        for i in range(0, len(order), size):
            chunk = sorted(order[i:i + size], key=lambda j: -self.lengths[j])
            batches += [chunk[k:k + self.batch_size] for k in range(0, len(chunk), self.batch_size)]
        for b in torch.randperm(len(batches), generator=self.gen).tolist():
            yield from batches[b]
