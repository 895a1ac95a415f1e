"""Where every artifact lives, relative to the project root (the folder of params.yaml).

The Snakefile builds its rule patterns from these templates and the CLI fills them in,
so the two can never disagree about a path.
"""

RAW_DIR = "data/raw/{dataset}"
RAW_READY = RAW_DIR + "/READY.json"
PARTITION = "data/partitions/{dataset}/{partition}/seed{seed}.npz"
PARTITION_JSON = "data/partitions/{dataset}/{partition}/seed{seed}.json"
PARTITION_HEATMAP = "data/partitions/{dataset}/{partition}/seed{seed}.png"
SUITE_RUNS = "results/runs/{suite}"
RUN_DIR = SUITE_RUNS + "/{dataset}/{partition}/{method}/seed{seed}"
RUN_METRICS = RUN_DIR + "/metrics.json"
RUN_HISTORY = RUN_DIR + "/history.csv"
RUN_CONFIG = RUN_DIR + "/config.yaml"
CHECKPOINT_DIR = "results/checkpoints/{suite}/{dataset}/{partition}/{method}/seed{seed}"
TABLE = "results/tables/{suite}.{ext}"
# Which run each cell of a suite's tables reads: its run id by grid point (`python -m fedskew runs`).
RUN_INDEX = "results/tables/runs/{suite}.csv"
# Each method of a suite against its baseline, paired by seed (`python -m fedskew compare`).
COMPARISON = "results/tables/compare/{suite}.{ext}"
FIGURE_DIR = "results/figures/{suite}"
PAPER_TABLE = "results/papers/{table}.{ext}"
CLAIMS = "results/claims.{ext}"
# Runs trained elsewhere (a GPU) for a suite of `reproduce.imported`: the committed `packed ship`
# archives, and the mark that they are imported into results/runs/.
IMPORTED_ARCHIVES = "results/imported/{suite}"
# The runs behind a trained suite's committed tables (results/committed-runs/README.md).
COMMITTED_RUNS = "results/committed-runs/{suite}"
IMPORTED = "results/runs/{suite}/IMPORTED"
