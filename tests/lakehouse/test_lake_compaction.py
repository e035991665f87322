"""Small files (issue 10): frequent commits leave many small data files; background compaction
replaces them with fewer, larger ones without changing a row, and snapshot expiry then drops old
snapshots and deletes the data files nothing references any more.
"""

import json
import re

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import Sent, assert_no_problems, check_rows, wait_until  # noqa: E402

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WAVES = 12


def config(lake, **lakehouse):
    return lake.config(lakehouse=lakehouse, topics=[
        {"match": "burst/#", "lakehouse": "iceberg", "commit_interval_ms": 500, "columns": {"n": "long"}}])


def publish_in_waves(lake, node, waves=WAVES, per_wave=100):
    """One commit per wave at least: each wave waits for a new `lakehouse commit` line."""
    sent = []
    pub = lake.publisher(node, "burst-pub")
    for w in range(waves):
        before = len(node.commits("burst"))
        wave = [Sent(f"burst/s{i % 3}", json.dumps({"n": w * per_wave + i, "w": w}).encode(),
                     want={"n": w * per_wave + i}) for i in range(per_wave)]
        assert all(rc == 0 for rc in pub.send(wave).values())
        sent += wave
        node.wait_commits("burst", before + 1, 60)
    return sent


def key_set(rows):
    return sorted((r["stream"], r["partition"], r["offset"], r["payload"]) for r in rows)


def compactions(node):
    out = []
    for line in node.lines(r"lakehouse compaction\b"):
        if re.search(r"\btable=\"?burst\"?(\s|$)", line):
            m = re.search(r"files_before=(\d+).*files_after=(\d+)", line)
            out.append((int(m.group(1)), int(m.group(2))) if m else line)
    return out


def test_compaction_leaves_the_rows_identical_and_the_files_fewer(lake):
    node = lake.node(config=config(lake, compaction_interval_ms=8000))
    table = lake.embedded("burst")
    sent = publish_in_waves(lake, node)
    table.wait_count(len(sent), 120, node)

    # Once the appends stop, the next compaction makes a replace snapshot the current one; its
    # parent is the table as the appends left it.
    def replaced():
        snap = table.py_table().current_snapshot()
        return snap if snap.summary.operation.value == "replace" else None
    snap = wait_until(replaced, 60, interval=0.5, what="a replace snapshot (compaction) after the appends")
    t = table.py_table()
    parent = snap.parent_snapshot_id
    assert parent is not None and t.snapshot_by_id(parent).summary.operation.value == "append"
    files_before = table.data_files(parent)
    files_after = table.data_files()
    print(f"data files {len(files_before)} -> {len(files_after)}; compaction lines {compactions(node)}")
    assert len(files_before) >= 3, f"only {len(files_before)} data files before compaction"
    assert len(files_after) < len(files_before)

    rows_before = table.py_rows(snapshot_id=parent)
    rows_after = table.py_rows()
    assert key_set(rows_after) == key_set(rows_before)
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", rows_after)):
        assert_no_problems(check_rows(rows, sent, columns=("n",), reader=reader))
        assert key_set(rows) == key_set(rows_before)

    logged = [c for c in compactions(node) if isinstance(c, tuple)]
    assert logged, f"no 'lakehouse compaction table=burst files_before= files_after=' line: {compactions(node)}"
    assert logged[-1] == (len(files_before), len(files_after)), (logged, len(files_before), len(files_after))
    assert json.loads(t.current_snapshot().summary.additional_properties["silt.offsets"]) == \
        json.loads(t.snapshot_by_id(parent).summary.additional_properties["silt.offsets"])


def test_expiry_drops_old_snapshots_and_deletes_unreferenced_files(lake):
    node = lake.node(config=config(lake, compaction_interval_ms=3000, snapshot_max_age_ms=1000,
                                   min_snapshots_to_keep=1))
    table = lake.embedded("burst")
    sent = publish_in_waves(lake, node, waves=8)
    table.wait_count(len(sent), 120, node)

    def settled():
        t = table.py_table()
        live = {f["file_path"] for f in table.data_files()}
        stored = {f"s3://{table.bucket}/{k}" for k in table.objects("data/")}
        snaps = t.metadata.snapshots
        return (t.current_snapshot().summary.operation.value == "replace" and len(snaps) <= 2
                and stored == live) and (len(snaps), len(live), len(stored))
    state = {}

    def progress():
        t = table.py_table()
        state.update(snapshots=len(t.metadata.snapshots), live=len(table.data_files()),
                     stored=len(table.objects("data/")), op=t.current_snapshot().summary.operation.value)
        return settled()
    try:
        wait_until(progress, 90, interval=1, what="compaction, expiry and the deletion of unreferenced files")
    except AssertionError as e:
        raise AssertionError(f"{e}; last state {state}") from None
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, sent, columns=("n",), reader=reader))
