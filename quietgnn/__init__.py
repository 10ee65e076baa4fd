"""quietgnn: distributed GNN training when the network is the bottleneck.

Import cost is kept low: torch_geometric / ogb are imported lazily by the loaders that need them.
"""

from .graph import Graph

__version__ = "0.1.0"
__all__ = ["Graph", "__version__"]
