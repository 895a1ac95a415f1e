# Tables (md, csv, tex, json) and figures of one suite, from its run files. The tables (md, csv) and
# every figure go into `snakemake --report` (captions in workflow/report/), under the suite's category.


def marked_paper_tables(suite):
    """The paper tables whose values the suite's dot plots mark (fedskew.report.figures.paper_values)."""
    from fedskew.report.figures import paper_values

    return sorted({mark.table for marks in paper_values(suite).values() for mark in marks})


def report_protocol(suite):
    """What the report's captions state about a suite: seeds, methods and each setting's protocol."""
    body = P.raw["suites"][suite]
    settings = {}
    for setting in body["settings"]:
        training = P.training(suite, setting["dataset"])
        for partition in setting["partitions"]:
            settings[f"{setting['dataset']}_{partition}"] = {
                "dataset": setting["dataset"], "partition": partition,
                **{k: training.get(k) for k in ("model", "rounds", "participation", "local_epochs", "batch_size",
                                                "lr", "eval_every")}}
    return {"description": body.get("description", ""), "seeds": list(body["seeds"]),
            "methods": list(body["methods"]), "settings": settings}


# A figure file's name: <dataset>_<partition><suffix>.png; the suffix says what it shows.
FIGURE_KINDS = {"_final": "final accuracy (dot plots)", "_local": "local drift (per-class accuracy)",
                "": "accuracy curves"}


def figure_suffix(wildcards):
    return next(suffix for suffix in FIGURE_KINDS if wildcards.figure.endswith(suffix))


def figure_setting(wildcards):
    """The setting (dataset, partition) a figure file of the suite shows, from its name."""
    stem = wildcards.figure.removesuffix(figure_suffix(wildcards))
    setting = report_protocol(wildcards.suite)["settings"].get(stem)
    return {"dataset": setting["dataset"], "partition": setting["partition"]} if setting else {"dataset": stem,
                                                                                              "partition": "?"}


def figure_kind(wildcards):
    return FIGURE_KINDS[figure_suffix(wildcards)]


rule aggregate:
    input:
        runs=lambda w: run_files(suite_runs(w.suite)),  # tables, curves and local drift read all three
        # The transcriptions of the paper values its dot plots mark: of the paper tables that print this suite
        # only, since the others do not change its figures (and on a fresh clone, where git writes src/ after
        # results/, they would look newer than its committed tables).
        transcriptions=lambda w: transcription_files(marked_paper_tables(w.suite)),
        # The per-client outcomes weigh each run's per-class accuracies by its clients' label counts: the summary
        # (.json) of every partition the suite's runs trained on (fedskew.client_outcomes).
        partitions=lambda w: sorted(paths.PARTITION_JSON.format(dataset=d, partition=p, seed=s)
                                    for d, p, s in P.partitions_needed([w.suite])),
    output:
        md=report(paths.TABLE.format(suite="{suite}", ext="md"), caption="../report/table.rst",
                  category="suite {suite}", subcategory="tables", labels={"format": "markdown"}),
        csv=report(paths.TABLE.format(suite="{suite}", ext="csv"), caption="../report/table.rst",
                   category="suite {suite}", subcategory="tables", labels={"format": "csv"}),
        tex=paths.TABLE.format(suite="{suite}", ext="tex"),
        json=paths.TABLE.format(suite="{suite}", ext="json"),
        runs=paths.RUN_INDEX,  # which run (run id) each cell reads
        # <dataset>_<partition>.png (accuracy curves), ..._final.png (dot plot), ..._local.png (local drift)
        figures=report(directory(paths.FIGURE_DIR), patterns=["{figure}.png"], caption="../report/figure.rst",
                       category="suite {suite}", subcategory=figure_kind, labels=figure_setting),
    params:
        protocol=lambda w: [P.training(w.suite, s["dataset"]) for s in P.raw["suites"][w.suite]["settings"]],
        report=lambda w: report_protocol(w.suite),  # read by the report's captions
    log:
        "logs/aggregate/{suite}.log",
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{PY} -m fedskew aggregate --suite {wildcards.suite} 2> {log}"


# Each method against the suite's baseline (FedAvg where it runs), paired by seed, with its interval, the policy's
# verdicts and, where inconclusive, the seeds that would decide it (`python -m fedskew compare`); `all` builds it
# beside every table of a suite that runs two methods or more, with its figure.
# The ledger's policy (src/fedskew/reproduce/policy.yaml) is code, as for the tables: DVC's compare stage depends
# on it (fedskew.dvcstages). As a Snakemake input it would look newer than the committed comparison on a fresh
# clone (git writes src/ after results/), and `snakemake` would plan to rebuild what is already there.
rule compare:
    input:
        runs=lambda w: run_files(suite_runs(w.suite)),
        partitions=lambda w: sorted(paths.PARTITION_JSON.format(dataset=d, partition=p, seed=s)  # per-client
                                    for d, p, s in P.partitions_needed([w.suite])),              # outcomes
    output:
        md=paths.COMPARISON.format(suite="{suite}", ext="md"),
        csv=paths.COMPARISON.format(suite="{suite}", ext="csv"),
        json=paths.COMPARISON.format(suite="{suite}", ext="json"),
        figure=report(paths.COMPARISON.format(suite="{suite}", ext="png"), caption="../report/compare.rst",
                      category="suite {suite}", subcategory="comparison"),
    log:
        "logs/compare/{suite}.log",
    shell:
        "{PY} -m fedskew compare --suite {wildcards.suite} --write 2> {log}"
