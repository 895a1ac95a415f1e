"""SplitFedV1 (Thapa et al., "SplitFed: When Federated Learning Meets Split Learning", AAAI 2022).

Each participant k trains with its *own copy* of the server part: client part and server
copy form one model that is trained on client k's data alone (activations up, ∇_{A_k}
down, plain cross entropy), for T local iterations of B_k samples. Then both the
client parts and the server copies are averaged weighted by |D_k|. Mathematically this
is FedAvg on the full model with the same minibatches — only the traffic differs — which
the tests check. Server copies exist for the round's participants only.
"""

from __future__ import annotations

from fedskew.fl.base import RoundResult
from fedskew.sfl.base import SplitAlgorithm, SplitRound
from fedskew.sfl.vanilla import train_with_server_copies


class SplitFedV1(SplitAlgorithm):
    name = "splitfed_v1"
    vectorised_clients = True  # the client parts may train stacked (training.execution); server copies stay per client

    def run_round(self, rnd: SplitRound) -> RoundResult:
        parts = self.client_parts(rnd)
        servers = [self.server_part(rnd) for _ in rnd.clients]
        loss_sums = train_with_server_copies(rnd, parts, servers, self.minibatches(rnd), self.hp["local_iterations"])
        client_part = rnd.average(rnd.send_weights_up(parts.states()))
        return self.result(rnd, client_part, rnd.average([s.detached_state() for s in servers]), loss_sums)
