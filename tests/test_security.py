"""Security (issue #19, items 1-4): nothing read from disk or a socket runs code, servers
listen where they must and only admit the run's own ranks, and a planted payload is a clear
one-line input error. Every payload here is real: unpickled, it would create a marker file."""

from __future__ import annotations

import codecs
import collections
import copyreg
import errno
import hashlib
import io
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from quietgnn import serial
from quietgnn.datasets import planetoid
from quietgnn.datasets.planetoid import _ORIGINAL, read_planetoid
from quietgnn.runtime import checkpoint as ckpt_mod
from quietgnn.runtime.checkpoint import MARKER, CheckpointError, Checkpointer
from quietgnn.runtime.spawn import spawn_function

ROOT = Path(__file__).resolve().parents[1]
CFG = {"strategy": "halo", "dataset": {"name": "synthetic", "root": None, "split_seed": 0},
       "synthetic": {"nodes": 300, "feature_dim": 8},
       "partition": {"method": "metis", "parts": 2, "seed": 0, "clusters": None},
       "model": {"arch": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
       "train": {"epochs": 10, "lr": 0.01}, "options": {}}


class Payload:
    """Unpickling this creates ``path`` (via os.system): the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _plant(path: Path, marker: Path, index: Path, key) -> None:
    """Replace ``path`` by a torch.save'd payload and update its size + sha256 in the JSON
    ``index`` at ``key`` (a list of keys), as an attacker with write access would."""
    data = _torch_bytes({"x": Payload(str(marker))})
    path.write_bytes(data)
    meta = json.loads(index.read_text())
    entry = meta
    for k in key:
        entry = entry[k]
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    index.write_text(json.dumps(meta))


def _one_line_refusal(msg: str, path: Path) -> None:
    assert "\n" not in msg, msg
    assert str(path) in msg and "holds something other than tensors and plain data" in msg
    assert "weights_only" not in msg and "Traceback" not in msg   # never "retry unsafely"


# ---------------------------------------------------------------------- serial (unit)
def test_plain_data_round_trips_exactly_and_code_is_refused(tmp_path):
    np.random.seed(5)
    np.random.rand(3)
    sd = torch.nn.Linear(2, 3).state_dict()
    obj = {"np_rng": np.random.get_state(), "f32": np.float32(0.1), "arr": np.arange(4.0),
           "sd": sd, "key": {("f", 0): [torch.ones(2)]}}
    back = serial.load_file(io.BytesIO(serial.save_bytes(obj)), "test file", "fix")
    np.random.set_state(back["np_rng"])          # bit-identical numpy stream after a restore
    want = np.random.get_state()
    assert back["np_rng"][0] == want[0] and np.array_equal(back["np_rng"][1], want[1])
    np.random.seed(5)
    np.random.rand(3)
    expect = np.random.rand(4)
    np.random.set_state(back["np_rng"])
    assert np.array_equal(np.random.rand(4), expect)
    assert type(back["f32"]) is np.float32 and back["f32"] == np.float32(0.1)
    assert np.array_equal(back["arr"], np.arange(4.0)) and back["arr"].dtype == np.float64
    assert isinstance(back["sd"], OrderedDict) and back["sd"]._metadata == sd._metadata
    assert torch.equal(back["key"][("f", 0)][0], torch.ones(2))
    # what cannot be stored safely fails at save time, naming where it sits
    with pytest.raises(TypeError, match=r"state\['opt'\]\[1\]: .*Payload cannot be stored"):
        serial.save_bytes({"opt": [1, Payload("x")]}, where="state")
    # wire format: JSON when exact, a weights-only archive otherwise
    assert serial.dumps({"a": 0.5})[:1] == b"J" and serial.dumps({0: "a"})[:1] == b"T"
    for o in ({"a": [1.5, None, True]}, {0: (1, "x")}, {"t": torch.arange(3)}):
        got = serial.loads(serial.dumps(o))
        assert repr(got) == repr(o)
    # a pre-fix shard (numpy RNG state pickled): refused with what and why, one line
    f = tmp_path / "old.pt"
    torch.save({"rng": np.random.get_state()}, f)
    with pytest.raises(ValueError) as ei:
        serial.load_file(f, "checkpoint shard", "fix")
    _one_line_refusal(str(ei.value), f)
    assert "unsupported global numpy" in str(ei.value)
    marker = tmp_path / "ran"
    for raw in (b"T" + _torch_bytes(Payload(str(marker))), b"T" + __import__("pickle").dumps(
            Payload(str(marker)))):
        with pytest.raises(ValueError) as ei:
            serial.loads(raw, "the message")
        assert "\n" not in str(ei.value) and "weights_only" not in str(ei.value)
    assert not marker.exists()


def test_values_nested_a_hundred_thousand_deep_are_refused_in_one_line(tmp_path):
    """Unpickling is iterative, so a shard or message holding a list 100,000 deep loads; the
    walk that restores numpy values was then a RecursionError and its traceback."""
    import zipfile
    n = 100_000
    deep = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."     # [[[...]]], built iteratively
    with zipfile.ZipFile(io.BytesIO(serial.save_bytes([1]))) as z:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as w:
            for info in z.infolist():
                w.writestr(info, deep if info.filename.endswith("data.pkl") else
                           z.read(info.filename))
    f = tmp_path / "rank-0.pt"
    f.write_bytes(out.getvalue())
    with pytest.raises(ValueError) as ei:
        serial.load_file(f, "checkpoint shard", "fix")
    assert str(ei.value) == (f"checkpoint shard {str(f)!r} holds values nested deeper than "
                             f"quietgnn follows, where nothing it writes nests more than a few "
                             f"levels; fix")
    with pytest.raises(ValueError, match=r"^the message holds values nested deeper"):
        serial.loads(b"T" + f.read_bytes(), "the message")
    with pytest.raises(ValueError, match=r"^the message is not valid JSON \(nested deeper"):
        serial.loads(b"J" + b"[" * n + b"]" * n, "the message")


# ---------------------------------------------------------------------- item 1: checkpoints
def _state(epoch):
    return {"epoch": epoch, "config": CFG, "book_id": "b", "strategy": {"w": torch.ones(2)}}


def test_planted_checkpoint_shard_is_refused_and_does_not_run(tmp_path):
    ck = Checkpointer(tmp_path, 0, 1, log=lambda m: None)
    ck.save(0, _state(0))
    d = tmp_path / "epoch-000000"
    marker = tmp_path / "pwned"
    _plant(d / "rank-0.pt", marker, d / MARKER, ["shards", "0"])
    with pytest.raises(ValueError) as ei:
        ck.load_latest(CFG, "b")
    _one_line_refusal(str(ei.value), d / "rank-0.pt")
    assert not marker.exists()


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_a_marker_naming_a_file_outside_its_checkpoint_is_refused_unread(tmp_path, monkeypatch,
                                                                         how):
    """A shard's "file" in COMMIT.json of "/etc/passwd" or "../../../etc/passwd" was read and
    hashed (and, its checksum matching, loaded): a name must stay inside its checkpoint
    directory (plain, no '..', not absolute, no link leading out), or nothing is read."""
    ck = Checkpointer(tmp_path / "ck", 0, 1, log=lambda m: None)
    ck.save(0, _state(0))
    d = tmp_path / "ck" / "epoch-000000"
    secret = tmp_path / "secret.pt"                 # outside the checkpoint, checksum matched
    secret.write_bytes((d / "rank-0.pt").read_bytes())
    name = {"absolute": str(secret), "dotdot": "../../secret.pt", "link": "rank-9.pt"}[how]
    if how == "link":
        os.symlink(secret, d / name)
    meta = json.loads((d / MARKER).read_text())
    meta["shards"]["0"]["file"] = name
    (d / MARKER).write_text(json.dumps(meta))
    read = []
    real = ckpt_mod._sha256_file
    monkeypatch.setattr(ckpt_mod, "_sha256_file", lambda p: read.append(p) or real(p))
    monkeypatch.setattr(ckpt_mod, "load_file", lambda *a: read.append(a) or {})
    with pytest.raises(ValueError) as ei:
        ck.load_latest(CFG, "b")
    msg = str(ei.value)
    assert "\n" not in msg and f"shards['0'].file {name!r}" in msg, msg
    assert ("leads out of" if how == "link" else "no '..', no absolute path") in msg
    assert read == []                               # neither hashed nor loaded


def test_failed_shard_write_leaves_no_temp_file_and_names_the_path(tmp_path, monkeypatch):
    real_open = open

    class Full(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def write(self, b):   # half of it lands, then the disk is full
            self.f.write(bytes(b)[: len(b) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return Full(f) if ("w" in mode or "x" in mode) and ".tmp-" in str(path) else f

    import quietgnn.safefiles as files_mod    # where the checkpointer's atomic_write lives
    monkeypatch.setattr(files_mod, "open", fake_open, raising=False)
    ck = Checkpointer(tmp_path, 0, 1, log=lambda m: None)
    with pytest.raises(CheckpointError) as ei:
        ck.save(0, _state(0))
    d = tmp_path / "epoch-000000"
    assert str(d / "rank-0.pt") in str(ei.value) and "No space left" in str(ei.value)
    assert [p.name for p in d.iterdir()] == []          # no partial .rank-0.pt.tmp-<pid>
    monkeypatch.undo()
    ck.save(0, _state(0))                                # and the next attempt works
    assert ck.load_latest(CFG, "b")["epoch"] == 0


# ---------------------------------------------------------------------- items 2, 3 (live)
def _listening(pid: int) -> list[tuple[str, int]]:
    import psutil
    return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet")
                  if c.status == psutil.CONN_LISTEN)


def _rogues(port: int, marker: str, out: dict) -> None:
    """Strangers on the hub's port, before the real spoke joins: a hello with a wrong proof,
    a pickled payload instead of a hello, and a silent connection."""
    from quietgnn.comm.store import _HEADER, HEADER_BYTES, MAC_BYTES

    def read_all(s):
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    return got, "closed"
                got += chunk
        except ConnectionResetError:
            return got, "closed"
        except socket.timeout:
            return got, "open"

    res = {}
    silent = socket.create_connection(("127.0.0.1", port), timeout=30)
    for name, msg in (("bad_hello", _HEADER.pack(b"HELO", 1, MAC_BYTES) + b"\0" * MAC_BYTES),
                      ("pickle", _HEADER.pack(b"GOBJ", 0, 200) + b"T" +
                       _torch_bytes(Payload(marker)))):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        nonce = s.recv(HEADER_BYTES + 16)
        s.sendall(msg)
        got, state = read_all(s)
        res[name] = (len(nonce), got, state)
        s.close()
    silent.settimeout(20)
    res["silent"] = read_all(silent)[1]       # closed when the hub stops accepting
    silent.close()
    out.update(res)


def _live(comm, marker):
    """One process group for items 2 and 3 (process start-up dominates)."""
    import quietgnn.comm.communicator as cm
    from quietgnn.comm.store import StarChannel
    out = {}
    # --- item 2: all_gather_object is counted by its real buffers and never unpickles
    objs = [{"rank": 0, "ok": True, "n": 7}, {"rank": 1, "status": {3: "", 2: "torn"},
                                              "t": torch.arange(5)}]
    comm.take_records()
    got = comm.all_gather_object(objs[comm.rank], kind="control")
    (rec,) = comm.take_records()
    out["gather"] = got
    out["gather_rec"] = (rec.bytes_sent, rec.bytes_recv)
    out["gather_expect"] = (8 + max(len(serial.dumps(o)) for o in objs))   # times P-1 = 1
    # rank 1 plays a hostile peer: its bytes on the wire are a pickle that runs code
    real, evil = getattr(cm, "dumps", None), {"x": 1}
    if comm.rank == 1:
        if real is not None:
            cm.dumps = lambda obj, where="": b"T" + _torch_bytes(Payload(marker))
        else:   # the pre-fix code pickled whatever it was given
            evil = Payload(marker)
    try:
        comm.all_gather_object(evil)
        out["evil_gather"] = "no error"
    except Exception as exc:  # noqa: BLE001
        out["evil_gather"] = f"{type(exc).__name__}: {exc}"
    if real is not None:
        cm.dumps = real
    # --- item 2: the hub
    rogue: dict = {}
    seen: dict = {}
    if comm.rank == 0:
        accept = StarChannel._accept_all

        def watched(self, secret):
            seen["listener"] = self._listener.getsockname()[:2]
            seen["listening"] = _listening(os.getpid())
            t = threading.Thread(target=_rogues, args=(seen["listener"][1], marker, rogue))
            t.start()
            try:
                return accept(self, secret)
            finally:
                t.join()
        StarChannel._accept_all = watched
    else:   # the real spoke joins only after the strangers had their go
        real_conn = socket.create_connection
        socket.create_connection = lambda *a, **k: (time.sleep(1.5), real_conn(*a, **k))[1]
    comm.take_records()
    ch = StarChannel.open(comm, timeout_s=20)
    if comm.rank == 1:
        socket.create_connection = real_conn
    out["boot_recs"] = [(r.op, r.bytes_sent, r.bytes_recv) for r in comm.take_records()]
    out["rogue"], out["seen"] = rogue, seen
    out["listener_closed"] = ch._listener is None
    out["listening_after"] = _listening(os.getpid())
    # spokes' objects arrive; a spoke sending a pickled payload is refused, never unpickled
    g = ch.gather_object({"rank": comm.rank, "arr": torch.full((2,), float(comm.rank))}, "t")
    out["hub_gather"] = g
    if comm.rank == 1:
        r, _, _ = comm._begin()
        ch._to_hub(b"GOBJ", r, b"T" + _torch_bytes(Payload(marker)))
    else:
        try:
            ch.gather_object(None, "t")
            out["evil_hub"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out["evil_hub"] = f"{type(exc).__name__}: {exc}"
    ch.close()
    comm.barrier()
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    marker = tmp_path_factory.mktemp("live") / "pwned"
    res = spawn_function(_live, 2, args=(str(marker),), timeout_s=120, comm_timeout_s=30)
    return res, marker


def test_all_gather_object_counts_real_bytes_and_refuses_pickles(live):
    res, marker = live
    for r, out in enumerate(res):
        assert out["gather"][0] == {"rank": 0, "ok": True, "n": 7}
        assert out["gather"][1]["status"] == {3: "", 2: "torn"}
        assert torch.equal(out["gather"][1]["t"], torch.arange(5))
        assert out["gather_rec"] == (out["gather_expect"], out["gather_expect"])
        assert out["evil_gather"].startswith("CommError") and "rank 1 sent" in \
            out["evil_gather"] and "holds something other than tensors" in out["evil_gather"]
    assert not marker.exists()


def test_hub_binds_master_addr_admits_only_its_spokes_and_closes(live):
    res, marker = live
    hub = res[0]
    ip, port = hub["seen"]["listener"]
    assert ip == "127.0.0.1"                               # MASTER_ADDR, not 0.0.0.0
    assert (ip, port) in hub["seen"]["listening"]
    # strangers: got a nonce, were closed without a byte more; the silent one was dropped
    for name in ("bad_hello", "pickle"):
        n_nonce, got, state = hub["rogue"][name]
        assert (n_nonce, got, state) == (36, b"", "closed"), name
    assert hub["rogue"]["silent"] == "closed"
    assert not marker.exists()
    # the real spoke joined anyway; the listener is gone
    assert hub["listener_closed"]
    assert all(p != port for _, p in hub["listening_after"])
    assert hub["hub_gather"][1]["rank"] == 1 and torch.equal(hub["hub_gather"][1]["arr"],
                                                            torch.ones(2))
    assert hub["evil_hub"].startswith("CommError") and "rank 1 sent" in hub["evil_hub"]
    # bootstrap: port + 32-byte secret in one broadcast; nonce (20 + 16) down, proof (20 + 32)
    # up
    assert hub["boot_recs"] == [("broadcast", 40, 0), ("ft_connect", 36, 52)]
    assert res[1]["boot_recs"] == [("broadcast", 0, 40), ("ft_connect", 52, 36)]


def _probe(comm):
    """What this rank's process listens on while the group is up (gloo pairs; on rank 0 the
    rendezvous store)."""
    comm.barrier()
    out = {"listening": _listening(os.getpid()),
           "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
    comm.barrier()
    return out


def test_nothing_listens_on_all_interfaces():
    res = spawn_function(_probe, 2, timeout_s=120, comm_timeout_s=30)
    for r, out in enumerate(res):
        assert out["listening"], f"rank {r}: no listening socket seen (gloo, store)"
        for ip, port in out["listening"]:
            assert ip not in ("0.0.0.0", "::"), f"rank {r} listens on {ip}:{port}"
            assert ip.startswith("127.") or ip == "::1", (r, ip, port)
        assert out["gloo_ifname"] == "lo"
    # rank 0 hosts the rendezvous store: its MASTER_PORT listener is on 127.0.0.1
    assert len(res[0]["listening"]) > len(res[1]["listening"])


# ---------------------------------------------------------------------- dataset files
def _planetoid(root: Path, n: int = 540, n_train: int = 6, n_test: int = 20) -> Path:
    """``root/Cora/raw``: a small graph in the Planetoid raw layout, pickled the way the
    originals are (csr_matrix feature rows, one-hot ndarray labels, a defaultdict(list)
    adjacency; pickle protocol 2), test rows listed out of id order."""
    import collections
    import pickle

    import scipy.sparse as sp
    rng = np.random.default_rng(0)
    raw = root / "Cora" / "raw"
    raw.mkdir(parents=True)
    x = (rng.random((n, 7)) < 0.3).astype(np.float32)
    onehot = np.eye(4)[rng.integers(0, 4, n)]
    test = rng.permutation(np.arange(n - n_test, n))
    adj = collections.defaultdict(list)
    for u, v in rng.integers(0, n, size=(3 * n, 2)).tolist():
        adj[u].append(v)
    objs = {"x": sp.csr_matrix(x[:n_train]), "y": onehot[:n_train],
            "allx": sp.csr_matrix(x[:n - n_test]), "ally": onehot[:n - n_test],
            "tx": sp.csr_matrix(x[test]), "ty": onehot[test], "graph": adj}
    for k, obj in objs.items():
        (raw / f"ind.cora.{k}").write_bytes(pickle.dumps(obj, protocol=2))
    (raw / "ind.cora.test.index").write_text("".join(f"{i}\n" for i in test))
    return raw


def _pyg_reference(raw: Path):
    """What PyG's own reader builds from an honest folder (it unpickles: test files only)."""
    from torch_geometric.io.planetoid import read_planetoid_data

    from quietgnn.graph import Graph
    return Graph.from_pyg(read_planetoid_data(str(raw), "cora"), name="cora")


