"""Derived randomness: nothing random is shared between clients, rounds or methods.

The client-sampling schedule depends only on (seed, number of clients, clients per
round, rounds), so every method of a seed sees the same clients in the same rounds.
Each client's local training in round r draws from its own generator seeded by
(seed, r, client), so results do not depend on the order clients are trained in.
"""

from __future__ import annotations

import numpy as np
import torch

_SCHEDULE_STREAM = 1
_CLIENT_STREAM = 2
_DROPOUT_STREAM = 4  # (3 is the split round's server stream, engine.simulation)


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed derived from (seed, *keys); distinct keys give independent streams."""
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def clients_per_round(num_clients: int, participation: float) -> int:
    return max(1, int(round(participation * num_clients)))


def sampling_schedule(seed: int, num_clients: int, per_round: int, rounds: int) -> np.ndarray:
    """[rounds, per_round] sorted client ids sampled without replacement in each round."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SCHEDULE_STREAM]))
    return np.stack([np.sort(rng.choice(num_clients, per_round, replace=False)) for _ in range(rounds)])


def client_seed(seed: int, round_: int, client: int) -> int:
    return derive_seed(seed, _CLIENT_STREAM, round_, client)


def dropout_generator(client_seed_: int, device: torch.device) -> torch.Generator:
    """The generator a client's dropout masks come from in one round (fedskew.models.dropout), on `device`.

    Derived from the client's (seed, round, client) seed, apart from the stream its
    minibatches are drawn from, so adding dropout to a model leaves the batches unchanged.
    """
    return torch.Generator(device=device).manual_seed(derive_seed(client_seed_, _DROPOUT_STREAM))
