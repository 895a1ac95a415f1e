"""What rebuilding each paper table costs: its number of runs and an estimate of its compute.

For every table: the distinct runs its cells name (main and sensitivity protocols), the
training sample-passes those runs make (rounds × participation × training-set size × local
epochs for federated methods; rounds × local iterations × server batch for split ones),
the model's forward FLOPs per sample counted by `torch.utils.flop_counter` (a backward pass
is counted as two forwards), and evaluation passes over the test set. GPU-hours divide that
by an **assumed** sustained throughput (`ASSUMED_GPU_TFLOPS`), not a measured one: an
estimate to plan with. Method-specific extra passes (a teacher's forward in FedNTD/FedED/MOON,
FedSAM's second gradient) are not counted and can add up to ~2×.
`benchmarks/round_time.py --device auto` measures the real per-round cost on a GPU. The
last columns count the runs this project trains (`reproduce.suites`) and name the suites.
"""

from __future__ import annotations

from functools import cache

from fedskew.config import Params
from fedskew.reproduce.layouts import load_layouts

ASSUMED_GPU_TFLOPS = 10.0  # sustained fp32 on small models: well under an H100's peak (assumption)

# Training / test set sizes of every source (fixed by the datasets; FEMNIST with 100 LEAF writers
# is about 100 × 227 samples, 90/10 per writer; ImageNet-subset 12 classes × 1300 / × 50).
SIZES = {
    "digits": (1437, 360), "mnist": (60000, 10000), "fashionmnist": (60000, 10000),
    "cifar10": (50000, 10000), "cifar100": (50000, 10000), "svhn": (73257, 26032),
    "cinic10": (90000, 90000), "tinyimagenet": (100000, 10000), "femnist": (20430, 2270),
    "adult": (30162, 15060), "imagenet_subset": (15600, 600),
}


@cache
def _synthetic_sizes(lam: float, mu: float, clients: int, seed: int) -> tuple[int, int]:
    from fedskew.data.embedded import generate_synthetic

    data = generate_synthetic(lam, mu, clients=clients, seed=seed)
    return int(len(data["y_train"])), int(len(data["y_test"]))


def dataset_sizes(spec: dict) -> tuple[int, int]:
    if spec["source"] == "synthetic":
        return _synthetic_sizes(spec["lam"], spec["mu"], spec["clients"], spec["seed"])
    return SIZES[spec["source"]]


@cache
def forward_flops(model: str, dataset_spec_items: tuple) -> int:
    """Forward FLOPs of one sample (counted on a batch of 2, halved)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedskew.data.registry import dataset_info
    from fedskew.models import build_model

    info = dataset_info(dict(dataset_spec_items))
    net = build_model(model, info).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(torch.zeros(2, *info.input_shape))
    return max(1, counter.get_total_flops() // 2)


def run_flops(cfg) -> float:
    train_size, test_size = dataset_sizes(cfg.dataset_spec)
    t = cfg.training
    per_sample = forward_flops(t["model"], tuple(sorted(cfg.dataset_spec.items(), key=str)))
    if "local_iterations" in cfg.method_spec:  # split methods: T iterations of B samples a round
        train = t["rounds"] * cfg.method_spec["local_iterations"] * cfg.method_spec["server_batch"]
    else:
        train = t["rounds"] * t["participation"] * train_size * t["local_epochs"]
    evaluations = t["rounds"] // t.get("eval_every", 1) + 1
    return 3.0 * per_sample * train + per_sample * test_size * evaluations


def table_cost(params: Params, table_id: str) -> dict:
    layout = load_layouts()[table_id]
    runs = {}
    for row in (*layout.table.rows, *layout.extra_rows):
        for column in layout.table.columns:
            for protocol in (None, *layout.protocols):
                spec = layout.cell(row, column, protocol)
                if spec.not_run or spec.suite is None:
                    continue
                for cfg in params.suite_runs(spec.suite):
                    if (cfg.dataset, cfg.partition, cfg.method) == (spec.dataset, spec.partition, spec.method):
                        runs[cfg.run_id] = cfg
    flops = sum(run_flops(cfg) for cfg in runs.values())
    here = set(params.reproduce_suites)
    return {"table": table_id, "runs": len(runs), "pflop": flops / 1e15,
            "gpu_hours": flops / (ASSUMED_GPU_TFLOPS * 1e12) / 3600,
            "runs_here": sum(cfg.suite in here for cfg in runs.values()),
            "suites": sorted({cfg.suite for cfg in runs.values()})}


def cost_markdown(params: Params) -> str:
    lines = [f"| table | runs | training + evaluation (PFLOP) | GPU-hours at {ASSUMED_GPU_TFLOPS:g} TFLOP/s "
             "(estimate) | of which run here (reproduce.suites) | suites |", "|---|---|---|---|---|---|"]
    for table_id in load_layouts():
        c = table_cost(params, table_id)
        lines.append(f"| {table_id} | {c['runs']} | {c['pflop']:.3g} | {c['gpu_hours']:.3g} | "
                     f"{c['runs_here']} | {', '.join(c['suites']) or '—'} |")
    return "\n".join(lines)
