"""Datasets (registry, download, embedded generators) and label-skew partitioners."""
