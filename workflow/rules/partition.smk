# A seeded partition: client -> sample indices, label counts, content hash, heatmap (in the report).
from fedskew.config import run_plugins, run_versions


def partition_spec(partition):
    """The partition's spec, with its scheme's numerics version where it is not 1 (its class's `version`, a
    plugin's too) and a plugin scheme's code identity (fedskew.plugin_code): a scheme raised past 1, or a plugin
    scheme whose code changed, redraws its partitions; for a built-in scheme at 1 the params are what they always
    were."""
    spec = P.partition_spec(partition)
    version = run_versions(None, None, None, spec["scheme"]).get("scheme", 1)
    plugin = run_plugins(None, None, None, spec["scheme"]).get("scheme")
    return {**spec, **({"scheme_version": version} if version != 1 else {}),
            **({"scheme_code": plugin["code"]} if plugin else {})}


rule partition:
    input:
        paths.RAW_READY,  # the dataset's manifest: the download job writes it last, over the tensors it names
    output:
        npz=paths.PARTITION,
        json=paths.PARTITION_JSON,
        heatmap=report(paths.PARTITION_HEATMAP, caption="../report/partition.rst", category="partitions",
                       subcategory="{dataset}", labels={"partition": "{partition}", "seed": "{seed}"}),
    params:
        spec=lambda w: partition_spec(w.partition),
        dataset=lambda w: P.dataset_spec(w.dataset),
    log:
        "logs/partition/{dataset}/{partition}/seed{seed}.log",
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "{PY} -m fedskew partition --dataset {wildcards.dataset} --partition {wildcards.partition}"
        " --seed {wildcards.seed} 2> {log}"
