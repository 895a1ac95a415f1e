# Materialise a dataset under data/raw/<dataset>/ (download + verify, or generate).
from fedskew import discovery


def dataset_spec(dataset):
    """The dataset's spec, with its source's numerics version where it is not 1 (its class's `version`): a
    source raised past 1 is prepared again; at 1 the params are what they always were."""
    spec = P.dataset_spec(dataset)
    version = discovery.declared_versions("source").get(spec["source"], 1)
    return spec if version == 1 else {**spec, "source_version": version}


rule download:
    output:
        paths.RAW_READY,
    params:
        spec=lambda w: dataset_spec(w.dataset),  # a changed spec (or source version) re-runs the job
    log:
        "logs/download/{dataset}.log",
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "{PY} -m fedskew download --dataset {wildcards.dataset} 2> {log}"
