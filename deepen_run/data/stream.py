"""A task's training batches as an endless stream whose position is one number, the batches consumed
so far, so a checkpoint (deepen_run/run/checkpoint.py) saves and restores it exactly: epoch e is
shuffled by a generator re-seeded from (seed, e) (epoch 0 keeps the loader's own seed), and a resumed
stream skips the batches of its epoch already consumed with accelerate.skip_first_batches (indices
only, no data loaded)."""
from __future__ import annotations

import numpy as np


def epoch_seed(seed: int, epoch: int) -> int:
    return seed if epoch == 0 else int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


class TaskStream:
    """One task's endless batches; where it stands is one number, the batches consumed so far."""

    def __init__(self, loader, seed: int, consumed: int = 0):
        from accelerate.data_loader import get_sampler  # lazy: run/resume.py and cli/run.py import this module light

        self.loader, self.seed, self.consumed = loader, seed, consumed
        sampler = get_sampler(loader)
        # RandomSampler and transformers' LengthGroupedSampler (data.length_grouped) keep `generator`.
        self.gen = getattr(sampler, "generator", None)

    def __iter__(self):
        from accelerate.data_loader import skip_first_batches

        epoch, skip = divmod(self.consumed, len(self.loader))
        while True:
            if self.gen is not None:
                self.gen.manual_seed(epoch_seed(self.seed, epoch))
            for batch in skip_first_batches(self.loader, skip) if skip else self.loader:
                self.consumed += 1
                yield batch
            epoch, skip = epoch + 1, 0
