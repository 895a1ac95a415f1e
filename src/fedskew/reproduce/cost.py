"""What rebuilding each paper table costs: its number of runs and an estimate of its compute.

For every table: the distinct runs its cells name (main and sensitivity protocols), the
training sample-passes those runs make (rounds × participation × training-set size × local
epochs for federated methods; rounds × local iterations × server batch for split ones),
the model's forward FLOPs per sample counted by `torch.utils.flop_counter` (a backward pass
is counted as two forwards), and evaluation passes over the test set. GPU-hours divide that
by an **assumed** sustained throughput (`ASSUMED_GPU_TFLOPS`), not a measured one: an
estimate to plan with. CPU-hours divide it by a **measured** rate, for the models and datasets
whose rate has been measured on a CPU (`CPU_RATES`, benchmarks/cpu_rate.py): the runs a CPU
trains in minutes say so. Method-specific extra passes (a teacher's forward in FedNTD/FedED/MOON,
FedSAM's second gradient) are not counted and can add up to ~2×.
`benchmarks/round_time.py --device auto` measures the real per-round cost on a GPU. The
last columns say where each table's data comes from, count the runs this project trains
(`reproduce.suites`) and name the suites.
"""

from __future__ import annotations

from functools import cache

from fedskew import catalog
from fedskew.config import Params
from fedskew.data import sources
from fedskew.data.sizes import digits_split_sizes
from fedskew.reproduce.layouts import load_layouts

ASSUMED_GPU_TFLOPS = 10.0  # sustained fp32 on small models: well under an H100's peak (assumption)

# GFLOP of `run_flops` per CPU-second, under the portable CPU kernels on one thread, by (model, source):
# benchmarks/cpu_rate.py, one whole FedAvg run each (2026-11-26, a 2-core Intel Xeon with AVX-512; see
# benchmarks/README.md). A model on another source has other shapes, so no rate is assumed for it.
CPU_RATES = {
    ("flfcr_mlp", "mnist"): 46.7,  # FL-FCR's MLP, 10 rounds: 6.33 TFLOP in 135 CPU-s
    ("flfcr_mlp", "adult"): 29.3,  # the same MLP on Adult's 105 features: 1.30 TFLOP in 44 CPU-s
    ("fed_dnn", "mnist"): 35.1,    # FedED's DNN, 50 rounds of 5 epochs: 17.9 TFLOP in 511 CPU-s
}



@cache
def _synthetic_sizes(lam: float, mu: float, clients: int, seed: int) -> tuple[int, int]:
    from fedskew.data.datasets.synthetic import generate_synthetic

    data = generate_synthetic(lam, mu, clients=clients, seed=seed)
    return int(len(data["y_train"])), int(len(data["y_test"]))


def dataset_sizes(spec: dict) -> tuple[int, int]:
    """(train, test) sizes of a dataset spec: Synthetic's generated, digits' split, a source's fixed ones, else
    the sizes its class estimates (fedskew.catalog.Source.estimated_sizes)."""
    source = catalog.sources()[spec["source"]]
    if spec["source"] == "synthetic":
        return _synthetic_sizes(spec["lam"], spec["mu"], spec["clients"], spec["seed"])
    if spec["source"] == "digits":
        return digits_split_sizes(spec["test_fraction"])
    if source.train_size is not None and source.test_size is not None:
        return source.train_size, source.test_size
    if source.estimated_sizes is None:
        raise ValueError(f"dataset source {spec['source']!r} declares no sizes; set its train_size and test_size, "
                         "or estimated_sizes")
    return source.estimated_sizes


@cache
def forward_flops(model: str, dataset_spec_items: tuple) -> int:
    """Forward FLOPs of one sample (counted on a batch of 2, halved)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedskew.data.registry import dataset_info
    from fedskew.models import build_model
    from fedskew.numerics.gemm import plain_layers

    info = dataset_info(dict(dataset_spec_items))
    net = plain_layers(build_model(model, info)).eval()  # torch's own products, which the counter sees
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(torch.zeros(2, *info.input_shape))
    return max(1, counter.get_total_flops() // 2)


def run_flops(cfg) -> float:
    train_size, test_size = dataset_sizes(cfg.dataset_spec)
    t = cfg.train
    per_sample = forward_flops(t.model, tuple(sorted(cfg.dataset_spec.items(), key=str)))
    if "local_iterations" in cfg.method_spec:  # split methods: T iterations of B samples a round
        train = t.rounds * cfg.method_spec["local_iterations"] * cfg.method_spec["server_batch"]
    else:
        train = t.rounds * t.participation * train_size * t.local_epochs
    evaluations = t.rounds // t.eval_every + 1
    return 3.0 * per_sample * train + per_sample * test_size * evaluations


def data_origin(source: str) -> str:
    """Where a source's files come from, in the words of the cost table."""
    if catalog.sources()[source].arrives == "embedded":
        return "embedded"
    if source in sources.REGISTRY_PACKAGES:
        return f"registry package {sources.REGISTRY_PACKAGES[source].name}"
    if source in sources.OS_PACKAGES:
        return f"OS package {sources.OS_PACKAGES[source].name} or a download"
    return "placed by hand" if catalog.sources()[source].arrives == "by hand" else "download"


