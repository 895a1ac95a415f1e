"""Peak memory against the number of clients, for a CIFAR-10-sized run on fake data.

Each configuration (number of clients × method) runs in a fresh Python process, so one
run's allocations, allocator caches and imported code cannot inflate the next one's
figures. A worker process:

1. imports torch and fedskew (RSS "after imports"),
2. makes CIFAR-10-sized fake data: 50 000 train + 10 000 test random uint8 images
   3×32×32, 10 random labels, normalised by `registry._normalise` exactly as
   `registry.load` does (one float32 copy of each set stays in memory),
3. builds the model (`cnn` by default) and the algorithm, takes the initial global state
   (RSS "after data+model": the baseline the per-client costs are measured against),
   then does one throwaway SGD step and one forward pass on a copy of the model (RSS
   "warm": code pages of the kernels and allocator pools now count here, not in the
   first round),
4. splits the training indices over N clients (Dirichlet(β) label skew, numpy, seeded)
   and runs the engine's own `federated_round` for the given rounds with participation
   0.1 (the engine's sampling schedule and per-client generators),
5. evaluates the global model on the test set with the engine's `evaluate`.

Memory is the resident set size (RSS) of the worker, read from /proc/self/status (VmRSS
now, VmHWM its high-water mark) and `resource.getrusage(RUSAGE_SELF).ru_maxrss`. RSS
counts the pages of the process that are in RAM: live tensors, but also the code of
torch's shared libraries that was touched (about 0.5 GB after `import torch` here), the
Python heap, and memory the allocator (glibc malloc) has freed but kept instead of
returning it to the kernel; it does not count pages swapped out. So it is what the
process costs the machine, not the bytes of its live tensors, and differences between
points of one process are the meaningful figures.

Normalising the data creates temporary float copies, so the whole run's peak is often set
while loading. To see the phases separately the worker resets the high-water mark
(writing 5 to /proc/self/clear_refs, Linux >= 4.0) before the rounds and again before
the evaluation, and reads it after each. The reset also resets what ru_maxrss reports
(both read the same kernel counter), so the whole run's peak is the largest of the
setup, rounds and evaluation peaks.

    .venv/bin/python benchmarks/memory.py            # 50 000 images, 10/100/1000 clients, fedavg + scaffold
    .venv/bin/python benchmarks/memory.py --quick    # 5 000 images, 10 and 1000 clients: a smoke run
    .venv/bin/python benchmarks/memory.py --quick --split iid --methods fedavg scaffold flfcr

FL-FCR refuses a client without samples (it has no features to report), and the quick
Dirichlet split of 5 000 images over 1000 clients leaves many empty: measure it on the
IID split there (5 images per client), or on the full data (no client is empty there at seed 0).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MB = 1024 * 1024


def _status_kb(field: str) -> int | None:
    """A field of /proc/self/status in kB (VmRSS, VmHWM); None where /proc is not available."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024


def _hwm_mb() -> float | None:
    kb = _status_kb("VmHWM")
    return None if kb is None else kb / 1024


def _maxrss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB on Linux


