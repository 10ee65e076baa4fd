"""GNN layers over sparse adjacency blocks, and the layer stack."""

from .adj import SparseAdj, spmm
from .layers import CONVS, GATConv, GCNConv, GINConv, SAGEConv
from .model import GNN, ModelConfig, build_model
from .sparse import SparseFeatures, maybe_sparse

__all__ = ["SparseAdj", "spmm", "CONVS", "GATConv", "GCNConv", "GINConv", "SAGEConv", "GNN",
           "ModelConfig", "build_model", "SparseFeatures", "maybe_sparse"]
