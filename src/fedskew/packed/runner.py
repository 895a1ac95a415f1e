"""One piece of packed work: several worker processes share a device until a time limit.

Every worker takes runs from one queue and trains each with `run_training`, exactly as a
training job would (same config, same checkpoints, same run files). Near the piece's
time limit a worker checkpoints the run in progress and stops (`run_training`'s
`should_stop`), so the next piece resumes it from that checkpoint; a worker starts no new
run when too little time is left. Several processes, rather than threads, because a small
model's training is bound by the CPU launching kernels: processes launch in parallel,
and the GPU interleaves their work.

Each piece appends what happened to `logs/packed/pieces.jsonl`: one line per run event
(finished, paused, diverged, failed, skipped) and a closing line with the piece's
throughput: rounds and estimated FLOPs done (fedskew.reproduce.cost), runs per device-hour,
sustained TFLOP/s and, for a GPU whose peak is known, the model-FLOPs utilisation.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedskew import paths, plugins
from fedskew.config import RunConfig

log = logging.getLogger(__name__)

LOG_PATH = Path("logs/packed/pieces.jsonl")
CHECKPOINT_MARGIN_S = 20.0  # time kept for the last checkpoint of a paused run (AlexNet's is ~115 MB)
MIN_START_S = 30.0  # a worker starts no run with less time than this left

# Dense peak throughput in TFLOP/s by (GPU model, precision), from NVIDIA's H100/H200 datasheets
# (fp32: CUDA cores; tf32 and bf16: tensor cores, without sparsity). The H200 has the H100 SXM's compute.
PEAK_TFLOPS = {
    "H100 SXM": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
}


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense peak of a known GPU for `precision`, or None (a CPU, an unlisted GPU)."""
    if "H200" in device_name:
        model = "H200"
    elif "H100" in device_name:
        model = "H100 PCIe" if "PCIe" in device_name else "H100 SXM"  # "NVIDIA H100 80GB HBM3" is the SXM part
    else:
        return None
    return PEAK_TFLOPS[model][precision]


@dataclass
class RunEvent:
    """What one worker did with one run in this piece."""

    event: str            # finished | paused | diverged | failed | skipped
    run_id: str
    run: str              # the run's folder
    worker: int
    rounds_done: int = 0  # rounds trained in this piece
    last_round: int = 0   # the round the run stands at after this piece
    seconds: float = 0.0
    flops: float = 0.0    # estimated FLOPs of the rounds done (reproduce.cost.run_flops, pro rata)
    error: str = ""
    rounds_total: int = 0  # the rounds the whole run has


@dataclass
class PieceSummary:
    workers: int
    time_limit_s: float
    wall_s: float
    device_name: str
    precision: str
    events: list[RunEvent] = field(default_factory=list)

    def count(self, event: str) -> int:
        return sum(e.event == event for e in self.events)

    @property
    def rounds(self) -> int:
        return sum(e.rounds_done for e in self.events)

    @property
    def tflops(self) -> float:
        """Sustained TFLOP/s over the piece's wall time (estimated model FLOPs, all workers together)."""
        return sum(e.flops for e in self.events) / max(self.wall_s, 1e-9) / 1e12

    def seconds_to_finish_paused(self) -> float | None:
        """The most time a paused run of this piece needs to finish, at the pace it had here (its rounds and
        seconds in this piece, start-up included): how long the next piece must be to finish them all."""
        paused = [e for e in self.events if e.event == "paused" and e.rounds_done and e.rounds_total]
        return max(((e.rounds_total - e.last_round) * e.seconds / e.rounds_done for e in paused), default=None)

    def runs_per_hour(self, rounds_per_run: float) -> float:
        """Whole runs per device-hour at this piece's pace: rounds done / rounds a run has, per hour."""
        return self.rounds / rounds_per_run / max(self.wall_s, 1e-9) * 3600.0

    def line(self) -> dict[str, Any]:
        peak = peak_tflops(self.device_name, self.precision)
        return {"event": "piece", "workers": self.workers, "time_limit_s": self.time_limit_s,
                "wall_s": round(self.wall_s, 1), "device_name": self.device_name, "precision": self.precision,
                **{kind: self.count(kind) for kind in ("finished", "paused", "diverged", "failed", "skipped")},
                "rounds": self.rounds, "pflop": _digits(sum(e.flops for e in self.events) / 1e15),
                "tflops": _digits(self.tflops), "peak_tflops": peak,
                "mfu": _digits(self.tflops / peak) if peak else None}


def _digits(value: float) -> float:
    return float(f"{value:.4g}")  # four significant digits, however small


