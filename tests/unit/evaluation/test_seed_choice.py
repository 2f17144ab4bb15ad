"""chord.evaluation.seed_choice: the seed a sweep's rule chooses from the seeds' metrics (no
torch)."""

from __future__ import annotations

import pytest

from chord.core.errors import InputError
from chord.evaluation.seed_choice import choose


def docs(values: dict[int, float | None], still=()) -> dict[int, dict]:
    return {s: {"arap": v, "static_warning": s in still, "iteration": 1} for s, v in values.items()}


@pytest.mark.parametrize(("mode", "best"), [("min", 2), ("max", 0)])
def test_the_least_or_most_of_the_metric(mode, best):
    c = choose(docs({0: 0.3, 1: 0.2, 2: 0.1}), metric="arap", mode=mode, require_moved=True)
    assert c.seed == best
    assert c.value == {0: 0.3, 2: 0.1}[best]
    assert c.values == {0: 0.3, 1: 0.2, 2: 0.1}


def test_seeds_that_did_not_move_are_left_out_unless_none_moved():
    d = docs({0: 0.3, 1: 0.2, 2: 0.1}, still=(2,))
    moved = choose(d, metric="arap", mode="min", require_moved=True)
    assert moved.seed == 1 and "seeds [2] did not move" in moved.reason
    assert choose(d, metric="arap", mode="min", require_moved=False).seed == 2
    none = choose(docs({0: 0.3, 1: 0.2}, still=(0, 1)), metric="arap", mode="min",
                  require_moved=True)  # fmt: skip
    assert none.seed == 1 and "none of the seeds moved" in none.reason


def test_a_tie_goes_to_the_lowest_seed_and_a_missing_value_is_never_chosen():
    assert choose(docs({4: 0.1, 2: 0.1, 3: 0.5}), metric="arap", mode="min",
                  require_moved=True).seed == 2  # fmt: skip
    assert choose(docs({0: None, 1: 0.9}), metric="arap", mode="min",
                  require_moved=True).seed == 1  # fmt: skip
    assert choose(docs({0: float("nan"), 1: 0.9}), metric="arap", mode="max",
                  require_moved=True).seed == 1  # fmt: skip


def test_bad_metrics_name_the_file_and_the_key():
    where = {0: "r/toy/seed_0/metrics.json", 1: "r/toy/seed_1/metrics.json"}
    with pytest.raises(InputError, match=r"seed_0/metrics.json: sweep.metric: 'nope' is not .*"
                       r"numeric metrics: arap, iteration"):  # fmt: skip
        choose(docs({0: 1.0, 1: 2.0}), metric="nope", mode="min", require_moved=True, where=where)
    with pytest.raises(InputError, match="'static_warning' is False, not a number"):
        choose(docs({0: 1.0}), metric="static_warning", mode="min", require_moved=True)
    with pytest.raises(InputError, match="no seed has a value of 'arap'"):
        choose(docs({0: None, 1: None}), metric="arap", mode="min", require_moved=True)
