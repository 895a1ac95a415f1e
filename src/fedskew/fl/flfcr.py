"""FL-FCR ("Overcoming Data Imbalance in Federated Learning with Calibration Weighting"): margins + feature resampling.

Client side (Algorithm 1, lines 10–25):

- local training with the calibrated loss of Eq. 13: the true-class logit is lowered by
  Δ_y = H / N_y^(1/4) (LDAM-style, true class kept in the denominator);
- after training, per-class statistics of the local model's features v = body(x) over the
  whole local set: mean μ_{c,k} (Eq. 3) for every class with N_{c,k} ≥ 1 and the unbiased
  covariance cov_{c,k} (Eq. 4, divisor N_{c,k} − 1) for N_{c,k} ≥ 2. They are uploaded with
  the counts N_{c,k} at the end of local training (`end_local`, counted as communication;
  covariances as their upper triangles, fedskew.fl.flfcr_features).

Server side (lines 26–36): FedAvg, then for every class the pooled mean and covariance of
Eq. 5–6 (a client with N_{c,k} = 1 contributes its mean and no covariance: "we exclude
sample covariance estimates of clients with N_{c,k} < 2", the weight (N_{c,k} − 1) of its
covariance being 0 anyway), `samples_per_class` features drawn from N(μ_c, cov_c), and the
classifier head of the aggregated model retrained on them with cross entropy
(fedskew.fl.flfcr_retraining).

Choices where the paper is silent or ambiguous (recorded with every result):

- N_c in Δ_c. §IV-B defines N_c = Σ_k N_{c,k} (summed over clients) and §IV-C applies the
  loss "during client updates". `global_counts` = 1 (default, the paper's definition) uses
  the totals, 0 uses the client's own counts. The totals come from `set_label_counts`
  (all clients' counts, if the engine provides them); otherwise the server learns them from
  the N_{c,k} clients upload with their statistics and sends the sum it knows as a
  download payload (counted): a client's own counts always enter its sum, so with full
  participation round 1 uses local counts and every later round the exact totals.
- H: "a hyper-parameter to be tuned", no value given; default 1.0, the value this project
  uses for FedLC's τ (the same margin family, [25] in the paper). The paper suites also train
  H = 4 and 16 (methods `flfcr_h4`, `flfcr_h16`) as sensitivity protocols, not as a tuning.
- Resampling and retraining sizes: not given by the paper. Defaults follow FL-bench's
  implementation of CCVR (Luo et al. 2021, [26], whose virtual-representation retraining
  FL-FCR builds on): 200 samples per class, one pass over them, plain SGD with the
  training batch size and learning rate (`retrain_lr` = 0 means "training.lr"). So the
  head sees about 200·C samples a round, a few dozen steps. `samples_per_class: balanced`
  resamples a class-balanced set the size of the round's pooled data instead: M = N // C
  per class, N = Σ_c N_c over this round's participants (the training set under full
  participation), C the number of classes; `class_sized` draws N_c for class c, a resampled
  D_c the size of the class's pooled data (Algorithm 1, line 31: "Resample D_c", with D_c the
  class's data as §IV-A writes D_c^k), which keeps the classes' imbalance. `retrain_epochs` and
  `retrain_lr` set how long and how fast. `flfcr_mnist` trains `balanced` as sensitivity
  protocols (params.yaml, methods flfcr_balanced*, flfcr_class_sized).
- Classes with pooled N_c < 2 have no covariance and are not sampled. Retraining masks the
  logits of classes without samples this round (with partial participation a class may be
  missing), so the head is calibrated among the classes the server has statistics for and
  the rows of the others are left as aggregated. With every class present it is plain CE.
  Sampling is exact for singular covariances (fedskew.fl.flfcr_retraining).
- Features are those of each client's *local* model after training (Algorithm 1, lines
  17–25), pooled, then used to retrain the head of the aggregated model, as the paper does
  (`features_from: local`). CCVR instead computes them with the *aggregated* model after
  aggregation, one more exchange a round (`features_from: aggregated`): the server sends the
  averaged model back, each participant uploads the statistics of its whole local set under
  it (`FederatedAlgorithm.begin_exchange`; both directions counted as traffic), and the head
  is retrained on features of the very body it will sit on. paper silent on which reading
  the head's mismatch calls for; the paper's Algorithm 1 is the default.
- Randomness: each client draws one integer from its own round generator (seeded by run
  seed, round and client) after training and sends it with its payload; the server seeds a
  torch.Generator with their sum mod 2^63. The draw is order-free, differs between rounds
  and run seeds, and makes the aggregation a pure function of its inputs (bit-identical resume).
- Streaming: the server side folds each participant's update in as soon as it has trained
  (`begin_aggregate`): its model into FedAvg's running weighted average, its statistics into
  the running Eq. 5–6 pool (`ClassStatisticsPool`), its counts and seed into the round's
  totals; the engine then drops the update, so a round holds one model and one client's
  statistics at a time besides the running sums, however many clients take part. Sampling
  and head retraining happen once, in the fold's `finish`.
- The paper's "L2 regularisation on the weight vectors of the last layer and the last
  hidden activation" (after AM-Softmax) is not specified further (no coefficient, Eq. 13
  uses raw logits); it is not added: training.weight_decay is the regulariser.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedskew.fl.base import (
    ClientContext,
    ClientUpdate,
    Exchange,
    FederatedAlgorithm,
    Fold,
    Hyperparameter,
    Panel,
    RoundStart,
    StateDict,
    Switch,
)
from fedskew.fl.flfcr_features import ClassStatisticsPool, body_features, feature_statistics_message
from fedskew.fl.flfcr_retraining import retrain_head, virtual_features
from fedskew.fl.losses import true_class_margin_cross_entropy

HEAD_WEIGHT, HEAD_BIAS = "head.weight", "head.bias"
BALANCED = "balanced"        # samples_per_class: N // C per class, N the round's pooled sample count
CLASS_SIZED = "class_sized"  # samples_per_class: N_c per class, the size of the class's pooled data ("resample D_c")


class FLFCR(FederatedAlgorithm):
    name = "flfcr"
    panel = Panel.CALIBRATION
    hyperparameters = {
        # Δ_c = H / N_c^(1/4) lowers the true logit; the paper suites' largest H is 16, and margins of a thousand
        # logits leave cross entropy saturated: nothing a run could mean.
        "H": Hyperparameter(1.0, minimum=0, maximum=1000,
                            status="paper silent ('a hyper-parameter to be tuned'); 1.0 is fedskew's FedLC τ"),
        # 1: N_c summed over clients (§IV-B); 0: the client's own counts
        "global_counts": Hyperparameter(1, minimum=0, maximum=1, status=(
            "paper ambiguous: §IV-B sums N_c over clients, §IV-C applies the loss on each client")),
        # The features it resamples (per class × classes × feature width) are bounded in fedskew.config_checks,
        # and so is 0, which draws nothing: retrain_epochs 0 is how retraining is turned off.
        "samples_per_class": Hyperparameter(200, minimum=0, maximum=131072, choices=(BALANCED, CLASS_SIZED), status=(
            "paper silent ('resample D_c'); FL-bench's CCVR default 200, 'balanced': N // C per class, "
            "'class_sized': N_c, the size of D_c")),
        "retrain_epochs": Hyperparameter(1, minimum=0, maximum=1000,  # the range of epoch_count, with 0: none
                                         status="paper silent; FL-bench's CCVR default, one pass"),
        "retrain_lr": Hyperparameter(0.0, minimum=0, status=(
            "paper silent; 0 means the training learning rate (FL-bench's CCVR)")),
        "features_from": Hyperparameter("local", choices=("local", "aggregated"), status=(
            "paper: each client's trained local model (Algorithm 1); 'aggregated' is CCVR's reading")),
    }
    switches = (
        # features_from: aggregated would still make the second exchange, whose statistics nothing would use
        Switch("retrain_epochs", "no head retraining", ("samples_per_class", "retrain_lr", "features_from")),
        Switch("H", "no margins, the only use of N_c", ("global_counts",)),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._check_hyperparameters()
        self.aggregated_features = self.hp["features_from"] == "aggregated"
        self._exchange_seed: int | None = None  # the round's seed, kept for the second exchange
        self._all_counts: torch.Tensor | None = None
        # Server state: the label counts each client has reported (saved in checkpoints).
        self._reported = torch.zeros(self.num_clients, self.num_classes, dtype=torch.int64)

    def _check_hyperparameters(self) -> None:
        if self.hp["global_counts"] not in (0, 1):
            raise ValueError(f"{self.name}: global_counts must be 0 or 1, got {self.hp['global_counts']}")
        spc = self.hp["samples_per_class"]
        if spc not in (BALANCED, CLASS_SIZED) and (isinstance(spc, (bool, str)) or spc < 0 or spc != int(spc)):
            raise ValueError(f"{self.name}: samples_per_class must be a whole number >= 0, {BALANCED!r} (N // C "
                             f"per class) or {CLASS_SIZED!r} (N_c per class), got {spc!r}")
        for key in ("H", "retrain_epochs", "retrain_lr"):
            if self.hp[key] < 0:
                raise ValueError(f"{self.name}: {key} must be >= 0, got {self.hp[key]}")
        if self.hp["features_from"] not in ("local", "aggregated"):
            raise ValueError(f"{self.name}: features_from must be 'local' (each client's trained model, "
                             f"Algorithm 1) or 'aggregated' (the averaged model, CCVR), got "
                             f"{self.hp['features_from']!r}")

    # ------------------------------------------------------------ global label counts
    def set_label_counts(self, label_counts: torch.Tensor) -> None:
        """All clients' label counts [num_clients, C] (the partition's), if the engine provides them."""
        self._all_counts = torch.as_tensor(label_counts).to(torch.int64).cpu()

    def class_counts_for(self, client: ClientContext) -> torch.Tensor:
        """The N_c of the client's margins: its own counts, or the totals over clients."""
        own = client.label_counts
        if not self.hp["global_counts"]:
            return own
        if self._all_counts is not None:
            return self._all_counts.sum(dim=0).to(own.device)
        reported = self._reported.clone()
        reported[client.client_id] = own.cpu().to(torch.int64)
        return reported.sum(dim=0).to(own.device)

    def download_payload(self, client: ClientContext) -> dict[str, Any]:
        payload = super().download_payload(client)
        if self.hp["global_counts"]:
            payload["class_counts"] = self.class_counts_for(client)
        return payload

    # ----------------------------------------------------------------- client side
    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        client.scratch["flfcr_counts"] = self.class_counts_for(client)
        client.scratch["flfcr_inputs"] = []  # the batches of the first pass over the local set

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        if not self.aggregated_features and x is not None:
            self._keep_inputs(client, x, y)
        counts = client.scratch.get("flfcr_counts")
        counts = counts if counts is not None else self.class_counts_for(client)
        return true_class_margin_cross_entropy(logits, y, counts, self.hp["H"])

    @staticmethod
    def _keep_inputs(client: ClientContext, x: torch.Tensor, y: torch.Tensor) -> None:
        """Keep the inputs of the first pass over the local set (each sample once) for the statistics of the
        trained model; a step that evaluates the loss twice on the same batch (FedSAM) passes the same tensor,
        stored once."""
        inputs = client.scratch.setdefault("flfcr_inputs", [])
        kept = sum(int(yb.numel()) for _, yb in inputs)
        if kept < client.num_samples and (not inputs or inputs[-1][0] is not x):
            inputs.append((x, y))

    def end_local(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        """The class statistics of the trained model's features (with `features_from: aggregated`, only the
        counts: the statistics come in the second exchange), and the client's share of the round's seed."""
        payload = super().end_local(model, client, num_steps)
        inputs = client.scratch.pop("flfcr_inputs", [])
        if self.aggregated_features:
            payload["counts"] = client.label_counts.cpu().to(torch.int64)
        elif not inputs:
            raise RuntimeError(f"{self.name}: no local inputs were seen (local_loss needs x) for client "
                               f"{client.client_id}")
        else:
            was_training = model.training
            model.eval()
            with torch.no_grad():
                features = body_features(model, torch.cat([xb for xb, _ in inputs]))
            model.train(was_training)
            payload.update(feature_statistics_message(features, torch.cat([yb for _, yb in inputs]),
                                                      self.num_classes))
        payload["seed"] = int(torch.randint(0, 2 ** 62, (1,), generator=client.generator))
        return payload

    # ----------------------------------------------------------------- server side
    def begin_aggregate(self, start: RoundStart) -> Fold:
        return _CalibrationFold(self, start)

    def begin_exchange(self, state: StateDict) -> Exchange | None:
        """With `features_from: aggregated`, CCVR's second round trip: statistics under the averaged model."""
        if not self.aggregated_features or self._exchange_seed is None:
            return None
        seed, self._exchange_seed = self._exchange_seed, None
        return _AggregatedFeatures(self, state, seed)

    def samples_for(self, total: torch.Tensor) -> list[int]:
        """Virtual features for each class: the fixed number, N // C for `balanced`, N_c for `class_sized`."""
        size = self.hp["samples_per_class"]
        if size == CLASS_SIZED:
            return [int(n) for n in total]
        each = int(total.sum()) // self.num_classes if size == BALANCED else int(size)
        return [each] * self.num_classes

    def _calibrate(self, state: StateDict, pool: ClassStatisticsPool, seed: int) -> StateDict:
        """Lines 26–36 after the pooling: sample virtual features, retrain the averaged model's head."""
        total, pooled_mean, pooled_cov = pool.result()
        sizes = self.samples_for(total)
        sampled = (total >= 2) & (torch.tensor(sizes) > 0)
        epochs = int(self.hp["retrain_epochs"])
        if not bool(sampled.any()) or epochs == 0:
            return state
        generator = torch.Generator().manual_seed(seed % 2 ** 63)
        classes = [c for c in range(self.num_classes) if sampled[c]]
        features, labels = virtual_features(pooled_mean, pooled_cov, sizes, classes, generator)
        lr = self.hp["retrain_lr"] or self.settings.lr
        state[HEAD_WEIGHT], state[HEAD_BIAS] = retrain_head(state[HEAD_WEIGHT], state[HEAD_BIAS], features, labels,
                                                            sampled, epochs, lr, self.settings.batch_size, generator)
        return state

    # ------------------------------------------------------------- persistent state
    def state_dict(self) -> dict[str, Any]:
        return {"reported_counts": self._reported.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reported = state["reported_counts"].clone()


class _CalibrationFold(Fold):
    """FedAvg's weighted average, the Eq. 5–6 pool, the reported counts and the seeds' sum, one
    client at a time; `finish` samples and retrains the head once."""

    def __init__(self, method: FLFCR, start: RoundStart) -> None:
        super().__init__(start)
        self.method = method
        self.pool: ClassStatisticsPool | None = None  # d is known once a client has trained
        # The counts the server will know after this round: installed in `finish`, because the
        # round's later clients still take their margins' N_c from what was known before it.
        self.reported = method._reported.clone()
        self.seed = 0  # a Python int: the sum is exact and order-free

    def fold(self, update: ClientUpdate) -> None:
        if self.pool is None:
            if HEAD_WEIGHT not in update.state or HEAD_BIAS not in update.state:
                raise KeyError(f"{self.method.name}: the model has no linear head ({HEAD_WEIGHT}, {HEAD_BIAS})")
            self.pool = ClassStatisticsPool(self.method.num_classes, update.state[HEAD_WEIGHT].shape[1])
        super().fold(update)
        payload = update.payload
        self.reported[update.client_id] = payload["counts"].cpu().to(torch.int64)
        if not self.method.aggregated_features:
            self.pool.add(payload["counts"], payload["means"], payload["covs"])
        self.seed += payload["seed"]

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        state = super().finish(updates)
        self.method._reported = self.reported
        if self.pool is None:  # no client took part: nothing to pool
            return state
        if self.method.aggregated_features:  # calibrated after the second exchange
            self.method._exchange_seed = self.seed
            return state
        return self.method._calibrate(state, self.pool, self.seed)


class _AggregatedFeatures(Exchange):
    """CCVR's second exchange: each participant's Eq. 3–4 under the averaged model, pooled (Eq. 5–6),
    then the same sampling and head retraining as with local features."""

    def __init__(self, method: FLFCR, state: StateDict, seed: int) -> None:
        self.method, self.state, self.seed = method, state, seed
        self.pool = ClassStatisticsPool(method.num_classes, state[HEAD_WEIGHT].shape[1])

    def client_message(self, model: nn.Module, client: ClientContext, x: torch.Tensor,
                       y: torch.Tensor) -> dict[str, torch.Tensor]:
        return feature_statistics_message(body_features(model, x), y, self.method.num_classes)

    def fold(self, client: ClientContext, message: dict[str, torch.Tensor]) -> None:
        self.pool.add(message["counts"], message["means"], message["covs"])

    def finish(self) -> StateDict:
        return self.method._calibrate(self.state, self.pool, self.seed)
