"""quietgnn: distributed GNN training when the network is the bottleneck.

The Python API (:mod:`quietgnn.api`): ``load_dataset`` -> :class:`Graph`, ``train`` -> ``Run``
(summary, metrics, the best-validation model), ``load_model`` (a run's model, PyG inputs),
``advise`` (:mod:`quietgnn.analysis.advise`: which strategy for a graph, model and network).
Import cost is kept low: torch_geometric / ogb are imported lazily by the loaders that need them.
"""

from .analysis.advise import advise
from .api import Run, TrainedModel, load_dataset, load_model, train
from .graph import Graph

__version__ = "0.1.0"
__all__ = ["Graph", "Run", "TrainedModel", "advise", "load_dataset", "load_model", "train",
           "__version__"]
