"""Partitioning: assignment vectors, the on-disk partition book, and per-rank partitions."""

from .book import BOOK_VERSION, PartitionBook, make_book
from .local import LocalPartition, build_partitions, gather_rows, partition_stats
from .partitioners import PARTITIONERS, partition_nodes

__all__ = ["BOOK_VERSION", "PartitionBook", "make_book", "LocalPartition", "build_partitions",
           "gather_rows", "partition_stats", "PARTITIONERS", "partition_nodes"]
