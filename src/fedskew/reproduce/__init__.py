"""Reproduction of the four seed papers: their tables transcribed, our runs laid out beside them, and
a ledger of their claims with a verdict on each (docs/reproducing-papers.md)."""