def _same_graph(a, b) -> None:
    for f in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_planted_planetoid_raw_file_is_refused_and_does_not_run(tmp_path, monkeypatch):
    """PyG unpickles Planetoid's raw files; quietgnn admits only the numpy/scipy classes they
    hold, so a planted one is refused, naming the file, and its payload never runs."""
    from quietgnn.datasets import load_dataset
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))
    raw = _planetoid(tmp_path / "data")
    _same_graph(load_dataset("cora", tmp_path / "data"), _pyg_reference(raw))
    marker = tmp_path / "pwned"
    for name in ("x", "ally", "graph"):
        f = raw / f"ind.cora.{name}"
        honest = f.read_bytes()
        f.write_bytes(__import__("pickle").dumps({"rows": Payload(str(marker))}, protocol=2))
        with pytest.raises(ValueError) as ei:
            load_dataset("cora", tmp_path / "data")
        msg = str(ei.value)
        assert "\n" not in msg and msg.startswith(f"{f}: refused: this pickle calls "
                                                   f"{os.system.__module__}.system"), msg
        assert "Replace the file with the original" in msg
        f.write_bytes(honest)
    assert not marker.exists()
    # a damaged file (cut short) is one line naming it too
    f = raw / "ind.cora.tx"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"ind\.cora\.tx: not a readable Planetoid file \(\w+"
                                         r"Error: .*\); replace it with the original"):
        load_dataset("cora", tmp_path / "data")


