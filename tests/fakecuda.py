"""A stand-in GPU for CPU-only machines: code asks for ``cuda`` and gets tensors that say they
live on another device, hold their data in host memory, and refuse to meet a CPU tensor in one
operation — the error a real GPU raises ("Expected all tensors to be on the same device").

Why not ``FakeTensorMode``: fake tensors carry no data, so nothing data-dependent (an
index built from a mask, ``.item()``, a sampler) runs, and a strategy's step is mostly that. Why
not a wrapper that claims ``cuda`` itself: autograd asks the device's guard for streams, and a
CPU build has no CUDA guard. So the stand-in is PyTorch's python-backed ``PrivateUse1`` device,
renamed ``fakegpu`` (a guard and hooks that do nothing), with tensors of a wrapper subclass
whose operations unwrap to the host data, run, and wrap the result again.

Inside :func:`fake_cuda` every ``cuda`` device named to torch (``"cuda"``, ``"cuda:1"``,
``torch.device("cuda", k)``) means ``fakegpu``: factories reach a dispatch mode that makes
them on the host and wraps them; copies (``.to``, ``.cuda``, ``torch.tensor``), which touch
CUDA before the dispatcher, are patched for the duration; ``pin_memory`` is a no-op;
``torch.cuda`` answers as a machine with ``devices`` GPUs. The dispatch mode also follows
autograd into its device threads, so a custom backward's factories are covered. A sparse CSR
result cannot be wrapped (wrapper subclasses are strided): it stays a host tensor, remembered
as living on the device. Zero-dimensional host tensors may meet device tensors, as on CUDA; a
copy between devices (``copy_``) is legal, as on CUDA.

What it cannot see: CUDA-only kernels' own limits (dtypes, sparse formats a CUDA kernel lacks),
streams and asynchrony, memory, NCCL. Those need a real GPU (``benchmarks/bench_gpu.py``).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

NAME = "fakegpu"
_registered = False


class _Module:
    """``torch.fakegpu``: what torch asks a device's module (activation checkpointing saves
    and restores the device's random state and autocast; the stand-in's random numbers are
    the host's)."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def device(self, index: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


def _register() -> None:
    global _registered
    if not _registered:
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
        _setup_privateuseone_for_python_backend(NAME, backend_module=_Module())
        _registered = True


# At import, not on first use: autograd sizes its per-device queues once, at the first
# backward of the process, from the devices registered then (a process that imports this
# module after it has run a backward cannot use the stand-in: start a fresh one).
_register()

_sparse: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


