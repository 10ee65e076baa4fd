"""A prepared part read as stored (int32 edges, float16 features, memory-mapped) and the
pieces of the mini-batch paths that read it that way: the same values as the widened part."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import quietgnn.partition.local as local_mod
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.partition.shards import advise_access, read_part, write_part
from quietgnn.runtime.memledger import ledger
from quietgnn.sampling.topology import GroupRows, owner_map

from helpers import small_graph


def _part(tmp_path):
    graph = small_graph()
    lp = build_partitions(graph, partition_nodes(graph, "random", 2), ranks=[0])[0]
    write_part(tmp_path / "p", lp, x_dtype="float16")
    return read_part(tmp_path / "p"), read_part(tmp_path / "p", stored=True)


def test_stored_part_keeps_the_files_types_mapped(tmp_path):
    wide, stored = _part(tmp_path)
    assert wide.indices.dtype == torch.int64 and wide.x.dtype == torch.float32
    assert stored.indices.dtype == torch.int32 and stored.x.dtype == torch.float16
    assert torch.equal(stored.indices.long(), wide.indices)
    assert torch.equal(stored.x.float(), wide.x)
    # not copies: their memory is the mapped files' (and the widened ones are anonymous)
    mapped = {r["name"]: r["mapped"] for r in ledger({"s": stored, "w": wide})["buffers"]}
    assert mapped["s.indices"] and mapped["s.x"]
    assert not mapped["w.indices"] and not mapped["w.x"]


def test_induced_in_row_blocks_equals_the_whole_part_mask(tmp_path, monkeypatch):
    wide, stored = _part(tmp_path)
    keep = wide.indices < wide.n_own
    counts = torch.zeros(wide.n_own, dtype=torch.int64).index_add_(
        0, wide.edge_dst()[keep], torch.ones(int(keep.sum()), dtype=torch.int64))
    want_ptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    monkeypatch.setattr(local_mod, "_EDGE_BLOCK", 7)    # many blocks on a small part
    for lp in (wide, stored):
        ip, ix = lp.induced()
        assert torch.equal(ip, want_ptr)
        assert ix.dtype == lp.indices.dtype and torch.equal(ix.long(), wide.indices[keep])


def test_group_rows_read_the_part_as_global_ids(tmp_path):
    wide, stored = _part(tmp_path)
    lid = wide.local_ids()
    rows = GroupRows(stored.owned, stored.indptr, stored.indices, lid.to(torch.int32))
    nodes = stored.owned[torch.tensor([3, 0, 7])]
    n, pos = rows.entries(nodes)
    k = torch.searchsorted(wide.owned, nodes)
    want = torch.cat([lid[wide.indices[wide.indptr[i]:wide.indptr[i + 1]]] for i in k])
    assert torch.equal(n, wide.indptr[k + 1] - wide.indptr[k])
    assert torch.equal(rows.to_global(rows.cols.index_select(0, pos)), want)


def test_owner_map_is_narrow_and_complete():
    owner = owner_map([torch.tensor([0, 2]), torch.tensor([1, 3])], 4)
    assert owner.dtype == torch.int8 and owner.tolist() == [0, 1, 0, 1]
    try:
        owner_map([torch.tensor([0])], 2)
    except ValueError as exc:
        assert "owned by no rank" in str(exc)
    else:
        raise AssertionError("a node owned by no rank was accepted")


def _vm_flags(t: torch.Tensor) -> list[str]:
    """The VmFlags of the mapping that holds ``t``'s first byte (/proc/self/smaps)."""
    addr = t.untyped_storage().data_ptr()
    flags, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    assert flags is not None, "no mapping holds the tensor"
    return flags


def test_advice_turns_read_around_off_and_on(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("madvise advice is read back from /proc/self/smaps (Linux only)")
    _, stored = _part(tmp_path)
    # rows of a big enough file that the mapping is its own (small arrays may share pages)
    big = torch.from_numpy(np.lib.format.open_memmap(
        tmp_path / "big.npy", mode="w+", dtype="float16", shape=(1 << 16, 16)))
    for t in (stored.indices, big):
        assert "rr" not in _vm_flags(t)
        advise_access([t], random=True)
        assert "rr" in _vm_flags(t)         # VM_RAND_READ: no read-around on a fault
        advise_access([t], random=False)
        assert "rr" not in _vm_flags(t)
    advise_access([torch.zeros(4), torch.empty(0)], random=True)   # anonymous, empty: no error