def test_cli_exits_2_on_a_planted_planetoid_file(tmp_path, monkeypatch, capsys):
    from quietgnn.cli import main
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))
    raw = _planetoid(tmp_path / "data")
    marker = tmp_path / "pwned"
    (raw / "ind.cora.graph").write_bytes(__import__("pickle").dumps(Payload(str(marker))))
    rc = main(["prepare", "--dataset", "cora", "--root", str(tmp_path / "data"), "--parts", "2",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"quietgnn: error: {raw / 'ind.cora.graph'}: refused")
    assert not marker.exists() and not (tmp_path / "out").exists()


class _Reduce:
    """Pickles as exactly the ``__reduce__`` tuple given: how a planted file is written."""

    def __init__(self, *reduce) -> None:
        self.reduce = reduce

    def __reduce__(self):
        return self.reduce


class _NewObj:
    """Pickles as NEWOBJ ``cls`` then BUILD ``state``: a ``cls`` instance with any state."""

    def __init__(self, cls, state) -> None:
        self.cls, self.state = cls, state

    @property
    def __class__(self):        # what the pickler checks NEWOBJ's class against
        return self.cls

    def __reduce__(self):
        return copyreg.__newobj__, (self.cls,), self.state


def _dump(path: Path, obj) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def _read(raw: Path):
    return read_planetoid(raw, "cora")


def _csr_state(raw: Path, bad_index: int) -> dict:
    """``ind.cora.allx``'s csr_matrix attributes (this test's own file), one index made bad."""
    state = dict(vars(pickle.loads((raw / "ind.cora.allx").read_bytes())))
    state["indices"] = state["indices"].copy()
    state["indices"][0] = bad_index
    return state


@pytest.mark.parametrize("case, bad, expected", [
    # the reviewer's file: check_format shadowed by a callable that checks nothing, then an
    # index one past the last column, which scipy's C todense wrote into the next row
    ("shadowed", 7, r"refused: holds a sparse matrix with attribute\(s\) 'check_format'; a "
                    r"csr_matrix's pickle holds data, indices, indptr, _shape"),
    ("slot state", 7, r"holds sparse matrix state of type tuple; scipy writes one dict"),
    ("plain", 7, r"not a valid sparse matrix \(ValueError: indices must be < 7\)"),
    ("plain", -1, r"not a valid sparse matrix \(ValueError: indices must be >= 0\)"),
])
def test_a_sparse_matrix_is_rebuilt_from_its_arrays_and_checked_first(tmp_path, case, bad,
                                                                    expected):
    """No method of an unpickled object runs: the matrix is rebuilt from data/indices/indptr/
    _shape and its indices checked by scipy's class method before anything densifies it."""
    raw = _planetoid(tmp_path / "data")
    f = raw / "ind.cora.allx"
    state = _csr_state(raw, bad)
    shadow = {"check_format": collections.defaultdict}
    build = {"shadowed": {**state, **shadow}, "slot state": (state, shadow)}.get(case, state)
    _dump(f, _NewObj(sp.csr_matrix, build))
    with pytest.raises(ValueError) as ei:
        _read(raw)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{f}: "), msg
    assert re.search(expected, msg) and msg.endswith(f"original ({_ORIGINAL})"), msg


@pytest.mark.parametrize("name, expected", [("allx", "refused: holds a sparse matrix with "
                                                     "attribute(s) 'check_format'"),
                                            ("graph", "builds more than 1000 tuples")])
def test_files_that_crashed_the_reader_are_one_line_errors(tmp_path, name, expected):
    """Each of these killed the process (exit 139), so it runs in a forked child (no new
    interpreter to start), which must end with the one-line error: column index 10**8 behind a shadowed check_format (scipy's C todense
    wrote far outside its array), and a 200,000-deep tuple as a dict key (hashing it overflows
    the C stack)."""
    raw = _planetoid(tmp_path / "data")
    f = raw / f"ind.cora.{name}"
    if name == "allx":
        state = {**_csr_state(raw, 10 ** 8), "check_format": collections.defaultdict}
        _dump(f, _NewObj(sp.csr_matrix, state))
    else:           # {((((),),),...): 1}: EMPTY_DICT MARK EMPTY_TUPLE TUPLE1... BININT1 SETITEMS
        f.write_bytes(b"\x80\x02}()" + b"\x85" * 200_000 + b"K\x01u.")
    from quietgnn.datasets.planetoid import read_planetoid
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                # the child: a crash shows as a signal, a refusal as exit 1
        os.close(r)
        try:
            read_planetoid(raw, "cora")
            code, said = 0, ""
        except ValueError as exc:
            code, said = 1, f"ValueError: {exc}"
        os.write(w, said.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        said = fh.read().decode()
    status = os.waitpid(pid, 0)[1]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1, (status, said)
    assert said.startswith(f"ValueError: {f}: {expected}") and "\n" not in said, said


_BIG = (10 ** 6, 10 ** 5)       # float32: 372 GiB


@pytest.mark.parametrize("name, payload, expected", [
    # a strided view of 4 bytes as 372 GiB, which torch.cat materialised
    ("allx", _Reduce(np.ndarray, (_BIG, np.dtype("f4"), b"\0" * 4, 0, (0, 0))),
     "refused: this pickle calls numpy.ndarray directly, which no Planetoid file does"),
    # numpy's own two paths, with a shape the data does not fill
    ("ally", _Reduce(np.zeros(0).__reduce__()[0], (np.ndarray, (0,), b"b"),
                     (1, _BIG, np.dtype("f4"), False, b"\0" * 4)),
     r"holds a float32 array of shape \(1000000, 100000\), 400000000000 bytes, whose data "
     r"is 4 bytes; it is not a Planetoid file"),
    ("ally", _Reduce(np.zeros(1).__reduce_ex__(5)[0], (b"\0" * 4, np.dtype("f4"), _BIG, "C")),
     r"holds a float32 array of shape \(1000000, 100000\), 400000000000 bytes, whose data "
     r"is 4 bytes"),
    ("ally", _Reduce(np.zeros(0).__reduce__()[0], (np.ndarray, (0,), b"b"),
                     (1, (1,), np.dtype("O"), False, [None])),
     r"holds an array type 'O8'; Planetoid arrays are numbers"),
    # list(L) once per node copied one shared list into 10**5 lists while unpickling
    ("graph", _Reduce(list, ([1, 2],)), "refused: this pickle calls builtins.list directly"),
    ("graph", _Reduce(collections.defaultdict, (collections.defaultdict,)),
     r"refused: this pickle calls collections.defaultdict with a default other than list"),
])
def test_no_admitted_global_makes_more_than_the_file_holds(tmp_path, name, payload, expected):
    """numpy.ndarray and list are admitted as the arguments numpy's and defaultdict's pickles
    pass, never as callables; every array's size is exactly its data's."""
    raw = _planetoid(tmp_path / "data")
    f = raw / f"ind.cora.{name}"
    if name == "ally" and "frombuffer" in repr(payload.reduce[0]):
        f.write_bytes(pickle.dumps(payload, protocol=5))
    else:
        _dump(f, payload)
    with pytest.raises(ValueError) as ei:
        _read(raw)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{f}: ") and re.search(expected, msg), msg
    assert msg.endswith(f"original ({_ORIGINAL})"), msg


def test_one_string_decoded_many_times_is_refused(tmp_path):
    """_codecs.encode (protocol 2's bytes) on one memoised string, many times: each copy costs
    the file a few bytes; more copied bytes than the file holds is refused."""
    raw = _planetoid(tmp_path / "data")
    f = raw / "ind.cora.ty"
    args = ("\0" * 10_000, "latin1")
    _dump(f, [_Reduce(codecs.encode, args) for _ in range(1000)])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}: decodes more bytes than the "
                                         rf"file holds \(one string used many times\)"):
        _read(raw)