def _reset_peak() -> bool:
    """Reset the RSS high-water mark (VmHWM) to the current RSS; False where not supported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def dirichlet_split(labels, num_clients: int, num_classes: int, beta: float, seed: int) -> list:
    """Indices of each client: every class is divided over the clients by Dirichlet(β) proportions."""
    import numpy as np

    rng = np.random.default_rng(seed)
    parts: list[list] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, beta))) * len(idx)).astype(int)[:-1]
        for client, chunk in enumerate(np.split(idx, cuts)):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def iid_split(n: int, num_clients: int, seed: int) -> list:
    import numpy as np

    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_clients)]


def worker(args: argparse.Namespace) -> dict:
    """One configuration, in this (fresh) process; returns its measurements."""
    import torch
    import torch.nn.functional as F

    from fedskew.data.registry import DatasetInfo, _normalise
    from fedskew.engine.evaluate import evaluate
    from fedskew.engine.sampling import client_seed, clients_per_round, sampling_schedule
    from fedskew.engine.rounds import federated_round
    from fedskew.fl import ALGORITHMS
    from fedskew.fl.base import ClientContext, TrainingSettings
    from fedskew.fl.traffic import tensor_bytes
    from fedskew.models import build_model

    torch.set_num_threads(args.threads)
    out: dict = {"clients": args.clients, "method": args.method, "train_images": args.train}
    out["rss_imports_mb"] = _rss_mb()

    # CIFAR-10-sized fake data, normalised as registry.load does.
    g = torch.Generator().manual_seed(args.seed)
    x_train = torch.randint(0, 256, (args.train, 3, 32, 32), dtype=torch.uint8, generator=g)
    x_test = torch.randint(0, 256, (args.test, 3, 32, 32), dtype=torch.uint8, generator=g)
    y_train = torch.randint(0, 10, (args.train,), generator=g)
    y_test = torch.randint(0, 10, (args.test,), generator=g)
    x_train, x_test = _normalise(x_train, x_test, "cifar10")[:2]  # (x_train, x_test, mean, std)
    out["data_mb"] = (tensor_bytes([x_train, x_test, y_train, y_test])) / MB

    torch.manual_seed(args.seed)
    num_classes = 10
    settings = TrainingSettings(local_epochs=args.epochs, batch_size=args.batch_size, lr=0.01, momentum=0.9,
                                weight_decay=0.0)
    algorithm = ALGORITHMS[args.method](settings, args.clients, num_classes)
    model = algorithm.adapt_model(build_model(args.model, DatasetInfo((3, 32, 32), num_classes, True, False)))
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out["model_mb"] = tensor_bytes(global_state) / MB

    out["rss_baseline_mb"] = _rss_mb()          # after data + model: the baseline
    # Warm-up on a throwaway copy: one SGD step on 64 images and one forward pass of 64 test
    # images, so that code pages of the kernels and allocator pools count in the "warm"
    # baseline rather than in the first round (the global state and all RNGs are untouched).
    warm = copy.deepcopy(model)
    warm_opt = torch.optim.SGD(warm.parameters(), lr=0.0)
    F.cross_entropy(warm(x_train[:64]), y_train[:64]).backward()
    warm_opt.step()
    with torch.no_grad():
        warm.eval()
        warm(x_test[:64])
    del warm, warm_opt
    out["rss_warm_mb"] = _rss_mb()
    out["peak_setup_mb"] = _maxrss_mb()          # lifetime peak so far (includes normalisation temporaries)
    out["peak_reset"] = _reset_peak()

    # The split and the schedule (the engine's sampling, per-client generators).
    labels = y_train.numpy()
    if args.split == "iid":
        parts = iid_split(len(labels), args.clients, args.seed)
    else:
        parts = dirichlet_split(labels, args.clients, num_classes, args.beta, args.seed)
    client_indices = [torch.from_numpy(p) for p in parts]
    label_counts = torch.stack([torch.bincount(y_train[ix], minlength=num_classes) for ix in client_indices])
    algorithm.set_label_counts(label_counts)
    per_round = clients_per_round(args.clients, args.participation)
    schedule = sampling_schedule(args.seed, args.clients, per_round, args.rounds)
    out["clients_per_round"] = per_round

    start = time.perf_counter()
    rss_rounds, images = [], 0
    for round_ in range(1, args.rounds + 1):
        clients = []
        for client_id in sorted(int(c) for c in schedule[round_ - 1]):
            seed = client_seed(args.seed, round_, client_id)
            clients.append(ClientContext(client_id, round_, client_indices[client_id], label_counts[client_id],
                                         torch.Generator().manual_seed(seed), seed))
        images += sum(c.num_samples for c in clients) * args.epochs
        outcome = federated_round(algorithm, model, global_state, clients, x_train, y_train, "memory-bench")
        global_state = outcome.global_state
        del outcome, clients
        rss_rounds.append(_rss_mb())
    out["train_seconds"] = time.perf_counter() - start
    out["images_trained"] = images
    out["rss_after_rounds_mb"] = rss_rounds
    out["peak_rounds_mb"] = _hwm_mb() if out["peak_reset"] else None
    # Evaluation of the global model (engine.evaluate, batches of 2048), its peak measured alone.
    out["rss_before_eval_mb"] = _rss_mb()
    reset = _reset_peak()
    model.load_state_dict(global_state)
    metrics = evaluate(model, x_test, y_test, num_classes)
    out["test_acc"] = metrics["acc"]
    out["peak_eval_mb"] = _hwm_mb() if reset else None
    out["rss_end_mb"] = _rss_mb()
    # ru_maxrss is the kernel's high-water mark, which the resets above also reset (getrusage
    # reads the same mm counter as VmHWM): at this point it is the evaluation's peak. The
    # lifetime peak is the largest of the three phases' peaks.
    out["ru_maxrss_end_mb"] = _maxrss_mb()
    out["peak_after_setup_mb"] = max(v for v in (out["peak_rounds_mb"], out["peak_eval_mb"], out["ru_maxrss_end_mb"])
                                     if v is not None)
    out["peak_mb"] = max(out["peak_setup_mb"], out["peak_after_setup_mb"])
    state = algorithm.state_dict()
    out["algorithm_state_mb"] = tensor_bytes(state.get("client_c", {})) / MB + tensor_bytes(state.get("c", {})) / MB
    out["clients_with_state"] = len(state.get("client_c", {}))
    return out


def run_worker(args: argparse.Namespace, clients: int, method: str) -> dict:
    """Run one configuration in a fresh interpreter; its last stdout line is the JSON result."""
    env = os.environ.copy()
    if args.mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)  # glibc: large blocks via mmap, returned on free
    command = [sys.executable, __file__, "--worker", "--clients", str(clients), "--method", method,
               "--train", str(args.train), "--test", str(args.test), "--rounds", str(args.rounds),
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--model", args.model,
               "--participation", str(args.participation), "--split", args.split, "--beta", str(args.beta),
               "--seed", str(args.seed), "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"worker {clients} clients / {method} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def table(results: list[dict]) -> str:
    """The Markdown table.

    peak RSS = the whole run's peak (setup included); delta = peak after setup (rounds and
    evaluation) − RSS after data+model. "rounds" and "eval" are high-water marks reset just
    before the rounds, resp. the evaluation, minus the warm baseline (after the warm-up
    step); n/a where the reset is unsupported.
    """
    rows = ["| clients | method | clients/round | peak RSS (MB) | peak after setup (MB) | RSS after data+model (MB) "
            "| delta (MB) | rounds: peak − warm (MB) | eval: peak − warm (MB) | SCAFFOLD c_i kept (MB) "
            "| rounds time (s) |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        base, warm = r["rss_baseline_mb"], r["rss_warm_mb"]
        rounds = None if r["peak_rounds_mb"] is None else r["peak_rounds_mb"] - warm
        evaluation = None if r["peak_eval_mb"] is None else r["peak_eval_mb"] - warm
        kept = f"{r['algorithm_state_mb']:,.0f} ({r['clients_with_state']} c_i)" if r["clients_with_state"] else "0"
        rows.append(f"| {r['clients']} | {r['method']} | {r['clients_per_round']} | {_fmt(r['peak_mb'])} "
                    f"| {_fmt(r['peak_after_setup_mb'])} | {_fmt(base)} | {_fmt(r['peak_after_setup_mb'] - base)} "
                    f"| {_fmt(rounds)} | {_fmt(evaluation)} "
                    f"| {kept} | {r['train_seconds']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 5 000 train / 1 000 test images, 10 and 1000 clients, 2 workers at a time")
    parser.add_argument("--clients", type=int, nargs="+", default=None, help="default: 10 100 1000")
    parser.add_argument("--methods", nargs="+", default=["fedavg", "scaffold"])
    parser.add_argument("--train", type=int, default=50_000)
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--participation", type=float, default=0.1)
    parser.add_argument("--split", choices=["dirichlet", "iid"], default="dirichlet")
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each worker")
    parser.add_argument("--jobs", type=int, default=None,
                        help="workers at a time (default 1; 2 with --quick). Each is measured alone either way "
                             "(RSS is per process); only the wall time changes")
    parser.add_argument("--mmap-threshold", type=int, default=None,
                        help="set MALLOC_MMAP_THRESHOLD_ (bytes) in the workers, to see glibc's retention")
    parser.add_argument("--json", type=Path, help="also write the raw measurements here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="fedavg", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        args.clients = args.clients[0]
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.train, args.test = 5_000, 1_000
    if args.clients is None:
        args.clients = [10, 1000] if args.quick else [10, 100, 1000]

    print(f"{args.train} train + {args.test} test images 3x32x32, model {args.model}, {args.split} split"
          f"{f' (beta {args.beta})' if args.split == 'dirichlet' else ''}, participation {args.participation}, "
          f"{args.rounds} rounds x {args.epochs} local epoch(s), batch {args.batch_size}, "
          f"{args.threads} torch thread(s) per worker, one fresh process per row"
          f"{f', MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}' if args.mmap_threshold is not None else ''}",
          flush=True)
    jobs = args.jobs or (2 if args.quick else 1)
    configs = [(clients, method) for clients in args.clients for method in args.methods]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda config: run_worker(args, *config), configs))
    for r in results:
        print(f"  {r['clients']:>5} clients {r['method']:<9} peak {r['peak_mb']:,.0f} MB, "
              f"baseline {r['rss_baseline_mb']:,.0f} MB, rounds {r['train_seconds']:.1f} s "
              f"({r['images_trained']} images trained)", file=sys.stderr)
    print(f"  {len(configs)} workers, {jobs} at a time: {time.perf_counter() - started:.0f} s wall", file=sys.stderr)
    first = results[0]
    print(f"data tensors {first['data_mb']:,.0f} MB, model state {first['model_mb']:.1f} MB, "
          f"RSS after imports {first['rss_imports_mb']:,.0f} MB, "
          f"peak while setting up {first['peak_setup_mb']:,.0f} MB, "
          f"warm-up adds {first['rss_warm_mb'] - first['rss_baseline_mb']:,.0f} MB")
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
