# Training: one job per run, or, for suites with `seeds_per_job: all`, one job per grid point
# that trains every seed of it in one process (see `fedskew train --seed`). A job also reads its
# checkpoint (not declared, docs/design.md) and, for its MLflow record only, the partition's .json (its
# content hash, a tag) and .png (an artifact): MLflow observes, and no run file depends on them.
import re

SEEDS_TOGETHER = {s: spec["seeds"] for s, spec in P.raw["suites"].items() if spec.get("seeds_per_job") == "all"}


rule train:
    input:
        ready=paths.RAW_READY,
        partition=paths.PARTITION,
    output:
        metrics=paths.RUN_METRICS,
        history=paths.RUN_HISTORY,
        config=paths.RUN_CONFIG,
    wildcard_constraints:  # every suite whose seeds are not trained together (a suite is followed by "/")
        suite=r"(?!(?:{})/)[^/]+".format("|".join(map(re.escape, SEEDS_TOGETHER))) if SEEDS_TOGETHER else r"[^/]+",
    params:
        run_id=lambda w: find_run(w).run_id,  # hash of the resolved config: any change re-runs
    threads: lambda w: find_run(w).training["threads"]
    log:
        "logs/train/{suite}/{dataset}/{partition}/{method}/seed{seed}.log",
    resources:
        mem_mb=8000,
        runtime=240,
    shell:
        "{PY} -m fedskew train --suite {wildcards.suite} --dataset {wildcards.dataset}"
        " --partition {wildcards.partition} --method {wildcards.method} --seed {wildcards.seed}"
        " --threads {threads} 2> {log}"


# One rule per such suite: a rule's outputs are fixed patterns, and the seeds are the suite's.
for _suite, _seeds in SEEDS_TOGETHER.items():

    rule:
        name:
            f"train_seeds_{_suite}"
        input:
            ready=paths.RAW_READY,
            partitions=expand(paths.PARTITION, seed=_seeds, allow_missing=True),
        output:
            metrics=expand(paths.RUN_METRICS, suite=_suite, seed=_seeds, allow_missing=True),
            history=expand(paths.RUN_HISTORY, suite=_suite, seed=_seeds, allow_missing=True),
            config=expand(paths.RUN_CONFIG, suite=_suite, seed=_seeds, allow_missing=True),
        params:
            # every seed's config hash: any change re-runs the job
            run_ids=lambda w, suite=_suite, seeds=_seeds: [
                P.run(suite, w.dataset, w.partition, w.method, s).run_id for s in seeds
            ],
            suite=_suite,
            seeds=" ".join(map(str, _seeds)),
        threads: lambda w, suite=_suite, seeds=_seeds: P.run(suite, w.dataset, w.partition, w.method, seeds[0]).training["threads"]
        log:
            f"logs/train/{_suite}/{{dataset}}/{{partition}}/{{method}}/seeds.log",
        resources:
            mem_mb=8000,
            runtime=240 * len(_seeds),
        shell:
            "{PY} -m fedskew train --suite {params.suite} --dataset {wildcards.dataset}"
            " --partition {wildcards.partition} --method {wildcards.method} --seed {params.seeds}"
            " --threads {threads} 2> {log}"
