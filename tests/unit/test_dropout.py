"""fedskew's Dropout: a client's masks come from its own generator (fedskew.models.dropout)."""

from __future__ import annotations

import torch
from torch import nn

from fedskew.algorithms import ALGORITHMS
from fedskew.engine.rounds import federated_round
from fedskew.fl.base import ClientContext, TrainingSettings
from fedskew.models import alexnet, build_model, example_info
from fedskew.models.dropout import Dropout, draw_mask, dropout_layers, dropout_plan, given_masks, masks_from
from tests.helpers import DIGITS_INFO


def test_without_a_source_it_is_nn_dropout() -> None:
    x = torch.randn(6, 9)
    torch.manual_seed(3)
    expected = nn.Dropout(0.5)(x)
    torch.manual_seed(3)
    assert torch.equal(Dropout(0.5)(x), expected)
    assert torch.equal(Dropout(0.5).eval()(x), x)


def test_masks_come_from_the_given_generator_and_scale_kept_units() -> None:
    layer, x = Dropout(0.5), torch.randn(6, 9)
    with masks_from(layer, torch.Generator().manual_seed(11)):
        first = layer(x)
        second = layer(x)  # the generator moves on: a new mask
    keep = draw_mask(0.5, x.shape, torch.Generator().manual_seed(11), x.device)
    assert torch.equal(first, x * keep * 2.0)
    assert not torch.equal(first, second)
    assert layer.mask_source is None  # the scope restored nn.Dropout's behaviour
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    with masks_from(layer, torch.Generator().manual_seed(11)):
        layer(x)
    assert torch.equal(torch.get_rng_state(), global_state)  # nothing drawn from the global generator


def test_the_mask_does_not_depend_on_the_activations_dtype() -> None:
    layer = Dropout(0.5)
    with masks_from(layer, torch.Generator().manual_seed(5)):
        as_float = layer(torch.ones(4, 8))
    with masks_from(layer, torch.Generator().manual_seed(5)):
        as_bf16 = layer(torch.ones(4, 8, dtype=torch.bfloat16))
    assert torch.equal(as_float, as_bf16.float())


def test_given_masks_are_applied_as_they_are() -> None:
    layer, x = Dropout(0.25), torch.randn(3, 4)
    mask = (torch.arange(12).reshape(3, 4) % 2).float()
    with given_masks([layer], [mask]):
        assert torch.allclose(layer(x), x * mask / 0.75)


def test_dropout_plan_lists_alexnets_layers_in_forward_order_with_their_input_shapes() -> None:
    model = build_model("alexnet", example_info("alexnet"))  # 3×32×32: 256·4·4 features before fc1
    layers = dropout_layers(model)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    plan = dropout_plan(model, torch.zeros(2, 3, 32, 32))
    assert plan == [(layers[0], (256 * 4 * 4,)), (layers[1], (4096,))]
    assert torch.equal(torch.get_rng_state(), before) and model.training  # the probe drew nothing, mode kept


def _clients(y: torch.Tensor, ids: list[int]) -> list[ClientContext]:
    out = []
    for client_id in ids:
        indices = torch.arange(20 * client_id, 20 * client_id + 20)
        seed = 500 + client_id
        out.append(ClientContext(client_id, 1, indices, torch.bincount(y[indices], minlength=10),
                                 torch.Generator().manual_seed(seed), seed))
    return out


def _local_models(ids: list[int], p: float = 0.5) -> dict[int, dict[str, torch.Tensor]]:
    """Each participant's model right after its local training in one FedAvg round of a small AlexNet."""
    torch.manual_seed(0)
    x, y = torch.randn(60, 1, 8, 8), torch.randint(0, 10, (60,))
    model = alexnet(DIGITS_INFO, hidden=16)
    for layer in dropout_layers(model):
        layer.p = p
    algorithm = ALGORITHMS["fedavg"](TrainingSettings(1, 8, 0.1, 0.0, 0.0), 3, 10)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    trained = {}
    federated_round(algorithm, model, state, _clients(y, ids), x, y, "test",
                    after_local=lambda client, m: trained.__setitem__(
                        client.client_id, {k: v.clone() for k, v in m.state_dict().items()}))
    return trained


def test_a_clients_masks_do_not_depend_on_the_other_clients_of_the_round() -> None:
    alone, together = _local_models([2]), _local_models([0, 1, 2])
    for key, value in alone[2].items():
        assert torch.equal(together[2][key], value), key
    without_dropout = _local_models([2], p=0.0)
    assert not torch.equal(without_dropout[2]["body.fc1.weight"], alone[2]["body.fc1.weight"])  # masks applied
