"""The analysis wing: what reads finished runs and compares them.

* :mod:`~quietgnn.analysis.bench` is ``quietgnn bench``: a study's matrix
  (:mod:`~quietgnn.analysis.matrix`: cells and results) run by
  :mod:`~quietgnn.analysis.runner`, each cell a subprocess, one result per run;
* :mod:`~quietgnn.analysis.projection` replays a run's recorded rounds on a network tier;
* :mod:`~quietgnn.analysis.report` and :mod:`~quietgnn.analysis.plots` turn results into
  tables and figures (``quietgnn report``);
* :mod:`~quietgnn.analysis.advise` probes the strategies on a graph and ranks them for a
  network (``quietgnn advise``).

Everything here reads runs through the record contract (:mod:`quietgnn.runtime.records`)
and sits above the runtime: nothing below imports it (``tests/test_import_layers.py``).
"""
