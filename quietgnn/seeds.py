"""The one seed rule: where every random draw of a run comes from.

Everything random in a run derives from ``train.seed`` (``s``) and, where ranks must draw
differently, the rank (``r``):

* torch's global generator on rank ``r`` is seeded :func:`rank_seed` ``= s * 1000 + r``:
  dropout masks and anything else drawn from the global stream, each rank its own (the
  per-rank offset; ``s * 1000`` keeps seeds ``s`` and ``s + 1`` apart for up to 1000 ranks);
* the model's weights are drawn from ``s`` itself (:func:`quietgnn.nn.model.build_model`), so
  every rank builds the same weights without communication;
* every other generator is seeded :func:`stream_seed` ``(s, purpose, r)``: a hash of the seed,
  a name saying what the stream is for (``"grappa.sampler"``, ``"tma.average/3"``) and the rank,
  so streams of different purposes, ranks or seeds never coincide. A stream every rank must
  draw identically (a shared random projection, a layer's initial weights) passes no rank; one
  that any rank must be able to reproduce for another passes that rank's index (the
  evaluation sample of part ``j``, which rank ``j`` and the book evaluator both draw).

Not run seeds: the split, the synthetic graph and the partitioner have their own
(``dataset.split_seed``, ``synthetic.seed``, ``partition.seed``). Keyed draws
(:mod:`quietgnn.sampling.rng`, :mod:`quietgnn.nn.keyed`) hash the seed with the draw's
coordinates instead of consuming a stream, so they do not depend on the order of draws.
"""

from __future__ import annotations

import hashlib
from typing import Optional

__all__ = ["rank_seed", "stream_seed"]


def rank_seed(seed: int, rank: int) -> int:
    """The seed of torch's global generator on ``rank``."""
    return int(seed) * 1000 + int(rank)


def stream_seed(seed: int, purpose: str, rank: Optional[int] = None) -> int:
    """The seed (63 bits) of the generator ``purpose`` of ``rank``, or shared by every rank
    when ``rank`` is None."""
    key = f"{int(seed)}/{purpose}" + ("" if rank is None else f"/rank{int(rank)}")
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1
