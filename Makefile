# The two set-up commands of the README (run, test), and the everyday ones. Each builds (or reuses)
# the environment first: Python packages only, which is all the default suite needs.
.PHONY: env system-packages run verify test test-fast cluster-test reproduce report ui

SUITE ?= default

env:
	@bash scripts/env.sh

# The OS packages that hold datasets, apart from the environment because only some suites and tests
# read them: Debian's dataset-fashion-mnist (Fashion-MNIST's official files, about 30 MB), for the
# suites that train on Fashion-MNIST and the tests that read the real files. Installed with apt-get
# where that runs as root, after a line saying what and why; elsewhere one line says what to run.
# Silent where it is installed. Never fails: without it those tests are skipped and say why.
system-packages:
	@bash scripts/system-packages.sh

# Build run.suites of params.yaml (the default suite): train the runs that are missing (all of them on a
# fresh clone), rebuild their tables and figures, then say in one line whether every rebuilt table is
# identical to the committed one (cells that differ are listed). Exit 1 when one differs.
run: env
	.venv/bin/python -m fedskew run

# The same proof for any suite, from its seeds, in a scratch project (.verify/<suite>/): never writes
# into results/. `make verify SUITE=fedlc_t4_synthetic`. METHODS="..." and SEEDS="..." retrain only those
# runs, beside the suite's committed ones, and compare each with its committed files.
verify: env
	.venv/bin/python -m fedskew verify --suite $(SUITE) $(if $(METHODS),--method $(METHODS)) \
		$(if $(SEEDS),--seed $(SEEDS))

# The whole test suite (unit + integration), on offline data. pyproject's addopts leave out the soak
# and cluster tests. pytest-xdist runs one worker a physical core, and idle workers take tests from busy
# ones (worksteal), so the few minute-long workflow tests do not wait in one queue. Every test keeps to
# its own temporary folder; `python -m pytest` alone runs them one after another.
test: env system-packages
	.venv/bin/python -m pytest -n auto --dist worksteal

# The tests to run while working, run as `make test` runs them: the unit tests and the fingerprints
# (tests/unit, tests/fingerprints), 2 to 4 minutes on 2 cores. It leaves out the tiers that drive Snakemake,
# DVC, MLflow servers and training jobs as child processes (tests/integration, tests/reliability, the cluster
# smoke test): most of `make test`'s time, even without their `slow` tests. `make test` before a commit.
test-fast: env system-packages
	.venv/bin/python -m pytest -n auto --dist worksteal -m "not slow and not soak and not cluster" tests/unit tests/fingerprints

# The cluster path for real (docs/cluster.md): a one-node SLURM, an MLflow server and a DVC remote on
# this machine, the default suite end to end and three faults. Root; installs Debian's SLURM packages.
cluster-test: env
	.venv/bin/python -m pytest -m cluster tests/cluster

# The papers' tables beside ours and the claims ledger (results/papers/, results/claims.md): trains the
# suites under reproduce.suites in params.yaml (about 13 hours on 2 cores, of which FL-FCR's MNIST rows about
# 6.7 and its Adult rows with Adam and with SGD about 3.6; every other cell reads "not run"). Ctrl-C or SIGTERM
# stops Snakemake and its jobs; `make reproduce` again resumes.
reproduce: env
	.venv/bin/python -m fedskew reproduce

# One HTML page with the tables, figures and partition heatmaps (builds what is missing first).
report: run
	.venv/bin/snakemake --cores all --report results/report.html

# mlflow ui on the project's store, with a link to each suite's runs table in the UI's Model training mode.
ui: env
	.venv/bin/python -m fedskew ui
