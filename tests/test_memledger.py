"""The memory ledger (QUIETGNN_MEM_LEDGER): buffers named by the path that reaches them, views
counted once, an optimizer's state named by its parameters' shapes, not their values."""

from __future__ import annotations

import torch

from quietgnn.runtime.memledger import ledger


def test_ledger_names_buffers_once_and_optimizer_state_by_shape():
    w = torch.nn.Parameter(torch.randn(64, 16))
    opt = torch.optim.Adam([w])
    w.grad = torch.ones_like(w)
    opt.step()
    big = torch.zeros(1000, 8)

    class Holder:
        def __init__(self):
            self.big, self.view, self.opt = big, big[10:20], opt

    rows = ledger({"s": Holder()})["buffers"]
    names = [r["name"] for r in rows]
    assert names[0] == "s.big" and rows[0]["bytes"] == big.numel() * 4
    assert "s.view" not in names            # a view of s.big: its storage counted once
    state = [n for n in names if "exp_avg" in n]
    assert sorted(state) == ["s.opt.state[<float32 [64, 16]>]['exp_avg']",
                             "s.opt.state[<float32 [64, 16]>]['exp_avg_sq']"]
    assert not any("tensor(" in n for n in names)
