"""The packed runner: many runs scheduled onto one device, in pieces shorter than a job's time limit.

A layer above single runs. It never changes what a run computes: each run is
`engine.simulation.run_training` of its resolved config, and its numbers depend on that
config (which names its precision and execution) alone, never on how it was packed.
What this layer adds is how GPU time is spent:

- `plan`     which runs (suites, filters or run ids), in which order, and preparing their
             data and partitions;
- `runner`   a piece: several worker processes share the device, each trains runs from
             one queue; at the piece's time limit every run in progress is checkpointed
             and paused, and the next piece resumes it from that checkpoint (kept on the
             machine between pieces); a log records what each piece did and its throughput;
- `archive`  the finished runs' files shipped back in archives of bounded size with a
             manifest of digests and each run's provenance (`ship`), and verified and added
             to results/runs and MLflow at home (`import_archives`).

`python -m fedskew packed run|status|ship|import` is the command line; docs/gpu.md the guide.
"""
