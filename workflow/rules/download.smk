# Materialise a dataset under data/raw/<dataset>/ (download + verify, or generate).
rule download:
    output:
        paths.RAW_READY,
    params:
        spec=lambda w: P.dataset_spec(w.dataset),  # a changed spec re-runs the job
    log:
        "logs/download/{dataset}.log",
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "{PY} -m fedskew download --dataset {wildcards.dataset} 2> {log}"
