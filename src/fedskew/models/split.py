"""Cutting a model into a client part and a server part (split learning).

A `SplitView` holds two `nn.Sequential`s that *share their modules* with the full
model: the client part is the body up to and including the split stage, the server
part is the rest of the body followed by the head. Their composition is the model
itself, so there is one set of weights, one state-dict layout (the full model's) for
checkpoints and evaluation, and the parts only translate keys.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

StateDict = dict[str, torch.Tensor]


@dataclass
class SplitView:
    point: str
    client: nn.Sequential
    server: nn.Sequential
    client_keys: dict[str, str]  # client-part state key -> full-model state key
    server_keys: dict[str, str]  # server-part state key -> full-model state key

    def client_state(self, full: StateDict) -> StateDict:
        return {key: full[full_key] for key, full_key in self.client_keys.items()}

    def server_state(self, full: StateDict) -> StateDict:
        return {key: full[full_key] for key, full_key in self.server_keys.items()}

    def full_state(self, client: StateDict, server: StateDict) -> StateDict:
        """The full model's state from the two parts' states (keys in the model's order)."""
        merged = {full_key: client[key] for key, full_key in self.client_keys.items()}
        merged.update({full_key: server[key] for key, full_key in self.server_keys.items()})
        return merged


def _part_keys(part: nn.Sequential, prefixes: dict[str, str]) -> dict[str, str]:
    keys = {}
    for key in part.state_dict():
        stage, _, rest = key.partition(".")
        keys[key] = f"{prefixes[stage]}{stage}.{rest}"
    return keys


def split_model(model: nn.Module, point: str) -> SplitView:
    """Cut `model` (a SplittableNet) at its split point `point`."""
    points = model.split_points
    if point not in points:
        raise ValueError(f"unknown split point {point!r} for this model; known: {', '.join(points)}")
    stages = list(model.body.named_children())
    cut = [name for name, _ in stages].index(points[point]) + 1
    client = nn.Sequential(OrderedDict(stages[:cut]))
    server = nn.Sequential(OrderedDict([*stages[cut:], ("head", model.head)]))
    prefixes = {name: "body." for name, _ in stages} | {"head": ""}
    return SplitView(point, client, server, _part_keys(client, prefixes), _part_keys(server, prefixes))
