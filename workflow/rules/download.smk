# Materialise a dataset under data/raw/<dataset>/ (download + verify, or generate).
from fedskew import discovery
from fedskew.config import run_plugins


def dataset_spec(dataset):
    """The dataset's spec, with its source's numerics version where it is not 1 (its class's `version`) and a
    plugin source's code identity (fedskew.plugin_code): a source raised past 1, or a plugin source whose code
    changed, is prepared again; for a built-in source at 1 the params are what they always were."""
    spec = P.dataset_spec(dataset)
    version = discovery.declared_versions("source").get(spec["source"], 1)
    plugin = run_plugins(None, None, spec["source"], None).get("source")
    return {**spec, **({"source_version": version} if version != 1 else {}),
            **({"source_code": plugin["code"]} if plugin else {})}


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
