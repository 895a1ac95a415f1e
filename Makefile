# The two set-up commands of the README. Each builds (or reuses) the environment first.
.PHONY: env run test

env:
	@bash scripts/env.sh

# Rebuild the default results: snakemake --cores all (suites listed in params.yaml run.suites).
run: env
	.venv/bin/snakemake --cores all

# The whole test suite (unit + integration), on offline data.
test: env
	.venv/bin/python -m pytest
