"""bench/mutation.py without cosmic-ray: its table names modules and tests that exist, and its
filter leaves out the mutants that change nothing that runs."""

from __future__ import annotations

import ast

from bench import mutation
from tests.conftest import REPO


def test_every_target_names_its_module_and_tests_that_exist():
    for name, target in mutation.TARGETS.items():
        module = REPO / target.module
        assert module.is_file(), name
        tree = ast.parse(module.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {
            t.id
            for n in tree.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        assert set(target.only) <= defined, name
        for test in target.tests:
            path, _, function = test.partition("::")
            assert (REPO / path).is_file(), test
            assert not function or f"def {function}(" in (REPO / path).read_text(), test


SOURCE = """from __future__ import annotations
import logging
logger = logging.getLogger(__name__)
LIMIT: int | None = 3


def f(a: int | None, *, b: float = 1.0) -> int | None:
    logger.info("a %d", a + 1)
    return a * 2


def g(x, /, y):
    return x / y
"""


def test_mutants_in_annotations_log_calls_and_parameter_markers_are_left_out():
    skipped = mutation.not_run(SOURCE, ())
    lines = SOURCE.splitlines()

    def at(line, text, nth=0):
        col = -1
        for _ in range(nth + 1):
            col = lines[line - 1].index(text, col + 1)
        return skipped(line, col)

    assert at(4, "|") and not at(4, "3")  # LIMIT's annotation; its value runs
    assert at(7, "|") and at(7, "*") and at(7, "|", nth=1) and not at(7, "1.0")
    assert at(8, "+")  # only the log message changes
    assert not at(9, "*") and not at(13, "/")
    assert at(12, "/")
    only = mutation.not_run(SOURCE, ("g",))
    assert only(13, lines[12].index("/")) is False and only(9, lines[8].index("*")) is True