def test_a_memo_slot_far_beyond_the_pickle_is_refused_unallocated(tmp_path):
    """CPython sizes its memo by the largest slot a PUT names (2 x 8 bytes a slot)."""
    raw = _planetoid(tmp_path / "data")
    f = raw / "ind.cora.graph"
    f.write_bytes(b"\x80\x02]r" + (2 ** 24).to_bytes(4, "little") + b".")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}: names memo slot 16777216 "
                                         rf"at byte 3, after 2 opcodes"):
        _read(raw)


def test_a_graph_of_shared_lists_is_refused_before_it_is_built(tmp_path):
    """Every node's list is the same list (the pickle's memo): a few bytes each on disk, all
    of it in the edge list. More entries than the file has bytes is refused unbuilt."""
    raw = _planetoid(tmp_path / "data")
    f = raw / "ind.cora.graph"
    shared = list(range(540))
    _dump(f, {k: shared for k in range(540)})
    size = f.stat().st_size
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}: its adjacency lists hold "
                                         rf"291600 entries in a {size}-byte file, so they "
                                         rf"share lists"):
        _read(raw)
    # the same lists, each its own: read (and every id checked)
    _dump(f, {k: list(shared[:10]) for k in range(540)})
    assert _read(raw).edge_index.shape == (2, 5400)


