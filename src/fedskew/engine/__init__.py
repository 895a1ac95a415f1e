"""fedskew.engine: the simulation loop, client sampling, local training, aggregation, evaluation, checkpoints."""

# The engine's numerics version (the round loop, the client schedule, local training, aggregation, evaluation,
# for every method): raised when a change moves the bits every run computes (tests/fingerprints/), which gives
# every run a new id. A literal: run ids read it from this file without importing it (fedskew.discovery).
VERSION = 1
