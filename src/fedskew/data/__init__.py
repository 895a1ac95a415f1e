"""Datasets and label-skew partitions: the sources, one module each (datasets/), the mechanics that fetch, verify,
cache and load any of them (this folder), and the partition schemes (partitions/)."""
