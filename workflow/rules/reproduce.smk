# The papers' tables in their own layout (ours beside the paper's values) and the claims ledger,
# from the run files of the suites under `reproduce.suites` in params.yaml, and of the suites under
# `reproduce.imported`, whose runs were trained elsewhere (a GPU) and are committed as archives in
# results/imported/<suite>/ (docs/gpu.md). Cells of any other suite read "not run: <reason>", so these
# targets never start a download or a GPU job. Both go into `snakemake --report` (category "papers");
# `report_all` below gathers everything built for it.
from fedskew.reproduce.claim import CLAIMS_DIR, load_claims
from fedskew.reproduce.own_claims import CLAIMS_FOLDER, LEDGER, claims_files, ledger_path, load_own_claims
from fedskew.reproduce.layouts import load_layouts
from fedskew.reproduce.paper_tables import paper_table_ids
from fedskew.reproduce.policy import POLICY_FILE


def reproduction_runs(suites):
    """Run files of the listed suites that `reproduce.suites` trains."""
    return run_files(P.runs([s for s in sorted(suites) if s in P.reproduce_suites]))


def claimed_tables():
    """The paper tables the claims are written over (claims/<paper>.yaml)."""
    return sorted({claim.table for claim in load_claims()})


def imported_marks(suites):
    """The marks that the committed archives of the listed suites that `reproduce.imported` names are imported."""
    return [paths.IMPORTED.format(suite=s) for s in sorted(suites) if s in P.imported_suites]


def suite_archives(suite):
    return sorted(str(p) for p in Path(paths.IMPORTED_ARCHIVES.format(suite=suite)).glob("*.tar.gz"))


# Verifies every archive of the suite, then adds its runs to results/runs/ (a run already there with the
# same bytes is skipped; one with other bytes is refused: `fedskew packed import`) and logs them to MLflow.
# A run whose id params.yaml and the code no longer give it (a raised version, a changed setting) is left
# out and listed in the mark, whose cells then say how many of their runs are out of date (fedskew.stale).
rule import_suite:
    input:
        archives=lambda w: suite_archives(w.suite),
    output:
        paths.IMPORTED.format(suite="{suite}"),
    log:
        "logs/import/{suite}.log",
    params:
        archives=lambda w, input: " ".join(input.archives),
    shell:
        "{PY} -m fedskew packed import --skip-stale --mark {output} {params.archives} > {log} 2>&1"


rule paper_table:
    input:
        runs=lambda w: reproduction_runs(load_layouts()[w.table].suites()),
        # For a suite of reproduce.imported, the mark stands for its run files: import_suite places them.
        imported=lambda w: imported_marks(load_layouts()[w.table].suites()),
        transcriptions=lambda w: transcription_files([w.table]),  # what the paper prints, which runs fill it
    output:
        md=report(paths.PAPER_TABLE.format(table="{table}", ext="md"), caption="../report/paper_table.rst",
                  category="papers", subcategory="paper tables", labels={"table": "{table}"}),
        json=paths.PAPER_TABLE.format(table="{table}", ext="json"),
    log:
        "logs/papers/{table}.log",
    shell:
        "{PY} -m fedskew paper-table --table {wildcards.table} 2> {log}"


rule claims:
    input:
        # Not read by the job: built with the ledger, so that `snakemake results/claims.md` (make reproduce)
        # writes the papers' tables too.
        tables=[paths.PAPER_TABLE.format(table=t, ext="md") for t in paper_table_ids()],
        runs=reproduction_runs(P.reproduce_suites),
        imported=imported_marks(P.imported_suites),
        claims=source_files(CLAIMS_DIR.glob("*.yaml")),
        policy=source_files([POLICY_FILE]),  # the words and their thresholds
        transcriptions=lambda w: transcription_files(claimed_tables()),  # the tables the claims are checked on
    output:
        md=report(paths.CLAIMS.format(ext="md"), caption="../report/claims.rst", category="papers",
                  subcategory="claims ledger"),
        json=paths.CLAIMS.format(ext="json"),
    log:
        "logs/claims.log",
    shell:
        "{PY} -m fedskew claims 2> {log}"


# A ledger of one's own: the claims of experiments/claims/<name>.yaml about suites of params.yaml or experiments/
# (docs/reproducing-papers.md, "Claims of your own"), judged on their runs as the papers' claims are on ours:
# `snakemake --cores all results/claims/<name>.md`; `all` builds every one. Its runs are trained for it (the
# suites' own, and those of the protocols it names on the same grid); a suite of `reproduce.imported` is imported.
@functools.cache
def own_claims_file(name):
    """The claims file experiments/claims/<name>.yaml, checked: a problem stops the workflow before any job."""
    try:
        return load_own_claims(CLAIMS_FOLDER / f"{name}.yaml", P)
    except ConfigError as error:
        raise WorkflowError(str(error)) from None


def own_ledgers():
    """The ledger of every claims file in experiments/claims/."""
    return [ledger_path(path, "md") for path in claims_files(CLAIMS_FOLDER)]


# The policy is code here, as for `compare` (rules/aggregate.smk): `all` builds these ledgers, and as an input
# the policy would look newer than a committed ledger on a fresh clone (git writes src/ after results/).
rule own_claims:
    input:
        claims=local(str(CLAIMS_FOLDER / "{name}.yaml")),
        runs=lambda w: run_files([cfg for cfg in own_claims_file(w.name).runs(P)
                                  if cfg.suite not in P.imported_suites]),
        imported=lambda w: imported_marks(own_claims_file(w.name).suites),
    output:
        md=LEDGER.format(name="{name}", ext="md"),
        json=LEDGER.format(name="{name}", ext="json"),
    log:
        "logs/claims/{name}.log",
    wildcard_constraints:
        name=r"[^/]+",
    shell:
        "{PY} -m fedskew claims --file {input.claims} 2> {log}"


def built_suite(suite):
    """Whether a suite's table, figures and partition heatmaps all exist (what its report entries need)."""
    needed = [paths.TABLE.format(suite=suite, ext="md"), paths.FIGURE_DIR.format(suite=suite)]
    needed += [paths.PARTITION_HEATMAP.format(dataset=d, partition=p, seed=s)
               for d, p, s in P.partitions_needed([suite])]
    return all(os.path.exists(f) for f in needed)


def built_reproduction():
    """The paper tables and the claims ledger, if they have been built (with the heatmaps of their suites)."""
    files = [paths.PAPER_TABLE.format(table=t, ext="md") for t in paper_table_ids()] + [paths.CLAIMS.format(ext="md")]
    heatmaps = [paths.PARTITION_HEATMAP.format(dataset=d, partition=p, seed=s)
                for d, p, s in P.partitions_needed(P.reproduce_suites)] if P.reproduce_suites else []
    return files if all(os.path.exists(f) for f in files + heatmaps) else []


# Everything for `snakemake --report results/report.html report_all`: the suites of `run.suites` (as `all`),
# every other suite of params.yaml whose table, figures and heatmaps exist, and the paper tables and the
# claims ledger once built. As a build target it brings exactly those up to date.
rule report_all:
    input:
        lambda w: tables(SUITES)
        + [paths.TABLE.format(suite=s, ext="md") for s in P.raw["suites"] if s not in SUITES and built_suite(s)]
        + built_reproduction(),
