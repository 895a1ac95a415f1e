"""SplitFedV2 (Thapa et al., "SplitFed: When Federated Learning Meets Split Learning", AAAI 2022).

One server part, trained *sequentially*: the participants take turns, each running its
T local iterations (B_k samples each, plain cross entropy) against the server part as
the previous client left it. Only the client parts are averaged (|D_k|-weighted); the
server part is not averaged, it is simply the one that saw every client in turn.

The order of the turns matters, so it is drawn from the round's server generator (a
seeded permutation of the participants): the result does not depend on how the
schedule happens to list the clients, and every seed sees a different order.
"""

from __future__ import annotations

import torch

from fedskew.fl.base import RoundResult
from fedskew.sfl.base import SplitAlgorithm, SplitRound, new_traffic, split_step, state_bytes


class SplitFedV2(SplitAlgorithm):
    name = "splitfed_v2"

    def run_round(self, rnd: SplitRound) -> RoundResult:
        traffic = new_traffic()
        traffic["down_weights"] = len(rnd.clients) * state_bytes(rnd.view.client_state(rnd.global_state))
        workers = self.client_copies(rnd)
        server = self.server_copy(rnd)
        streams, _ = self.streams(rnd)
        loss_sums = self.loss_sums(rnd)
        self.last_order = [rnd.clients[i].client_id
                           for i in torch.randperm(len(rnd.clients), generator=rnd.generator).tolist()]
        position = {c.client_id: i for i, c in enumerate(rnd.clients)}
        for client_id in self.last_order:
            i = position[client_id]
            for _ in range(self.hp["local_iterations"]):
                batch = streams[i].next()
                inputs = rnd.inputs(batch, streams[i].client)
                loss_sums[i] += split_step(workers[i], server, inputs, rnd.y[batch], traffic)
        client_states = [w.detached_state() for w in workers]
        traffic["up_weights"] = sum(state_bytes(s) for s in client_states)
        global_state = rnd.view.full_state(self.average(client_states, rnd.clients), server.detached_state())
        return self.result(rnd, global_state, loss_sums, self.hp["local_iterations"], traffic)