def table_runs(params: Params, table_id: str) -> dict[str, object]:
    """The distinct runs (run id -> configuration) the table's cells name, in every protocol."""
    layout = load_layouts()[table_id]
    runs = {}
    for row in (*layout.table.rows, *layout.extra_rows):
        for column in layout.table.columns:
            for protocol in (None, *layout.protocols):
                spec = layout.cell(row, column, protocol)
                if spec.not_run or spec.suite is None or spec.derived:   # a derived cell has no runs of its own
                    continue
                for cfg in params.suite_runs(spec.suite):
                    if (cfg.dataset, cfg.partition, cfg.method) == (spec.dataset, spec.partition, spec.method):
                        runs[cfg.run_id] = cfg
    return runs


def table_cost(params: Params, table_id: str, imported_runs: frozenset[str] = frozenset()) -> dict:
    """What the table costs; `imported_runs`: the run ids that the committed archives of `reproduce.imported`
    hold (the caller reads them: `fedskew.packed.archive.archived_run_ids`)."""
    return {"table": table_id, **runs_cost(params, table_runs(params, table_id), imported_runs)}


def runs_cost(params: Params, runs: dict, imported_runs: frozenset[str] = frozenset()) -> dict:
    """What training `runs` (run id -> configuration) costs: a table's (`table_cost`) or a suite's
    (`fedskew suites`), so that both count alike."""
    flops = {run_id: run_flops(cfg) for run_id, cfg in runs.items()}
    on_cpu = {run_id: CPU_RATES.get((cfg.train.model, cfg.dataset_spec["source"]))
              for run_id, cfg in runs.items()}
    here = set(params.reproduce_suites)
    return {"runs": len(runs), "pflop": sum(flops.values()) / 1e15,
            "gpu_hours": sum(flops.values()) / (ASSUMED_GPU_TFLOPS * 1e12) / 3600,
            "cpu_runs": sum(rate is not None for rate in on_cpu.values()),
            "cpu_hours": sum(flops[run_id] / (rate * 1e9) / 3600 for run_id, rate in on_cpu.items() if rate),
            "unrated": sorted({f"{cfg.train.model} on {cfg.dataset_spec['source']}" for run_id, cfg in runs.items()
                               if on_cpu[run_id] is None}),  # the models and sources no rate is measured for
            "data": sorted({data_origin(cfg.dataset_spec["source"]) for cfg in runs.values()}),
            "runs_here": sum(cfg.suite in here for cfg in runs.values()),
            "runs_imported": sum(cfg.suite in params.imported_suites and run_id in imported_runs
                                 for run_id, cfg in runs.items()),
            "suites": sorted({cfg.suite for cfg in runs.values()})}


def cpu_text(c: dict) -> str:
    """The CPU-hours of a cost and the runs they cover, or "—" where no run has a measured rate."""
    return f"{c['cpu_hours']:.3g} ({c['cpu_runs']} of {c['runs']})" if c["cpu_runs"] else "—"


def here_text(c: dict) -> str:
    return f"{c['runs_here']} + {c['runs_imported']} imported" if c["runs_imported"] else str(c["runs_here"])


def cost_markdown(params: Params, imported_runs: frozenset[str] = frozenset()) -> str:
    lines = [f"| table | runs | training + evaluation (PFLOP) | GPU-hours at {ASSUMED_GPU_TFLOPS:g} TFLOP/s "
             "(estimate) | CPU-hours at the measured rate (runs it covers) | data from | of which run here "
             "(reproduce.suites; + imported: runs in the committed archives of reproduce.imported) | suites |",
             "|---|---|---|---|---|---|---|---|"]
    for table_id in load_layouts():
        c = table_cost(params, table_id, imported_runs)
        lines.append(f"| {table_id} | {c['runs']} | {c['pflop']:.3g} | {c['gpu_hours']:.3g} | {cpu_text(c)} | "
                     f"{'; '.join(c['data']) or '—'} | {here_text(c)} | {', '.join(c['suites']) or '—'} |")
    return "\n".join(lines)
