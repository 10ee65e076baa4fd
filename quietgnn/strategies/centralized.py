"""``centralized``: one process, the whole graph, full-batch: the accuracy reference.

It is the ``halo`` computation on a single partition (no halo, nothing crosses a network),
so the two share one code path and the equality test compares like with like.
"""

from __future__ import annotations

from .base import register
from .halo import Halo


@register
class Centralized(Halo):
    name = "centralized"
    residency_traffic = "trains on every site's features and labels in one process"
    description = "one process, whole graph: the accuracy reference (no communication)"
    fixed_parts = 1
