"""Pulse's test suite; the settings here hold for every test process."""

import os

# One thread per BLAS and OpenMP pool (numpy, the embedder, FAISS), in the test processes
# and in every server they start (which inherit the environment): the suite runs one
# test process per core already, and a pool sized to every core spins while it waits.
# Measured on two cores: two e5 recall tests took 19.2 CPU-seconds with the default
# pools, 3.9 with one thread each. (Here, since this runs before any conftest or test
# module: before anything imports numpy.)
for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")
