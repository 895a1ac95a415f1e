"""The fingerprints catch what they are for: a change that moves a method's bits without a version bump fails,
naming the method and what to do; the unchanged method passes."""

from __future__ import annotations

import pytest
import torch

from fedskew.fl.fedprox import FedProx
from tests.fingerprints import record
from tests.fingerprints.digests import run_digest

pytestmark = [pytest.mark.fingerprint, record.requires_portable_kernels]


def test_doubling_fedprox_proximal_gradient_fails_its_fingerprint_naming_it(project, monkeypatch) -> None:
    monkeypatch.chdir(project)

    def doubled(self, model, client) -> None:  # FedProx.after_backward with 2 μ (w − w_t)
        mu = self.hp["mu"]
        with torch.no_grad():
            for param, anchor in zip(model.parameters(), client.scratch["prox_anchor"]):
                if param.grad is not None:
                    param.grad.add_(param - anchor, alpha=2 * mu)

    record.check("method/fedprox/sequential", FedProx.version, run_digest("fedprox", "sequential", "as-is"), "")
    monkeypatch.setattr(FedProx, "after_backward", doubled)
    with pytest.raises(pytest.fail.Exception) as failed:
        record.check("method/fedprox/sequential", FedProx.version, run_digest("fedprox", "sequential", "doubled"),
                     "`version` of FedProx in src/fedskew/fl/fedprox.py")
    message = str(failed.value)
    assert "method/fedprox/sequential (version 1) no longer computes the bits of its fingerprint" in message
    assert "raise its version (`version` of FedProx in src/fedskew/fl/fedprox.py)" in message
