"""SplitFedV2 (Thapa et al., "SplitFed: When Federated Learning Meets Split Learning", AAAI 2022).

One server part, trained *sequentially*: the participants take turns, each running its
T local iterations (B_k samples each, plain cross entropy) against the server part as
the previous client left it. Only the client parts are averaged (|D_k|-weighted); the
server part is not averaged, it is simply the one that saw every client in turn.

The order of the turns matters, so it is drawn from the round's server generator (a
seeded permutation of the participants, `turns`): the result does not depend on how the
schedule happens to list the clients, and every seed sees a different order.
"""

from __future__ import annotations

import torch

from fedskew.fl.base import RoundResult
from fedskew.sfl.base import SplitAlgorithm, SplitRound
from fedskew.sfl.vanilla import split_step


def turns(rnd: SplitRound) -> list[int]:
    """The participants' positions in `rnd.clients`, in the order they take their turns (drawn from the round's
    server generator)."""
    return torch.randperm(len(rnd.clients), generator=rnd.generator).tolist()


class SplitFedV2(SplitAlgorithm):
    name = "splitfed_v2"

    def run_round(self, rnd: SplitRound) -> RoundResult:
        parts = self.client_parts(rnd)
        server = self.server_part(rnd)
        batches = self.minibatches(rnd)
        loss_sums = rnd.loss_sums()
        for i in turns(rnd):
            client, stream = parts.copies[i], batches[i]
            for _ in range(self.hp["local_iterations"]):
                batch = stream.next()
                loss_sums[i] += split_step(rnd, client, server, rnd.inputs(batch, stream.client), rnd.y[batch])
        client_part = rnd.average(rnd.send_weights_up(parts.states()))
        return self.result(rnd, client_part, server.detached_state(), loss_sums)
