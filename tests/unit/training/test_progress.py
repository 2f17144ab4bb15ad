"""chord.training.progress: the progress line's layout, its cadence, the time left from this
process's
iterations only (a resumed run counts from its resume point), and the records across a
roll-back."""

from __future__ import annotations

import json
import logging

import pytest

from chord.training import progress


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(tmp_path, clock, **kw):
    args = dict(scene="hop", stage="coarse", start=1, last=100, tier="split", attempt=1)
    args.update(kw)
    return progress.Progress(tmp_path, clock=clock, wall=clock, **args)


def run(p, clock, its, took):
    for it in its:
        clock.t += took
        p.step(it, {"sds": 0.5, "arap": 0.01, "ground": 0.0, "temporal": 0.0, "cfg": 5.0}, took)


def lines(caplog, tag=progress.TAG):
    out = []
    for rec in caplog.records:
        parsed = progress.parse_line(rec.getMessage())
        if parsed and parsed[0] == tag:
            out.append(parsed[1])
    return out


def test_a_line_parses_back_with_the_logs_prefix():
    text = progress.format_line(progress.TAG, {"scene": "a b", "it": "3/9", "sds": 0.012345678})
    assert text == "progress scene=a_b it=3/9 sds=0.01235"
    tag, fields = progress.parse_line(
        f"2026-12-04 10:00:00,000 INFO chord.training.progress: {text}"
    )
    assert (tag, fields) == ("progress", {"scene": "a_b", "it": "3/9", "sds": "0.01235"})
    assert progress.parse_line("INFO chord: no progress here") is None
    assert progress.hms(3 * 3600 + 62.4) == "3:01:02" and progress.hms(None) == "-"


def test_lines_come_every_every_s_seconds_and_after_the_last_iteration(tmp_path, caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="chord.training.progress")
    p = make(tmp_path, clock, last=100, every_s=60)
    run(p, clock, range(1, 101), 7.0)  # 7 s per iteration: a line each ceil(60 / 7) = 9
    its = [int(f["it"].split("/")[0]) for f in lines(caplog)]
    assert its[0] == 1 and its[-1] == 100
    gaps = {b - a for a, b in zip(its[:-2], its[1:-1], strict=True)}
    assert gaps == {9}
    assert all(list(f) == list(progress.FIELDS) for f in lines(caplog))


def test_an_iteration_slower_than_every_s_writes_a_line_each(tmp_path, caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="chord.training.progress")
    p = make(tmp_path, clock, last=5, every_s=60)
    run(p, clock, range(1, 6), 90.0)
    assert [f["it"] for f in lines(caplog)] == ["1/5", "2/5", "3/5", "4/5", "5/5"]


def test_the_time_left_counts_from_the_resume_point(tmp_path):
    clock = Clock()
    p = make(tmp_path, clock, start=501, last=1000)
    run(p, clock, range(501, 511), 2.0)  # ten iterations of 2 s in this process
    latest = json.loads((tmp_path / progress.LATEST).read_text())
    assert latest["it"] == 510 and latest["pct"] == 51.0
    assert latest["s_per_it"] == pytest.approx(2.0)  # not the elapsed time over 510
    assert latest["eta_s"] == pytest.approx(2.0 * 490)
    assert latest["eta"] == progress.hms(980) == "0:16:20"


def test_the_time_per_iteration_follows_the_recent_window(tmp_path):
    clock = Clock()
    p = make(tmp_path, clock, last=1000)
    run(p, clock, range(1, progress.WINDOW + 1), 10.0)
    run(p, clock, range(progress.WINDOW + 1, 2 * progress.WINDOW + 1), 2.0)
    assert p.latest["s_per_it"] == pytest.approx(2.0)
    assert p.slowest == 10.0


def test_a_rolled_back_span_is_marked_not_counted_twice(tmp_path, caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="chord.training.progress")
    p = make(tmp_path, clock, last=8, every_s=0)
    run(p, clock, range(1, 7), 1.0)
    p.event("rollback", 6, to=4)  # the newest checkpoint was iteration 4
    (event,) = [f for f in lines(caplog, progress.EVENT_TAG) if f["event"] == "rollback"]
    assert (event["it"], event["to"]) == ("6", "4")
    run(p, clock, range(5, 9), 1.0)
    p.finish(8)
    recs = progress.read_records(tmp_path / progress.JSONL)
    assert [r["it"] for r in recs if "event" not in r] == list(range(1, 9))
    marked = [json.loads(x) for x in (tmp_path / progress.JSONL).read_text().splitlines()]
    assert [r["it"] for r in marked if r.get("superseded") == "rollback"] == [5, 6]
    assert json.loads((tmp_path / progress.LATEST).read_text())["state"] == "done"
    # a later process resuming at 7 marks what the killed one logged past its checkpoint
    again = make(tmp_path, clock, start=7, last=8, every_s=0)
    run(again, clock, [7, 8], 1.0)
    recs = progress.read_records(tmp_path / progress.JSONL)
    assert [r["it"] for r in recs if "event" not in r] == list(range(1, 9))


EVENTS = [("sigterm", "stopped"), ("time_limit", "stopped"), ("failed", "failed"),
          ("float32", "running")]  # fmt: skip


@pytest.mark.parametrize(("kind", "state"), EVENTS)
def test_each_event_writes_its_line_and_state(tmp_path, caplog, kind, state):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="chord.training.progress")
    p = make(tmp_path, clock, last=8)
    run(p, clock, [1, 2], 1.0)
    p.event(kind, 2)
    assert [f["event"] for f in lines(caplog, progress.EVENT_TAG)] == ["start", kind]
    latest = json.loads((tmp_path / progress.LATEST).read_text())
    assert (latest["state"], latest["event"], latest["it"]) == (state, kind, 2)


def test_on_cuda_the_line_carries_the_peak_gpu_memory(tmp_path, caplog, monkeypatch):
    """The CUDA path of the training's gpu_peak_gb (torch.cuda faked: 61.2e9 bytes allocated at
    the peak) reaches the progress line as gigabytes; on the CPU the field is '-'."""
    import torch

    from chord.training import device_report

    assert device_report.gpu_peak_gb("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 61.2e9)
    caplog.set_level(logging.INFO, logger="chord.training.progress")
    clock = Clock()
    run(make(tmp_path / "gpu", clock, last=2, gpu_peak=device_report.gpu_peak_gb("cuda")), clock,
        [1, 2], 1.0)  # fmt: skip
    run(make(tmp_path / "cpu", clock, last=2, gpu_peak=device_report.gpu_peak_gb("cpu")), clock,
        [1, 2], 1.0)  # fmt: skip
    peaks = [f["gpu_peak_gb"] for f in lines(caplog)]
    assert peaks[0] == "61.2" and peaks[-1] == "-", peaks
