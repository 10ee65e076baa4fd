"""Matrix-based bulk sampling (Tripathy, Yelick, Buluc, MLSys 2024) for mini-batch training.

Samplers return indices (:class:`Bulk`); :mod:`.loader` moves data. See ``bulk.py`` for the
layout, ``sage.py`` / ``ladies.py`` for the laws, ``dist.py`` for the distributed forms.
"""

from .bulk import Bulk, MiniBatch, SampledBlock, WeightedAdj
from .sage import NeighborSampler

__all__ = ["Bulk", "MiniBatch", "SampledBlock", "WeightedAdj", "NeighborSampler"]
