# A seeded partition: client -> sample indices, label counts, content hash, heatmap (in the report).
rule partition:
    input:
        paths.RAW_READY,
    output:
        npz=paths.PARTITION,
        json=paths.PARTITION_JSON,
        heatmap=report(paths.PARTITION_HEATMAP, caption="../report/partition.rst", category="partitions",
                       subcategory="{dataset}", labels={"partition": "{partition}", "seed": "{seed}"}),
    params:
        spec=lambda w: P.partition_spec(w.partition),
        dataset=lambda w: P.dataset_spec(w.dataset),
    log:
        "logs/partition/{dataset}/{partition}/seed{seed}.log",
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "{PY} -m fedskew partition --dataset {wildcards.dataset} --partition {wildcards.partition}"
        " --seed {wildcards.seed} 2> {log}"