def test_dense_matrices_are_checked_against_available_memory(tmp_path, monkeypatch):
    raw = _planetoid(tmp_path / "data")
    monkeypatch.setattr(planetoid, "mem_available_mb", lambda: 1e-6)
    f = raw / "ind.cora.x"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}: a sparse matrix of shape "
                                         rf"\(6, 7\), dense, would need 0 MiB, more than the 0 "
                                         rf"MiB available"):
        _read(raw)
    _dump(f, pickle.loads(f.read_bytes()).toarray())      # the same rows, as an ndarray
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}: a float32 array of shape "
                                         rf"\(6, 7\), as float32, would need"):
        _read(raw)
    monkeypatch.undo()
    assert _read(raw).x.shape == (540, 7)


def test_a_planted_pyg_processed_cache_is_never_loaded(tmp_path, monkeypatch):
    """PyG loads its processed/data.pt with weights_only=False when the safe load fails: quietgnn
    neither reads nor writes that cache (downloads are all it caches), so a planted one in the
    cache's dataset folder never runs."""
    from quietgnn.datasets import load_dataset
    from quietgnn.datasets.pyg import PYG_DATASETS, _cache_entry
    cache = tmp_path / "cache"
    monkeypatch.setenv("QUIETGNN_CACHE", str(cache))
    monkeypatch.setenv("QUIETGNN_OFFLINE", "1")
    marker = tmp_path / "pwned"
    # the raw files were downloaded into the cache (the root holds none)
    root = tmp_path / "empty"
    root.mkdir()
    entry = _cache_entry(PYG_DATASETS["cora"], root.resolve())
    raw = _planetoid(entry)
    processed = entry / "Cora" / "processed"
    processed.mkdir()
    for f in ("data.pt", "pre_filter.pt", "pre_transform.pt"):
        (processed / f).write_bytes(_torch_bytes({"data": Payload(str(marker))}))
    _same_graph(load_dataset("cora", root), _pyg_reference(raw))
    assert not marker.exists()
    # nothing was added to the cache either: the graph is built from the raw files each time
    assert sorted(p.name for p in processed.iterdir()) == ["data.pt", "pre_filter.pt",
                                                          "pre_transform.pt"]


