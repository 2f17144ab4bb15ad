"""The workflow tests' shared state."""

from __future__ import annotations

import pytest

from tests.workflow.test_scale import snakemake, tiny_workdir


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """hop run end to end once for every module that asks (test_scale, test_sources,
    test_result_keys: dry runs against it, and a debug run beside it, leave it finished);
    attempt 1 of its training runs out of memory on tier full."""
    work = tiny_workdir(tmp_path_factory.mktemp("scale"))
    proc = snakemake(work, env={"CHORD_TEST_OOM_TIERS": "full"})
    return work, proc.stdout + proc.stderr