class DeviceTensor(torch.Tensor):
    """Host data that says it lives on ``fakegpu``."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, index: int = 0) -> "DeviceTensor":
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=torch.device(NAME, index),
            requires_grad=inner.requires_grad, strides=inner.stride(),
            storage_offset=inner.storage_offset())
        r.inner = inner
        return r

    def __repr__(self) -> str:  # type: ignore[override]
        return f"DeviceTensor({self.inner!r}, device={self.device})"

    __torch_function__ = torch._C._disabled_torch_function_impl   # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        return _run(func, args, kwargs or {})


def on_device(t: Any) -> bool:
    """Whether ``t`` is a tensor on the stand-in device."""
    return isinstance(t, DeviceTensor) or (
        isinstance(t, torch.Tensor) and t.layout != torch.strided and _sparse.get(id(t)) is t)


def _index(device: Any) -> int | None:
    """The device index of a ``cuda``/``fakegpu`` device, or None for any other."""
    if isinstance(device, str):
        if device.split(":")[0] not in ("cuda", NAME):
            return None
        device = torch.device(device.replace("cuda", NAME, 1))
    if isinstance(device, torch.device) and device.type in ("cuda", NAME):
        return device.index or 0
    return None


def _wrap(t: Any, index: int) -> Any:
    if not isinstance(t, torch.Tensor) or isinstance(t, DeviceTensor):
        return t
    if t.layout != torch.strided:
        _sparse[id(t)] = t
        return t
    return DeviceTensor(t, index)


_CROSS = {torch.ops.aten.copy_.default}   # copies between devices are legal on CUDA


def _run(func, args, kwargs):
    if func in _CROSS:
        dst, src = args[0], args[1]
        (dst.inner if isinstance(dst, DeviceTensor) else dst).copy_(
            src.inner if isinstance(src, DeviceTensor) else src, *args[2:], **kwargs)
        return dst
    found: set[int] = set()
    host: list[torch.Tensor] = []

    def scan(t: Any) -> None:
        if isinstance(t, DeviceTensor):
            found.add(t.device.index or 0)
        elif on_device(t):
            found.add(0)
        elif isinstance(t, torch.Tensor) and t.dim() > 0:
            host.append(t)
    tree_map(scan, (args, kwargs))
    target = min(found) if found else None
    if "device" in kwargs and kwargs["device"] is not None:
        target = _index(kwargs["device"])     # a factory or a copy names where its result goes
        kwargs = dict(kwargs, device=torch.device("cpu"))
    elif len(found) > 1 or (found and host):
        where = sorted(f"cuda:{i}" for i in found) + (["cpu"] if host else [])
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least "
                           f"two devices, {' and '.join(where)}! (in {func})")
    gen = kwargs.get("generator")
    if target is not None and gen is not None and gen.device.type == "cpu":
        raise RuntimeError(f"Expected a 'cuda' device type for generator but found 'cpu' "
                           f"(in {func})")
    # an in-place op (or out=) returns its argument: the caller's wrapper, not a new one
    mine = {}
    tree_map(lambda t: mine.setdefault(id(t.inner), t) if isinstance(t, DeviceTensor) else t,
             (args, kwargs))
    args, kwargs = tree_map(lambda t: t.inner if isinstance(t, DeviceTensor) else t,
                            (args, kwargs))
    out = func(*args, **kwargs)
    if target is None:
        return out
    return tree_map(lambda t: mine[id(t)] if id(t) in mine else _wrap(t, target), out)


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _to_fake(d: Any) -> Any:
    index = _index(d)
    return d if index is None else torch.device(NAME, index)


class _Event:
    """``torch.cuda.Event``: the stand-in's copies are done when they return."""

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _patches(devices: int) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, stand-in): the entry points that reach CUDA before the dispatcher
    (a copy's device guard, ``torch.tensor``'s internal copy, pinned memory, lazy init)."""
    to, tensor, as_tensor = torch.Tensor.to, torch.tensor, torch.as_tensor

    def made_on_host(make):
        def made(*args, device=None, **kwargs):
            t = make(*args, **kwargs)
            return t if _index(device) is None else t.to(_to_fake(device))
        return made
    return [
        (torch.Tensor, "to", lambda self, *a, **k: to(
            self, *[_to_fake(x) for x in a], **{n: _to_fake(v) for n, v in k.items()})),
        (torch.Tensor, "cuda", lambda self, device=None, non_blocking=False, **k: to(
            self, torch.device(NAME, device if isinstance(device, int) else
                               _index(device) or 0), non_blocking=non_blocking)),
        (torch.Tensor, "pin_memory", lambda self, *a, **k: self),
        (torch.Tensor, "is_pinned", lambda self, *a, **k: False),
        (torch, "tensor", made_on_host(tensor)),
        (torch, "as_tensor", made_on_host(as_tensor)),
        (torch.cuda, "_lazy_init", lambda: None),
        (torch.cuda, "is_available", lambda: True),
        (torch.cuda, "device_count", lambda: devices),
        (torch.cuda, "set_device", lambda d: None),
        (torch.cuda, "current_device", lambda: 0),
        (torch.cuda, "synchronize", lambda d=None: None),
        (torch.cuda, "reset_peak_memory_stats", lambda d=None: None),
        (torch.cuda, "max_memory_allocated", lambda d=None: 0),
        (torch.cuda, "memory_allocated", lambda d=None: 0),
        (torch.cuda, "empty_cache", lambda: None),
        (torch.cuda, "Event", _Event),
    ]


@contextlib.contextmanager
def fake_cuda(devices: int = 1) -> Iterator[None]:
    """Run the body as on a machine with ``devices`` GPUs (module docstring)."""
    _register()
    patches = _patches(devices)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        # backward on the calling thread: a device's autograd thread unwinds an error
        # through the stand-in's stream guard, which cannot (the process aborts)
        with torch.autograd.set_multithreading_enabled(False), _Dispatch():
            yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def tensors_on_device(obj: Any) -> bool:
    """Every tensor in ``obj`` (nested lists, tuples, dicts) is on the stand-in device."""
    ok = True

    def check(t: Any) -> None:
        nonlocal ok
        if isinstance(t, torch.Tensor) and not on_device(t):
            ok = False
    tree_map(check, obj)
    return ok


def to_host(obj: Any) -> Any:
    """``obj`` with every stand-in device tensor replaced by its host data (for comparisons)."""
    return tree_map(lambda t: t.inner.detach() if isinstance(t, DeviceTensor) else t, obj)
