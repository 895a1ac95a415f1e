"""Vanilla split learning's steps, which the SplitFed methods (V1, V2, V3) share.

The server part is trained with plain cross entropy on the activations a client sends, and the
gradient it returns, ∇_A, is taken with the server weights *before* its step (as in SCALA Eq. 8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedskew.sfl.base import BatchStream, SplitRound
from fedskew.sfl.parts import ClientParts, PartCopy, StackedClientParts


def server_step(server: PartCopy, received: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The server side for one client: the activations it received, cross entropy, a step of `server`.

    Returns the (detached) loss and ∇_A, to be sent back.
    """
    received.requires_grad_(True)
    loss = F.cross_entropy(server(received), y)
    loss.backward()  # gradients of the server part and of the received activations, with w_s^t
    server.step()
    return loss.detach(), received.grad


def split_step(rnd: SplitRound, client: PartCopy, server: PartCopy, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """One step of one client against `server`: activations up, ∇_A down, both parts step.

    Returns the (detached) cross-entropy loss.
    """
    activations = client(x)
    loss, gradient = server_step(server, rnd.send_activations_up(activations, y), y)
    activations.backward(rnd.send_gradients_down(gradient))
    client.step()
    return loss


def train_with_server_copies(rnd: SplitRound, parts: ClientParts | StackedClientParts, servers: list[PartCopy],
                             batches: list[BatchStream], iterations: int) -> list[torch.Tensor]:
    """`iterations` iterations in which client k trains with its own server copy k (SplitFedV1, V3).

    The pairs are independent, so the order they step in does not matter: every client part
    forwards, then each server copy takes its step (in client order, so a server part's dropout
    draws from the round's generator in the same order whether the client parts are stacked or
    not), then every client part back-propagates the gradient its server copy returned.
    Returns each client's summed loss.
    """
    loss_sums = rnd.loss_sums()
    for _ in range(iterations):
        drawn = [stream.next() for stream in batches]
        labels = [rnd.y[batch] for batch in drawn]
        activations = parts.forward([rnd.inputs(batch, stream.client) for batch, stream in zip(drawn, batches)])
        received = rnd.send_activations_up(activations, labels)
        gradients = []
        for server, activation, y, loss_sum in zip(servers, received, labels, loss_sums):
            loss, gradient = server_step(server, activation, y)
            loss_sum += loss
            gradients.append(gradient)
        parts.backward(activations, rnd.send_gradients_down(gradients))
        parts.step()
    return loss_sums
