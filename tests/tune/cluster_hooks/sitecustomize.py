"""Imported by every Python process started with this directory on PYTHONPATH (the
`site` module does so): with PT_TEST_CLUSTER_FAULTS=1, the process gets the faults of
tests/tune/cluster_faults.py, so a worker's build and profiling processes misbehave."""
import os

if os.environ.get("PT_TEST_CLUSTER_FAULTS") == "1":
    from tests.tune.cluster_faults import misbehave_by_unroll
    misbehave_by_unroll()
