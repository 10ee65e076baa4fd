"""Seeded synthetic graphs: a degree-corrected contextual stochastic block model (cSBM).

Why a generator at all: the real datasets stop at ~10^4-10^5 nodes, while the point of the
project is how communication grows with the graph. The generator gives graphs from 10^3 to
10^7+ nodes whose three properties that matter for distributed GNN training are knobs:

* **homophily** - the fraction of edges whose endpoints share a class. High homophily is what
  makes neighbour aggregation useful, so it decides how much accuracy an isolating strategy
  loses by dropping cross-partition edges.
* **degree skew** - a power-law exponent for the expected degrees. Hubs make halos large and
  partitions unbalanced, which is where communication strategies differ most.
* **feature signal** - class mean + Gaussian noise. At the defaults an MLP on features alone
  is far from perfect and a 2-layer GCN clearly better, so the graph carries real information.
  ``feature_noise`` scales the noise; ``signal_fraction`` puts the class means in the first
  share of the columns only, the rest pure noise (a model must find the informative ones).
* **class imbalance** - class sizes follow a Zipf law ``(c + 1)^-class_imbalance``: rare
  classes are the ones a strategy that sees few labels per part loses first.

Two named points of that space (``synthetic.preset``, :data:`PRESETS`): ``easy``, the field
defaults below, where every strategy comes near perfect and none can be told apart, and ``hard``,
the default of ``quietgnn prepare synthetic``, where a GCN lands well short of perfect and the
cross-partition edges carry accuracy an isolating strategy must do without (measured in
``benchmarks/bench_synthetic.py``).

Everything is vectorised over nodes and edges (only loops over the few classes or top-up
rounds), so 10^6 nodes / 10^7 directed edges take seconds, and the same spec always gives the
same tensors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..graph import Graph, random_split

__all__ = ["SyntheticSpec", "PRESETS", "make_synthetic", "edge_homophily", "class_weights"]

#: Norm of the class mean vectors relative to a unit-variance noise dimension, chosen so that an
#: MLP on the default spec (8 classes, noise 1) is far from trivial and far from hopeless
#: (``benchmarks/bench_synthetic.py`` measures where it lands). Independent of
#: ``feature_dim`` because the means are normalised to this length.
_MEAN_NORM = 2.0


@dataclass
class SyntheticSpec:
    """Parameters of :func:`make_synthetic` (config section ``synthetic.*``).

    ``degree_skew`` is the exponent ``gamma`` of the power law ``P(theta) ~ theta^-gamma`` that
    the expected degrees follow (smaller = heavier tail; real graphs: 2.1-3). ``0`` turns the
    skew off: every node has the same expected degree (an Erdos-Renyi-like block model).
    """

    nodes: int = 20000            # number of nodes
    classes: int = 8              # number of classes (= blocks)
    avg_degree: float = 10.0      # expected undirected degree
    homophily: float = 0.8        # fraction of edges within a class
    degree_skew: float = 2.5      # power-law exponent of expected degrees (> 2; 0: no skew)
    feature_dim: int = 64         # feature columns (class mean + Gaussian noise)
    feature_noise: float = 1.0    # std of the feature noise (larger: features say less)
    signal_fraction: float = 1.0  # share of the columns holding the class means
    class_imbalance: float = 0.0  # Zipf exponent of the class sizes (0: balanced)
    seed: int = 0                 # seed of the generator
    #: keys of the section that are no field (listed by --help beside the fields)
    HELP_KEYS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("preset", "null", "a named spec: easy (the defaults) or hard (PRESETS); keys given "
                           "beside it win"),)

    def __post_init__(self) -> None:
        def bad(field: str, allowed: str) -> ValueError:
            return ValueError(f"synthetic.{field} = {getattr(self, field)!r}; expected {allowed}")

        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.classes) or self.classes < 2:
            raise bad("classes", "an int >= 2")
        if not is_int(self.nodes) or self.nodes < 2 * self.classes:
            raise bad("nodes", f"an int >= 2 * classes = {2 * self.classes} (at least two nodes "
                               f"per class)")
        if not is_num(self.avg_degree) or not 0 < self.avg_degree < self.nodes:
            raise bad("avg_degree", f"a number in (0, nodes = {self.nodes})")
        if not is_num(self.homophily) or not 0.0 <= self.homophily <= 1.0:
            raise bad("homophily", "a number in [0, 1] (fraction of same-class edges)")
        if not is_num(self.degree_skew) or not (self.degree_skew == 0 or self.degree_skew > 2):
            raise bad("degree_skew", "a power-law exponent > 2 (e.g. 2.5; smaller = heavier "
                                     "tail), or 0 for no skew (all nodes the same expected degree)")
        if not is_int(self.feature_dim) or self.feature_dim < 1:
            raise bad("feature_dim", "an int >= 1")
        if not is_num(self.feature_noise) or self.feature_noise < 0:
            raise bad("feature_noise", "a number >= 0 (standard deviation of the feature noise)")
        if not is_num(self.signal_fraction) or not 0 < self.signal_fraction <= 1:
            raise bad("signal_fraction", "a number in (0, 1] (share of the feature columns that "
                                         "carry the class means; 1: all of them)")
        if not is_num(self.class_imbalance) or not 0 <= self.class_imbalance <= 4:
            raise bad("class_imbalance", "a number in [0, 4] (Zipf exponent of the class "
                                         "sizes; 0: balanced, 1: class c is 1/(c+1) of class 0)")
        if not is_int(self.seed):
            raise bad("seed", "an int")


#: Named points of the spec space (``synthetic.preset``): a preset gives the values of the keys
#: it names, keys set beside it win. ``easy`` is the field defaults. ``hard`` is the one whose
#: GCN accuracy is far from 1 and whose cross-partition edges matter: low homophily (neighbours
#: help, but only in aggregate), noisy features in a quarter of the columns, mildly imbalanced
#: classes, average degree 20 (the regime of the large graphs the seeds train on).
PRESETS: dict[str, dict[str, object]] = {
    "easy": {},
    "hard": {"avg_degree": 20.0, "homophily": 0.6, "feature_noise": 3.0, "signal_fraction": 0.25,
             "class_imbalance": 0.5},
}


def class_weights(spec: SyntheticSpec) -> list[float]:
    """Probability of each class: ``(c + 1)^-class_imbalance``, normalised."""
    w = [(c + 1) ** -float(spec.class_imbalance) for c in range(spec.classes)]
    return [v / sum(w) for v in w]


def class_means(raw: Tensor, spec: SyntheticSpec) -> Tensor:
    """The class means from ``raw`` standard normals ``[classes, feature_dim]``: zero outside
    the first ``signal_fraction`` of the columns (at least one), each of norm ``_MEAN_NORM``
    (so the knob moves where the signal is, not how strong it is)."""
    k = max(1, round(spec.signal_fraction * spec.feature_dim))
    if k < spec.feature_dim:
        raw = raw.clone()
        raw[:, k:] = 0
    return raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12) * _MEAN_NORM


def _degree_weights(spec: SyntheticSpec, gen: torch.Generator) -> Tensor:
    """float64 [N]: expected-degree weights theta (mean 1).

    Pareto(gamma) by inverse transform, then capped so that no node expects more than
    ``sqrt(N * avg_degree)`` edges: the usual structural cut-off of configuration models,
    which keeps hub-hub pairs from being drawn many times over (they would be de-duplicated
    and the graph would come out short of edges) while keeping a clearly heavy tail.
    """
    n = spec.nodes
    if spec.degree_skew == 0:
        return torch.ones(n, dtype=torch.float64)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    theta = (1.0 - u).pow(-1.0 / (spec.degree_skew - 1.0))     # Pareto, theta >= 1
    max_expected = math.sqrt(n * spec.avg_degree)
    for _ in range(5):   # the cap moves the mean a little: a few fixed-point steps settle it
        cap = max_expected / spec.avg_degree * float(theta.mean())
        theta = theta.clamp(max=max(cap, 1.0))
    return theta / theta.mean()


#: Edges processed per chunk after the random draws: bounds the generator's temporaries to
#: ~10 arrays of this length whatever the graph size (the draws themselves are made whole, so
#: the random stream - hence the graph - does not depend on the chunking).
_CHUNK = 1 << 22


def _draw_keys(y: Tensor, theta: Tensor, count: int, homophily: float, spec: SyntheticSpec,
               gen: torch.Generator) -> Tensor:
    """Sorted unique undirected keys ``min * N + max`` (self-loops removed) of ``count`` drawn
    (source, destination) pairs.

    Source ~ theta over all nodes; destination ~ theta among the source's class with
    probability ``homophily``, else ~ theta among all *other* classes. Nodes are laid out
    sorted by class so that every class is one contiguous range of a single cumulative-weight
    array: "same class" is a uniform draw inside the class's range, "other class" a uniform
    draw over the total minus the class's range, shifted past it - one searchsorted each.
    The random numbers are drawn in one piece; everything derived from them is elementwise,
    so it runs chunk by chunk (bounded memory, identical result).
    """
    n = spec.nodes
    order = torch.argsort(y, stable=True)                      # position -> node
    cum = torch.cumsum(theta[order], 0)                        # float64 [N]
    total = float(cum[-1])
    ends = torch.cumsum(torch.bincount(y, minlength=spec.classes), 0)          # [C]
    cum0 = torch.cat([torch.zeros(1, dtype=torch.float64), cum])                # [N + 1]
    lo_w = cum0[torch.cat([torch.zeros(1, dtype=torch.int64), ends[:-1]])]      # [C] before class
    class_w = cum0[ends] - lo_w                                                 # [C] class weight

    def pick(u: Tensor, presorted: bool = False) -> Tensor:
        """Node whose cumulative range holds u (u in [0, total)). Binary searches with sorted
        queries walk ``cum`` in order and stay in cache, which costs less than random queries
        at 10^6 nodes even counting the sort."""
        if presorted:
            pos = torch.searchsorted(cum, u, right=True)
        else:
            u_sorted, perm = torch.sort(u)
            pos = torch.empty_like(perm)
            pos[perm] = torch.searchsorted(cum, u_sorted, right=True)
        return order[pos.clamp_(max=cum.numel() - 1)]

    # Sources: `count` sorted uniforms directly (normalised cumsum of exponential spacings is
    # the order statistic of iid uniforms), so no sort is needed. Pair order does not matter:
    # each destination below is drawn independently given its source.
    spacings = torch.empty(count + 1, dtype=torch.float64).exponential_(generator=gen)
    spacings = torch.cumsum(spacings, 0)
    scale = total / float(spacings[-1])
    same = torch.rand(count, generator=gen) < homophily
    r = torch.rand(count, generator=gen, dtype=torch.float64)
    parts = []
    for lo in range(0, count, _CHUNK):
        hi = min(lo + _CHUNK, count)
        src = pick(spacings[lo:hi] * scale, presorted=True)
        c = y[src]
        rc = r[lo:hi]
        u_same = lo_w[c] + rc * class_w[c]
        u_other = rc * (total - class_w[c])
        u_other = torch.where(u_other >= lo_w[c], u_other + class_w[c], u_other)  # skip own class
        dst = pick(torch.where(same[lo:hi], u_same, u_other))
        del c, rc, u_same, u_other
        keep = src != dst
        a, b = src[keep], dst[keep]
        parts.append(torch.unique(torch.minimum(a, b) * n + torch.maximum(a, b)))
        del src, dst, keep, a, b
    del spacings, same, r
    return torch.unique(torch.cat(parts)) if len(parts) != 1 else parts[0]


def _count_same(y: Tensor, keys: Tensor, n: int) -> int:
    """How many undirected keys join two nodes of the same class (chunked)."""
    return sum(int((y[k // n] == y[k % n]).sum()) for k in torch.split(keys, _CHUNK))


def _undirected_csr(keys: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Canonical destination-indexed CSR holding every undirected key ``a * N + b`` (a < b)
    both ways, built without materialising (or sorting) the 2 x |keys| directed edge list.

    Row ``v``'s sources are its lower neighbours ``a < v`` followed by its upper neighbours
    ``b > v``: both runs ascending, hence the whole row. ``keys`` (sorted by (a, b)) lists the
    upper runs in order; the lower runs come from the keys re-sorted by (b, a)."""
    up = torch.zeros(n, dtype=torch.int64)     # upper neighbours of each node
    low = torch.zeros(n, dtype=torch.int64)    # lower neighbours of each node
    for k in torch.split(keys, _CHUNK):
        up += torch.bincount(k // n, minlength=n)
        low += torch.bincount(k % n, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(up + low, 0, out=indptr[1:])
    indices = torch.empty(int(indptr[-1]), dtype=torch.int64)
    # entry j of a run that starts at list position start[v] lands at base[v] + j
    up_base = indptr[:-1] + low - (torch.cumsum(up, 0) - up)
    for j0, k in zip(range(0, keys.numel(), _CHUNK), torch.split(keys, _CHUNK)):
        a = k // n
        indices[up_base[a] + torch.arange(j0, j0 + k.numel())] = k % n
    del up_base
    low_base = indptr[:-1] - (torch.cumsum(low, 0) - low)
    rev = keys % n * n + keys // n
    rev = torch.sort(rev).values
    for j0, k in zip(range(0, rev.numel(), _CHUNK), torch.split(rev, _CHUNK)):
        b = k // n
        indices[low_base[b] + torch.arange(j0, j0 + k.numel())] = k % n
    return indptr, indices


def make_synthetic(spec: SyntheticSpec | None = None, *, split_seed: int = 0) -> Graph:
    """Generate the graph described by ``spec`` (deterministic in ``spec.seed``).

    Returns an undirected :class:`Graph` with ``N = spec.nodes`` nodes, about
    ``N * avg_degree`` directed edges (each undirected edge stored both ways), float32
    features ``[N, feature_dim]``, labels in ``[0, classes)`` and a seeded random 60/20/20
    split (``split_seed``, kept separate from ``spec.seed`` so one graph can be evaluated on
    several splits). ``meta['synthetic']`` holds the spec, ``meta['homophily']`` the
    measured edge homophily.
    """
    spec = spec or SyntheticSpec()
    n, gen = spec.nodes, torch.Generator().manual_seed(spec.seed)
    if spec.class_imbalance:
        y = torch.multinomial(torch.tensor(class_weights(spec), dtype=torch.float64), n,
                              replacement=True, generator=gen)
    else:   # (the same stream as before the knob existed: balanced graphs did not change)
        y = torch.randint(0, spec.classes, (n,), generator=gen)
    # every class gets at least two nodes (small graphs could otherwise miss a class entirely)
    seeded = torch.randperm(n, generator=gen)[:2 * spec.classes]
    y[seeded] = torch.arange(2 * spec.classes) % spec.classes
    theta = _degree_weights(spec, gen)

    # Undirected edges wanted: N * d / 2, a fraction `homophily` of them within a class.
    # Self-loops and repeated pairs are dropped - more often within a class (smaller pools)
    # and among hubs - so draw the target, count what survived of each kind and top up each
    # kind's deficit, scaled by the observed survival rate; two or three rounds land within
    # ~0.5 % of the target without biasing the homophily.
    target = int(round(n * spec.avg_degree / 2))
    target_same = int(round(target * spec.homophily))
    keys = torch.empty(0, dtype=torch.int64)
    drawn, want, h = 0, target, spec.homophily
    for _ in range(4):
        new = _draw_keys(y, theta, want, h, spec, gen)
        drawn += want
        keys = torch.unique(torch.cat([keys, new])) if keys.numel() else new
        del new
        n_same = _count_same(y, keys, n)
        miss_same = max(target_same - n_same, 0)
        miss_other = max(target - target_same - (keys.numel() - n_same), 0)
        if miss_same + miss_other <= 0.005 * target:
            break
        h = miss_same / (miss_same + miss_other)
        # (capped: a dense spec may simply not have enough distinct pairs of the wanted kind)
        want = min(int((miss_same + miss_other) * drawn / max(keys.numel(), 1)) + 1,
                   4 * target + 1024)
    if keys.numel() > target:   # a top-up overshot (by < 1 %): drop a random subset; keys
        # are sorted, so plain truncation would bias the cut towards high node ids
        keep = torch.randperm(keys.numel(), generator=gen)[:target]
        keys = keys[torch.sort(keep).values]
        del keep
        n_same = _count_same(y, keys, n)
    n_keys = keys.numel()
    indptr, indices = _undirected_csr(keys, n)
    del keys

    # Features: class mean (random direction, norm _MEAN_NORM) + isotropic noise.
    means = class_means(torch.randn(spec.classes, spec.feature_dim, generator=gen), spec)
    x = torch.randn(n, spec.feature_dim, generator=gen).mul_(spec.feature_noise)
    for lo in range(0, n, _CHUNK // 8):   # add the class means in place, a slab at a time
        x[lo:lo + _CHUNK // 8].add_(means[y[lo:lo + _CHUNK // 8]])

    train, val, test = random_split(n, seed=split_seed)
    meta = {"source": "synthetic", "synthetic": asdict(spec), "split": "random",
            "split_seed": split_seed, "split_fractions": [0.6, 0.2, 0.2], "undirected": True}
    # Built directly in canonical CSR form (the generic Graph.from_edge_index would
    # materialise, symmetrise and sort a 2 x E edge list: ~5x the memory at 10^7+ edges).
    graph = Graph(indptr=indptr, indices=indices, x=x, y=y, train_mask=train, val_mask=val,
                  test_mask=test, num_classes=spec.classes, name="synthetic",
                  meta=meta).validate()
    # every undirected pair is stored both ways, so this is exactly edge_homophily(graph)
    graph.meta["homophily"] = round(n_same / max(n_keys, 1), 4)
    return graph


def edge_homophily(graph: Graph) -> float:
    """Fraction of stored edges whose two endpoints have the same label (0.0 when no edges)."""
    if graph.num_edges == 0:
        return 0.0
    return float((graph.y[graph.indices] == graph.y[graph.edge_dst()]).double().mean())