def _train_one(cfg: RunConfig, worker: int, deadline: float, threads: int, max_rounds: int | None,
               parent: int | None = None) -> RunEvent:
    """Train (or resume) one run until it finishes, the piece's time is nearly up, it trained `max_rounds`,
    or the piece's process (`parent`) is gone."""
    from fedskew.engine.rounds import NonFiniteError
    from fedskew.engine.simulation import RunStopped, resolve_device, run_training
    from fedskew.engine.summary import summarise_divergence
    from fedskew.provenance import run_provenance
    from fedskew.reproduce.cost import run_flops
    from fedskew.runfiles import write_run_files

    run_dir = str(cfg.path(paths.RUN_DIR))
    started = time.time()
    asked: list[tuple[int, float]] = []  # (round, when) each time should_stop is asked: after every round

    def should_stop(round_: int) -> bool:
        asked.append((round_, time.time()))
        spans = [b - a for (_, a), (_, b) in zip(asked[-6:], asked[-5:])]  # recent round times
        per_round = max(spans) if spans else asked[-1][1] - started
        return (max_rounds is not None and len(asked) >= max_rounds) or orphaned(parent) or \
            time.time() + 2 * per_round + CHECKPOINT_MARGIN_S > deadline

    def event(kind: str, last_round: int, done: int | None = None, **extra: Any) -> RunEvent:
        done = len(asked) if done is None else done  # asked once after every round but the last
        flops = run_flops(cfg) * done / cfg.train.rounds
        return RunEvent(kind, cfg.run_id, run_dir, worker, done, last_round, time.time() - started, flops,
                        rounds_total=cfg.train.rounds, **extra)

    def provenance() -> dict[str, str]:  # asked once the run has trained: the kernels it trained with
        return run_provenance(str(resolve_device(cfg.train.device)), cfg.train.precision, cfg.train.model)

    try:
        result = run_training(cfg, threads=threads, should_stop=should_stop)
    except RunStopped:
        return event("paused", asked[-1][0])
    except NonFiniteError as error:
        if cfg.train.on_divergence != "record":
            return event("failed", error.round or 0, error=str(error))
        write_run_files(cfg, error.history or [], {**summarise_divergence(error), "provenance": provenance()})
        return event("diverged", error.round or 0)
    # One failed run must not stop the piece; the event names it. A plugin's SystemExit too: the worker would end
    # with exit code 0, as if its runs were done.
    except (Exception, SystemExit) as error:  # noqa: BLE001
        log.exception("%s failed", run_dir)
        said = plugins.exit_error(error) if isinstance(error, SystemExit) else error  # names the plugin that exited
        return event("failed", asked[-1][0] if asked else 0, error=f"{type(said).__name__}: {said}")
    write_run_files(cfg, result.history, {**result.final, "provenance": provenance()})
    return event("finished", cfg.train.rounds, done=len(result.history) - result.resumed_from)


def orphaned(parent: int | None) -> bool:
    """Whether the piece's process is gone (a worker whose parent died was re-parented)."""
    return parent is not None and os.getppid() != parent


def _worker(worker: int, tasks: multiprocessing.Queue, events: multiprocessing.Queue, deadline: float,
            threads: int, max_rounds: int | None, parent: int | None = None) -> None:
    """A worker process: runs from `tasks` until the sentinel None, one event each into `events`. Every task was
    queued when the piece began, so a worker outlives a killed piece unless it stops by itself: it checkpoints
    the run in progress and takes no other once its parent is gone."""
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s worker{worker} %(name)s: %(message)s")
    while (cfg := tasks.get()) is not None:
        if orphaned(parent):
            log.warning("worker%d: the piece's process is gone; stopping", worker)
            return
        if time.time() > deadline - MIN_START_S:
            events.put(RunEvent("skipped", cfg.run_id, str(cfg.path(paths.RUN_DIR)), worker))
            continue
        events.put(_train_one(cfg, worker, deadline, threads, max_rounds, parent))


def run_piece(runs: list[RunConfig], *, workers: int, time_limit_s: float, threads: int,
              max_rounds: int | None = None, log_path: Path = LOG_PATH) -> PieceSummary:
    """Train `runs` with `workers` processes for at most `time_limit_s` (and at most `max_rounds` rounds of each
    run: a slice, to measure throughput); every event is logged as it comes."""
    from fedskew.engine.simulation import resolve_device
    from fedskew.provenance import run_provenance

    device = runs[0].train.device if runs else "cpu"
    device_name = run_provenance(str(resolve_device(device)), "fp32")["device_name"]
    precisions = {cfg.train.precision for cfg in runs} or {"fp32"}
    summary = PieceSummary(workers, time_limit_s, 0.0, device_name, "/".join(sorted(precisions)))
    started = time.time()
    deadline = started + time_limit_s
    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    tasks, events = context.Queue(), context.Queue()
    for cfg in runs:
        tasks.put(cfg)
    for _ in range(workers):
        tasks.put(None)
    processes = [context.Process(target=_worker, args=(w, tasks, events, deadline, threads, max_rounds, os.getpid()),
                                 daemon=True) for w in range(workers)]
    for process in processes:
        process.start()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as handle:
        while any(p.is_alive() for p in processes) or not events.empty():
            try:
                got: RunEvent = events.get(timeout=1.0)
            except queue.Empty:
                continue
            summary.events.append(got)
            handle.write(json.dumps(asdict(got), allow_nan=False) + "\n")
            handle.flush()
            log.info("%s %s (%d rounds in %.0f s)%s", got.event, got.run, got.rounds_done, got.seconds,
                     f": {got.error}" if got.error else "")
        for process in processes:
            process.join()
        crashed = [w for w, p in enumerate(processes) if p.exitcode != 0]
        summary.wall_s = time.time() - started
        line = summary.line()
        if crashed:
            line["crashed_workers"] = crashed
        handle.write(json.dumps(line, allow_nan=False) + "\n")
    if crashed:
        raise RuntimeError(f"packed worker(s) {crashed} exited abnormally; their runs keep their checkpoints "
                           f"(see {log_path} and the log above); run the piece again to resume them")
    return summary
