"""The lakehouse settings at start-up (issue 10): with no object store at all, the embedded
catalog writes into the default local one (DATA_DIR/objects), readable by path with nothing else
running; and a bad lakehouse setting is refused before anything starts, naming what is wrong.
"""

import subprocess
import threading

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import EmbeddedTable, Sent, assert_no_problems, check_rows  # noqa: E402
from tiering_harness import SILT_BIN  # noqa: E402

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_without_an_object_store_the_table_is_in_the_local_one(lake):
    cfg = lake.config(topics=[{"match": "home/#", "lakehouse": "iceberg", "commit_interval_ms": 500,
                               "columns": {"t": "double"}}])
    node = lake.node(config=cfg, object_store=None)
    sent = [Sent(f"home/r{i % 3}", f'{{"t": {i / 2}, "i": {i}}}'.encode(), want={"t": i / 2}) for i in range(200)]
    assert all(rc == 0 for rc in lake.publisher(node, "home-pub").send(sent).values())
    table = EmbeddedTable(None, str(node.data_dir.resolve() / "objects" / "lakehouse" / "silt" / "home"))
    table.wait_count(len(sent), 120, node)
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, sent, columns=("t",), reader=reader))
    assert table.version_hint().isdigit()


def refusal(lake, name, topics=(), **sections):
    """silt's exit code and stderr for a config that should not start (fails at once if silt
    says it is running)."""
    cfg = lake.config(f"{name}.toml", topics=topics, **sections)
    proc = subprocess.Popen([SILT_BIN, "serve", "--config", str(cfg), "--data-dir", str(lake.data_dir(name)),
                             "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0",
                             "--admin", "127.0.0.1:0"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            text=True, errors="replace")
    timer = threading.Timer(60, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "silt is running" in line:
                proc.kill()
                raise AssertionError(f"{name}: silt started with this config:\n{''.join(lines)[-2000:]}")
        return proc.wait(10), "".join(lines)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


LAKE = {"match": "plant/#", "lakehouse": "iceberg"}


@pytest.mark.parametrize("name,topics,sections,named", [
    ("unknown-column-type", [{**LAKE, "columns": {"temp": "decimal"}}], {}, "temp"),
    ("unknown-table-format", [{"match": "plant/#", "lakehouse": "delta"}], {}, "lakehouse"),
    ("rest-without-uri", [LAKE], {"lakehouse": {"catalog": "rest", "warehouse": "s3://w/"}}, "catalog_uri"),
    ("unknown-catalog", [LAKE], {"lakehouse": {"catalog": "hive"}}, "catalog"),
    ("column-named-like-the-envelope", [{**LAKE, "columns": {"offset": "long"}}], {}, "offset"),
])
def test_a_bad_lakehouse_setting_is_refused_by_name(lake, name, topics, sections, named):
    code, err = refusal(lake, name, topics, **sections)
    assert code != 0, f"{name}: silt exited 0"
    assert named in err, f"{name}: the refusal does not name {named!r}:\n{err[-2000:]}"
