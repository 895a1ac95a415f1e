"""What does live MLflow tracking cost a training run, per round?

Trains one run of the default-sized digits setting twice in a temporary project, with
live tracking into a fresh local SQLite store and without it, and times the time spent
inside the per-round tracking hook against the time of the training loop. The share of
round time must stay under 2 %; the fixed costs (importing MLflow, creating the store, the
final artifacts) are printed apart.

    .venv/bin/python benchmarks/tracking_overhead.py [--rounds 200] [--flush 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--flush", type=float, default=10.0, help="seconds between batches (the default)")
    args = parser.parse_args()

    from fedskew import tracking
    from fedskew.config import load_params
    from fedskew.data.registry import prepare
    from fedskew.engine.simulation import run_training
    from fedskew.job import prepare_partition

    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        params = {
            "run": {"suites": ["bench"]},
            "datasets": {"digits": {"source": "digits"}},
            "partitions": {"dir0.5": {"scheme": "dirichlet", "beta": 0.5, "clients": 10}},
            "methods": {"fedavg": {"algorithm": "fedavg"}},
            "suites": {"bench": {"settings": [{"dataset": "digits", "partitions": ["dir0.5"]}],
                                 "methods": ["fedavg"], "seeds": [0]}},
            "training": {"bench": {"model": "mlp", "rounds": args.rounds, "participation": 0.5,
                                   "eval_every": 1, "checkpoint_every": 10, "threads": 1}},
        }
        Path("params.yaml").write_text(yaml.safe_dump(params))
        loaded = load_params(Path("params.yaml"))
        prepare("digits", loaded.dataset_spec("digits"))
        prepare_partition(loaded, "digits", "dir0.5", 0)
        cfg = loaded.runs()[0]

        started = time.perf_counter()
        live = tracking.LiveRun(project_root=Path(folder), experiment="bench", run_name="bench", params=cfg.to_dict(),
                                tags={tracking.RUN_KEY_TAG: cfg.run_id}, flush_every_s=args.flush).start()
        opened = time.perf_counter() - started
        in_hook = 0.0

        def timed(row: dict) -> None:
            nonlocal in_hook
            t0 = time.perf_counter()
            live.log_round(row)
            in_hook += time.perf_counter() - t0

        t0 = time.perf_counter()
        run_training(cfg, on_round=timed)
        tracked_loop = time.perf_counter() - t0
        t0 = time.perf_counter()
        live.end("FINISHED")
        closed = time.perf_counter() - t0

        for path in Path("results/checkpoints").rglob("last.pt"):
            path.unlink()  # train again from round 0, untracked
        t0 = time.perf_counter()
        run_training(cfg)
        plain_loop = time.perf_counter() - t0

    print(f"{args.rounds} rounds, a batch at most every {args.flush:g} s")
    print(f"training loop: {plain_loop:.2f} s untracked, {tracked_loop:.2f} s tracked")
    print(f"time inside the per-round hook: {in_hook:.3f} s = {100 * in_hook / tracked_loop:.2f} % of the loop")
    print(f"fixed costs: opening the run {opened:.2f} s (imports, store creation), ending it {closed:.2f} s")
    print(f"tracking error: {live.error}")


if __name__ == "__main__":
    main()
