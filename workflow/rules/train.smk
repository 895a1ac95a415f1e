# One run: (suite, dataset, partition, method, seed). Resumes from its checkpoint
# (results/checkpoints/..., deliberately not a declared output, so a failed job's
# checkpoint survives for the retry) and logs to MLflow when it ends.
rule train:
    input:
        ready=paths.RAW_READY,
        partition=paths.PARTITION,
    output:
        metrics=paths.RUN_METRICS,
        history=paths.RUN_HISTORY,
        config=paths.RUN_CONFIG,
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
