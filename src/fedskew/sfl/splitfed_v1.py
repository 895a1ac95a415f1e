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
from fedskew.sfl.base import SplitAlgorithm, SplitRound, new_traffic, state_bytes


class SplitFedV1(SplitAlgorithm):
    name = "splitfed_v1"
    vectorised_clients = True  # the client parts may train stacked (training.execution); server copies stay per client

    def run_round(self, rnd: SplitRound) -> RoundResult:
        traffic = new_traffic()
        traffic["down_weights"] = len(rnd.clients) * state_bytes(rnd.view.client_state(rnd.global_state))
        workers = self.client_parts(rnd)
        servers = [self.server_copy(rnd) for _ in rnd.clients]
        loss_sums = self.train_with_server_copies(rnd, workers, servers, traffic)
        client_states = workers.states()
        traffic["up_weights"] = sum(state_bytes(s) for s in client_states)
        global_state = rnd.view.full_state(self.average(client_states, rnd.clients),
                                           self.average([s.detached_state() for s in servers], rnd.clients))
        return self.result(rnd, global_state, loss_sums, self.hp["local_iterations"], traffic)
