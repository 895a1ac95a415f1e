"""Combinations the papers evaluate (FedLC Table 7, FedED Table 6): compositions, not copies.

Each parent overrides different hooks (a client loss, a gradient correction, a server
step, a local optimiser step), so a class that inherits from both runs both, and its
hyperparameters are the union of its parents' (FederatedAlgorithm.__init_subclass__).
"""

from fedskew.fl.feded import FedED
from fedskew.fl.fedexp import FedExp
from fedskew.fl.fedlc import FedLC
from fedskew.fl.fedprox import FedProx
from fedskew.fl.fedsam import FedSAM
from fedskew.fl.scaffold import Scaffold


class FedLCScaffold(FedLC, Scaffold):
    """FedLC's calibrated loss with SCAFFOLD's control variates (FedLC Table 7)."""

    name = "fedlc_scaffold"


class FedLCProx(FedLC, FedProx):
    """FedLC's calibrated loss with FedProx's proximal term (FedLC Table 7)."""

    name = "fedlc_fedprox"


class FedEDExp(FedED, FedExp):
    """FedED's client objective with FedEXP's extrapolating server step (FedED Table 6)."""

    name = "feded_fedexp"


class FedEDSAM(FedED, FedSAM):
    """FedED's client objective minimised with FedSAM's sharpness-aware steps (FedED Table 6)."""

    name = "feded_fedsam"
