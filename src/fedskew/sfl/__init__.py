"""Split-federated algorithms, one file each; `ALGORITHMS` maps their names.

Discovered like the federated ones (fedskew.fl): adding a method is adding a file
that subclasses `SplitAlgorithm` and sets `name`. `base`, `parts` and `vanilla` hold what
the methods share (docs/methods.md, "Split-federated methods").
"""

from fedskew.discovery import discover
from fedskew.sfl.base import SplitAlgorithm

ALGORITHMS: dict[str, type[SplitAlgorithm]] = dict(sorted(
    discover(__name__, __path__, SplitAlgorithm, {"base", "parts", "vanilla"}).items()))
