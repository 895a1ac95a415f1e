"""What crosses the network in a round, counted where it is sent.

Every round, federated or split, reports its traffic as bytes by direction and kind
(`RoundResult.traffic`: "down_weights", "up_activations", ...). A `Traffic` is that count
while the round runs: the piece of the round that sends tensors hands them to `send_down` or
`send_up` and gets them back, so each byte is counted once, at the place it moves, and no
method fills the dictionary by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch

Sent = TypeVar("Sent")


def tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in `obj`, a tensor or a (nested) dict, list or tuple of them: what crosses the network.

    Anything else (a number, None) is not counted: what a real client would send besides tensors is a few
    bytes of framing, the same for every method.
    """
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class Traffic:
    """One round's bytes by direction and kind, counted as the round sends them.

    The kinds a round declares (`down`, `up`) are reported even when nothing of them was sent
    (a split method that returns no gradients still reports `down_gradients` 0), so every round of
    a method has the same keys; a kind sent without being declared is added when first sent.
    """

    def __init__(self, down: Iterable[str] = (), up: Iterable[str] = ()) -> None:
        self._bytes: dict[str, int] = {f"down_{kind}": 0 for kind in down}
        self._bytes.update({f"up_{kind}": 0 for kind in up})

    def send_down(self, kind: str, tensors: Sent, copies: int = 1) -> Sent:
        """Server to clients: `tensors` sent `copies` times (once to each of that many clients); returns them."""
        self._count(f"down_{kind}", tensor_bytes(tensors) * copies)
        return tensors

    def send_up(self, kind: str, tensors: Sent, copies: int = 1) -> Sent:
        """Clients to server: `tensors` (every sender's, in a container, or one sent `copies` times); returns them."""
        self._count(f"up_{kind}", tensor_bytes(tensors) * copies)
        return tensors

    def counts(self) -> dict[str, int]:
        """The bytes so far, "<up|down>_<kind>" -> bytes: a round's `RoundResult.traffic`."""
        return dict(self._bytes)

    def _count(self, key: str, size: int) -> None:
        self._bytes[key] = self._bytes.get(key, 0) + size
