"""Split-federated algorithms, one file each; `SPLIT_ALGORITHMS` maps their names.

Discovered like the federated ones (fedskew.fl): adding a method is adding a file
that subclasses `SplitAlgorithm` and sets `name`.
"""

from fedskew.discovery import discover
from fedskew.sfl.base import SplitAlgorithm

SPLIT_ALGORITHMS: dict[str, type[SplitAlgorithm]] = dict(sorted(
    discover(__name__, __path__, SplitAlgorithm, {"base"}).items()))
