"""Every method by the name params.yaml uses: federated (fedskew.fl) and split-federated (fedskew.sfl)."""

from fedskew.fl import ALGORITHMS as FEDERATED
from fedskew.fl.base import Algorithm
from fedskew.sfl import ALGORITHMS as SPLIT

_clash = set(FEDERATED) & set(SPLIT)
if _clash:
    raise RuntimeError(f"federated and split methods share names: {sorted(_clash)}")

ALGORITHMS: dict[str, type[Algorithm]] = {**FEDERATED, **SPLIT}
