"""Every method by the name params.yaml uses: federated (fedskew.fl), split-federated (fedskew.sfl), and those of
installed plugins (entry points of group `fedskew.methods`, fedskew.plugins)."""

from fedskew import catalog
from fedskew.families import Family
from fedskew.fl import ALGORITHMS as FEDERATED
from fedskew.fl.base import Algorithm, FederatedAlgorithm
from fedskew.sfl import ALGORITHMS as SPLIT
from fedskew.sfl.base import SplitAlgorithm

_clash = set(FEDERATED) & set(SPLIT)
if _clash:
    raise RuntimeError(f"federated and split methods share names: {sorted(_clash)}")

BUILT_IN: dict[str, type[Algorithm]] = {**FEDERATED, **SPLIT}

_BASES = {Family.FEDERATED: FederatedAlgorithm, Family.SPLIT: SplitAlgorithm}


def _plugin_methods() -> dict[str, type[Algorithm]]:
    """The plugins' method classes (fedskew.catalog.plugin_methods), each a subclass of its family's base."""
    out = {}
    for name, plugin in catalog.plugin_methods(set(BUILT_IN)).items():
        base = _BASES[Family(plugin.obj.family)]
        if not issubclass(plugin.obj, base):
            raise plugin.error(f"a {plugin.obj.family} method must subclass {base.__module__}.{base.__name__}")
        out[name] = plugin.obj
    return out


ALGORITHMS: dict[str, type[Algorithm]] = {**BUILT_IN, **_plugin_methods()}