# ---------------------------------------------------------------------- item 4 + CLI resume
def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "quietgnn", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _error_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if "Error" in x or "error" in x]


def test_planted_partition_part_exits_2_with_one_line(tmp_path):
    from quietgnn.datasets import load_dataset
    from quietgnn.partition import make_book
    book = tmp_path / "book"
    # the graph the run asks for (a book of another graph is refused before any load)
    make_book(book, load_dataset("synthetic", synthetic={"nodes": 300, "feature_dim": 8}),
              "random", 2)
    marker = tmp_path / "pwned"
    # an object array in a .npy is a pickle: plant one with its size and checksum updated
    f = book / "part-1" / "x.npy"
    np.save(f, np.array([Payload(str(marker))], dtype=object), allow_pickle=True)
    meta = json.loads((book / "book.json").read_text())
    meta["files"]["part-1/x.npy"].update(bytes=f.stat().st_size, sha256=hashlib.sha256(
        f.read_bytes()).hexdigest())
    (book / "book.json").write_text(json.dumps(meta))
    r = _cli("train", "--strategy", "halo", "--book", str(book), "--parts", "2",
             "--dataset", "synthetic", "--synthetic.nodes", "300", "--synthetic.feature_dim",
             "8", "--epochs", "1", "--runtime.progress", "false", "--runtime.timeout_s", "30",
             "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert not marker.exists()
    errs = [x for x in _error_lines(r.stderr) if "holds pickled Python objects" in x]
    assert len(errs) == 1, r.stderr
    assert str(f) in errs[0] and "never loads" in errs[0]
    assert "Traceback" not in r.stderr and "weights_only" not in r.stderr


@pytest.mark.slow
def test_cli_resume_from_a_planted_shard_exits_2_and_does_not_run_it(tmp_path):
    common = ["train", "--strategy", "halo", "--dataset", "synthetic", "--synthetic.nodes", "300",
              "--synthetic.feature_dim", "8", "--parts", "2", "--hidden", "8",
              "--runtime.progress", "false", "--runtime.timeout_s", "30",
              "--runtime.checkpoint_every", "1", "--out", str(tmp_path / "runs"),
              "--run-name", "r"]
    first = _cli(*common, "--epochs", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    ck = tmp_path / "runs" / "r" / "checkpoints"
    newest = sorted(ck.iterdir())[-1]
    marker = tmp_path / "pwned"
    _plant(newest / "rank-1.pt", marker, newest / MARKER, ["shards", "1"])
    r = _cli(*common, "--epochs", "3", "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert not marker.exists()
    errs = [x for x in _error_lines(r.stderr) if "holds something other" in x]
    assert errs, r.stderr
    _one_line_refusal(errs[0].split("ValueError: ", 1)[1], newest / "rank-1.pt")
    assert "Traceback" not in r.stderr and "weights_only" not in r.stderr


def test_servers_refuse_a_master_addr_that_is_not_this_host():
    """Rank 0 listens on MASTER_ADDR only, so an address of another host is a clear error
    (192.0.2.1: TEST-NET-1, never assigned to a host) rather than a silent wildcard bind."""
    from datetime import timedelta
    from types import SimpleNamespace
    from quietgnn.comm.rendezvous import _tcp_store
    from quietgnn.comm.store import StarChannel
    with pytest.raises(ValueError, match=r"MASTER_ADDR = '192\.0\.2\.1' .*not an address of "
                                         r"this host"):
        _tcp_store("192.0.2.1", 29999, 2, True, timedelta(seconds=5))
    fake = SimpleNamespace(rank=0, world_size=2, timeout_s=5.0, epoch=0)
    with pytest.raises(ValueError, match=r"averaging hub on MASTER_ADDR = '192\.0\.2\.1'.*must "
                                         r"be an address of rank 0's host"):
        StarChannel.open(fake, host="192.0.2.1")
