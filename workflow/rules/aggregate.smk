# Tables (md, csv, tex, json) and accuracy-curve figures of one suite, from its run files.
rule aggregate:
    input:
        lambda w: [str(cfg.path(paths.RUN_METRICS)) for cfg in suite_runs(w.suite)],
    output:
        md=paths.TABLE.format(suite="{suite}", ext="md"),
        csv=paths.TABLE.format(suite="{suite}", ext="csv"),
        tex=paths.TABLE.format(suite="{suite}", ext="tex"),
        json=paths.TABLE.format(suite="{suite}", ext="json"),
        figures=directory(paths.FIGURE_DIR),
    params:
        protocol=lambda w: [P.training(w.suite, s["dataset"]) for s in P.raw["suites"][w.suite]["settings"]],
    log:
        "logs/aggregate/{suite}.log",
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{PY} -m fedskew aggregate --suite {wildcards.suite} 2> {log}"
