"""Bit-width assignment for quantized messages: variance against transfer time (AdaQP).

Wan, Zhao, Wu, MLSys 2023 (arXiv 2306.01381), section 4. One *problem* is one exchange (a
layer's forward or backward halo all-to-all): messages travel over channels ``c = i -> j``;
they were sorted by their variance coefficient and cut into groups, and every group ``g`` gets
one width ``b_g in {2, 4, 8}``:

    V(b) = sum_g sigma_g / (2^b_g - 1)^2                  (quantization variance entering the
                                                           aggregations)
    T(b) = max_c ( alpha_c * MB_c(b) + gamma_c )          (the round lasts as long as its
                                                           slowest channel; linear time model)
    MB_c(b) = sum_{g in c} n_g * (ceil(b_g D / 8) + 4) / 1e6

    minimise  lam * (V - V_8) / (V_2 - V_8)  +  (1 - lam) * (T - T_8) / (T_2 - T_8)

``V_8, T_8`` (``V_2, T_2``) are the values with every group at 8 (2) bits, so both terms lie in
``[0, 1]``. :func:`solve_milp` solves it exactly (PuLP + CBC, as the paper does);
:func:`solve_fast` is what runs at scale: the problem decomposes once the round time ``tau``
is fixed, so it builds each channel's Pareto front of (time, variance), sweeps ``tau`` over
all breakpoints, lets each channel take its lowest-variance point finishing by ``tau``, keeps
the best ``tau``, and polishes with single-group moves (``tests/test_adaqp.py`` checks that it
reaches the MILP objective within 1%).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = ["AssignProblem", "evaluate", "solve_milp", "solve_fast", "solve"]

BITS = (2, 4, 8)
_INV = {b: 1.0 / (2 ** b - 1) ** 2 for b in BITS}


@dataclass
class AssignProblem:
    """``sigma``/``size``/``channel`` per group (``[G]``), ``alpha`` (s per MB) and ``gamma``
    (s) per channel (``[C]``), ``width`` = D of the rows, ``lam`` = weight of variance."""

    sigma: np.ndarray
    size: np.ndarray
    channel: np.ndarray
    alpha: np.ndarray
    gamma: np.ndarray
    width: int
    lam: float = 0.5

    def __post_init__(self) -> None:
        self.sigma = np.asarray(self.sigma, dtype=np.float64)
        self.size = np.asarray(self.size, dtype=np.float64)
        self.channel = np.asarray(self.channel, dtype=np.int64)
        self.alpha = np.asarray(self.alpha, dtype=np.float64)
        self.gamma = np.asarray(self.gamma, dtype=np.float64)
        G = self.sigma.shape[0]
        if self.size.shape != (G,) or self.channel.shape != (G,):
            raise ValueError(f"AssignProblem: sigma, size, channel must all have {G} entries")
        if G and (self.channel.min() < 0 or self.channel.max() >= self.alpha.shape[0]):
            raise ValueError(f"AssignProblem: channel ids must be in [0, {self.alpha.shape[0]})")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam = {self.lam!r}; expected a weight in [0, 1]")

    def mb(self, b: int) -> np.ndarray:
        """MB of every group at width ``b``."""
        return self.size * ((b * self.width + 7) // 8 + 4) / 1e6

    def bounds(self) -> tuple[float, float, float, float]:
        """``(V_8, V_2, T_8, T_2)`` (normalisation constants)."""
        v8, v2 = float(self.sigma.sum() * _INV[8]), float(self.sigma.sum() * _INV[2])
        n = len(self.sigma)
        return v8, v2, self._time(np.full(n, 8)), self._time(np.full(n, 2))

    def _time(self, bits: np.ndarray) -> float:
        if len(self.sigma) == 0:
            return 0.0
        mb = np.zeros(len(self.sigma))
        for b in BITS:
            sel = bits == b
            mb[sel] = self.mb(b)[sel]
        load = np.bincount(self.channel, weights=mb, minlength=len(self.alpha))
        used = np.bincount(self.channel, minlength=len(self.alpha)) > 0
        return float((self.alpha * load + self.gamma)[used].max())


def evaluate(p: AssignProblem, bits: np.ndarray) -> tuple[float, float, float]:
    """``(objective, V, T)`` of an assignment."""
    bits = np.asarray(bits)
    inv = np.select([bits == 2, bits == 4, bits == 8], [_INV[2], _INV[4], _INV[8]], np.nan)
    if np.isnan(inv).any():
        raise ValueError(f"assignment has widths {sorted(set(bits.tolist()))}; expected {BITS}")
    v, t = float((p.sigma * inv).sum()), p._time(bits)
    return _objective(p, v, t), v, t


def _objective(p: AssignProblem, v: float, t: float) -> float:
    v8, v2, t8, t2 = p.bounds()
    nv = (v - v8) / (v2 - v8) if v2 - v8 > 0 else 0.0   # 0 at all-8, 1 at all-2
    nt = (t - t2) / (t8 - t2) if t8 - t2 > 0 else 0.0   # 0 at all-2, 1 at all-8
    return p.lam * nv + (1.0 - p.lam) * nt


def _cbc_path() -> str:
    """A ``cbc`` on PATH, else the one PuLP 3 bundles (PuLP 4 ships none: ``pip install
    'pulp[cbc]'`` or a system ``cbc`` then)."""
    import shutil

    from pulp.apis import coin_api
    found = shutil.which("cbc") or getattr(coin_api, "pulp_cbc_path", None)
    if not found or not Path(found).is_file():
        raise RuntimeError("options.solver milp needs the CBC solver: install a `cbc` binary on "
                           "PATH (or pip install 'pulp[cbc]'), or use options.solver fast")
    return str(found)


def solve_milp(p: AssignProblem, time_limit: float = 30.0) -> np.ndarray:
    """Exact solution with PuLP/CBC (binary ``x[g, b]``, continuous round time ``T``)."""
    import pulp

    G = len(p.sigma)
    if G == 0:
        return np.zeros(0, dtype=np.int64)
    v8, v2, t8, t2 = p.bounds()
    wv = p.lam / (v2 - v8) if v2 - v8 > 0 else 0.0
    wt = (1 - p.lam) / (t8 - t2) if t8 - t2 > 0 else 0.0
    prob = pulp.LpProblem("adaqp_bits", pulp.LpMinimize)
    # Variables are made by the problem and CBC is run through COIN_CMD: PuLP's current API
    # (LpVariable(...) and PULP_CBC_CMD warn on every call and go away in PuLP 4.0).
    x = {(g, b): prob.add_variable(f"x_{g}_{b}", cat="Binary") for g in range(G) for b in BITS}
    T = prob.add_variable("T", lowBound=0)
    prob += wv * pulp.lpSum(float(p.sigma[g]) * _INV[b] * x[g, b] for g in range(G)
                            for b in BITS) + wt * T
    for g in range(G):
        prob += pulp.lpSum(x[g, b] for b in BITS) == 1
    mbs = {b: p.mb(b) for b in BITS}
    for c in np.unique(p.channel):
        gs = np.nonzero(p.channel == c)[0]
        prob += T >= float(p.gamma[c]) + float(p.alpha[c]) * pulp.lpSum(
            float(mbs[b][g]) * x[g, b] for g in gs for b in BITS)
    status = prob.solve(pulp.COIN_CMD(path=_cbc_path(), msg=False, timeLimit=time_limit))
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"MILP bit assignment: CBC returned {pulp.LpStatus[status]}")
    return np.array([max(BITS, key=lambda b: x[g, b].value() or 0) for g in range(G)])


def _channel_front(p: AssignProblem, gs: np.ndarray, c: int,
                   enum_max: int) -> tuple[np.ndarray, np.ndarray, Callable[[int], np.ndarray]]:
    """Pareto front (time ascending, variance strictly descending) of one channel's groups
    ``gs``: ``(times [N], variances [N], widths(k) -> bits of point k)``.

    Up to ``enum_max`` combinations: every combination (exact). Beyond: the configurations
    "the k8 highest-sigma groups at 8 bits, the next k4 at 4, the rest at 2" for all
    (k8, k4) -- exact when the groups have equal sizes (AdaQP's groups: all ``group_size``
    rows but the last), since then every group costs the same and more bits belong to more
    variance."""
    K = len(gs)
    bits_arr = np.array(BITS)
    mb = np.stack([p.mb(b)[gs] for b in BITS], 1)               # [K, 3]
    inv = np.array([_INV[b] for b in BITS])
    sig = p.sigma[gs]
    if 3 ** K <= enum_max:
        choice = np.stack(np.meshgrid(*[np.arange(3)] * K, indexing="ij"), -1).reshape(-1, K)
        load = np.take_along_axis(np.broadcast_to(mb, (len(choice), K, 3)),
                                  choice[..., None], 2)[..., 0].sum(1)
        v = (sig[None, :] * inv[choice]).sum(1)

        def widths(idx: np.ndarray) -> np.ndarray:
            return bits_arr[choice[idx]]
    else:
        order = np.argsort(-sig, kind="stable")
        # prefix sums over the sigma-descending order: k8 groups at 8, k4 at 4, rest at 2
        cm = np.vstack([np.zeros(3), np.cumsum(mb[order], 0)])      # [K+1, 3]
        cs = np.concatenate([[0.0], np.cumsum(sig[order])])
        k8, k4 = np.meshgrid(np.arange(K + 1), np.arange(K + 1), indexing="ij")
        ok = k8 + k4 <= K
        k8, k4 = k8[ok], k4[ok]
        e4 = k8 + k4
        load = cm[k8, 2] + (cm[e4, 1] - cm[k8, 1]) + (cm[K, 0] - cm[e4, 0])
        v = cs[k8] * inv[2] + (cs[e4] - cs[k8]) * inv[1] + (cs[K] - cs[e4]) * inv[0]

        def widths(idx: np.ndarray) -> np.ndarray:
            rank = np.empty(K, dtype=np.int64)
            rank[order] = np.arange(K)
            return np.where(rank < k8[idx], 8, np.where(rank < e4[idx], 4, 2))
    t = p.gamma[c] + p.alpha[c] * load
    o = np.lexsort((v, t))
    t, v = t[o], v[o]
    keep = np.concatenate([[True], v[1:] < np.minimum.accumulate(v)[:-1]])
    idx = o[keep]
    return t[keep], v[keep], (lambda k: widths(idx[k]))


def solve_fast(p: AssignProblem, polish_passes: int = 4, enum_max: int = 3 ** 8) -> np.ndarray:
    """Per-channel Pareto fronts, then a sweep over the round time ``tau`` (every front
    breakpoint): each channel takes its lowest-variance point that finishes by ``tau``; the
    best ``tau`` wins; single-group moves polish the result."""
    G = len(p.sigma)
    if G == 0:
        return np.zeros(0, dtype=np.int64)
    fronts = []
    for c in np.unique(p.channel):
        gs = np.nonzero(p.channel == c)[0]
        fronts.append((gs,) + _channel_front(p, gs, int(c), enum_max))
    taus = np.unique(np.concatenate([f[1] for f in fronts]))
    v8, v2, t8, t2 = p.bounds()
    V = np.zeros(len(taus))
    T = np.full(len(taus), -np.inf)
    for _, ct, cv, _ in fronts:
        k = np.clip(np.searchsorted(ct, taus, side="right") - 1, 0, len(ct) - 1)
        V += cv[k]
        T = np.maximum(T, ct[k])
    nv = (V - v8) / (v2 - v8) if v2 - v8 > 0 else 0 * V
    nt = (T - t2) / (t8 - t2) if t8 - t2 > 0 else 0 * T
    best = taus[int(np.argmin(p.lam * nv + (1 - p.lam) * nt))]
    bits = np.full(G, 2, dtype=np.int64)
    for gs, ct, _, widths in fronts:
        k = max(int(np.searchsorted(ct, best, side="right") - 1), 0)
        bits[gs] = widths(k)
    return _polish(p, bits, polish_passes)


def _polish(p: AssignProblem, bits: np.ndarray, passes: int) -> np.ndarray:
    """Single-group moves (any width) while they lower the objective (incremental loads)."""
    mb = {b: p.mb(b) for b in BITS}
    C = len(p.alpha)
    used = np.bincount(p.channel, minlength=C) > 0
    v8, v2, t8, t2 = p.bounds()
    wv = p.lam / (v2 - v8) if v2 - v8 > 0 else 0.0
    wt = (1 - p.lam) / (t8 - t2) if t8 - t2 > 0 else 0.0
    cur_mb = np.select([bits == 2, bits == 4], [mb[2], mb[4]], mb[8])
    load = np.bincount(p.channel, weights=cur_mb, minlength=C)
    inv = np.select([bits == 2, bits == 4], [_INV[2], _INV[4]], _INV[8])
    v = float((p.sigma * inv).sum())

    def times(ld: np.ndarray) -> np.ndarray:
        return np.where(used, p.alpha * ld + p.gamma, -np.inf)

    obj = wv * v + wt * times(load).max()
    for _ in range(passes):
        improved = False
        for g in np.argsort(-p.sigma):
            c, b0 = p.channel[g], int(bits[g])
            for b in BITS:
                if b == b0:
                    continue
                ld = load.copy()
                ld[c] += mb[b][g] - mb[b0][g]
                nv = v + p.sigma[g] * (_INV[b] - _INV[b0])
                o = wv * nv + wt * times(ld).max()
                if o < obj - 1e-12:
                    obj, v, load, b0 = o, nv, ld, b
                    bits[g] = b
                    improved = True
        if not improved:
            break
    return bits


def solve(p: AssignProblem, method: str = "auto", milp_max_groups: int = 64) -> np.ndarray:
    """``method``: ``milp``, ``fast``, or ``auto`` (MILP up to ``milp_max_groups`` groups)."""
    if method not in ("auto", "milp", "fast"):
        raise ValueError(f"solver = {method!r}; expected 'auto', 'milp' or 'fast'")
    if method == "milp" or (method == "auto" and len(p.sigma) <= milp_max_groups):
        try:
            return solve_milp(p)
        except ImportError:
            if method == "milp":
                raise
    return solve_fast(p)
