# A seeded partition: client -> sample indices, label counts, content hash, heatmap (in the report).
from fedskew.config import run_versions


def partition_spec(partition):
    """The partition's spec, with its scheme's numerics version where it is not 1 (its class's `version`, a
    plugin's too): a scheme raised past 1 redraws its partitions; at 1 the params are what they always were."""
    spec = P.partition_spec(partition)
    version = run_versions(None, None, None, spec["scheme"]).get("scheme", 1)
    return spec if version == 1 else {**spec, "scheme_version": version}


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
