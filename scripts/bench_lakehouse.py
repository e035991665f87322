"""The lakehouse benchmark's driver (run by scripts/bench-lakehouse.sh, which builds Silt and the
venv first): Silt's Iceberg table writer measured beside pyarrow writing the same rows, in one
run, printing Markdown tables.

Phases, each on a fresh `silt serve` (stopped by PID; scratch space is a fresh directory):

1. fill: PUBLISHERS raw-socket MQTT 3.1.1 publishers (this file's `publish`, QoS 1, WINDOW in
   flight each) send ROWS JSON payloads `{"temp":..,"unit":"C","seq":..}` to `bench/devI/temp`
   with no lakehouse table configured: the ingest reference (msgs/s, silt CPU per message).
2. drain: the same data directory restarted with the table on: the writer reads the whole
   backlog from offset 0 and commits back to back (max_rows_per_commit rows each). Rows/s,
   MB/s and silt CPU per row from "lakehouse table writer started" to the commit that holds the
   last row: the table writer alone, nothing else running.
3. pyarrow: the same rows (read back from phase 2's data files) written again to Parquet with
   the same settings (zstd level 1, row groups of 1 Mi rows): encoding alone, and JSON payload
   parsing (pyarrow.json) plus encoding; the median of 3, CPU per row from process CPU time.
4. live: a fresh node with the table on and the same publishers at full speed: ingest and table
   at once (silt CPU per row from the first publish to the last commit).
5. freshness: a fresh node, default commit interval (10 s), one publisher paced at RATE msgs/s
   for FRESH_S seconds; a watcher process stats metadata/version-hint.text every 10 ms and on
   each change asks DuckDB (iceberg_scan) for count(*) and max(seq). Freshness of a message is
   the time from its PUBACK to the end of the first DuckDB query that returns it. Data files per
   hour are extrapolated from this phase.
6. compaction: phase 5's node restarted with compaction_interval_ms = 1000; data files and their
   average size in the snapshot before and after the replace snapshot (pyiceberg manifests).

Internal subcommands (`publish`, `watch`) are the child processes of phases 1, 4 and 5.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TABLE = "bench"
COLUMNS = '{ temp = "double", unit = "string", seq = "long" }'


# --- MQTT publisher (child process) ------------------------------------------------------------

def varint(n):
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def payload(seq):
    t = 2000 + (seq * 7919) % 1500  # hundredths of a degree, 20.00 .. 34.99
    return b'{"temp":%d.%02d,"unit":"C","seq":%d}' % (t // 100, t % 100, seq)


def connect(port, client_id):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    s.sendall(b"\x10" + varint(len(var)) + var)
    got = b""
    while len(got) < 4:
        chunk = s.recv(4 - len(got))
        if not chunk:
            raise SystemExit("connection closed before CONNACK")
        got += chunk
    if got != b"\x20\x02\x00\x00":
        raise SystemExit(f"CONNACK refused: {got!r}")
    return s


def publish(a):
    """QoS 1 publishes of seq a.first .. a.first+a.count-1 on one connection, WINDOW in flight;
    paced at a.rate msgs/s when given. Prints one JSON line; with --acks, writes every seq's
    PUBACK time (time.monotonic(), comparable across processes) as doubles."""
    s = connect(a.port, a.client_id)
    topic = a.topic.encode()
    th = len(topic).to_bytes(2, "big") + topic
    end = a.first + a.count
    seq, acked, inflight, pid, payload_bytes = a.first, 0, 0, 0, 0
    pid_seq = [0] * 65536
    acks = array.array("d", bytes(8 * a.count)) if a.acks else None
    buf = b""
    delay = a.go - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    cpu0, t0 = time.process_time(), time.monotonic()
    while acked < a.count:
        due = end if not a.rate else min(end, a.first + int((time.monotonic() - t0) * a.rate) + 1)
        out = []
        while inflight < a.window and seq < due:
            p = payload(seq)
            pid = pid % 65535 + 1
            pid_seq[pid] = seq
            out.append(b"\x32" + varint(len(th) + 2 + len(p)) + th + pid.to_bytes(2, "big") + p)
            payload_bytes += len(p)
            seq += 1
            inflight += 1
        if out:
            s.sendall(b"".join(out))
        timeout = None
        if a.rate and seq < end and inflight < a.window:
            timeout = max(0.0, t0 + (seq - a.first) / a.rate - time.monotonic())
        r, _, _ = select.select([s], [], [], timeout)
        if not r:
            continue
        data = s.recv(1 << 16)
        if not data:
            raise SystemExit(f"connection closed after {acked} PUBACKs")
        now = time.monotonic()
        buf += data
        n = len(buf) // 4
        for i in range(n):
            if buf[4 * i] != 0x40:
                raise SystemExit(f"unexpected packet type {buf[4 * i]:#x}")
            if acks is not None:
                acks[pid_seq[int.from_bytes(buf[4 * i + 2:4 * i + 4], "big")] - a.first] = now
        buf = buf[4 * n:]
        acked += n
        inflight -= n
    t1 = time.monotonic()
    s.sendall(b"\xe0\x00")
    s.close()
    if acks is not None:
        Path(a.acks).write_bytes(acks.tobytes())
    print(json.dumps({"sent": a.count, "payload_bytes": payload_bytes, "t0": t0, "t1": t1,
                      "cpu": time.process_time() - cpu0}), flush=True)


# --- DuckDB watcher (child process) ------------------------------------------------------------

def duckdb_connect():
    sys.path.insert(0, str(ROOT / "tests" / "lakehouse"))
    from lakehouse_harness import duckdb_connect as connect_
    return connect_()


def watch(a):
    """Until a.stop exists: on every change of version-hint.text, DuckDB's count(*) and max(seq)
    of the table; one JSON line per query (t: when its answer came, q: its duration)."""
    con = duckdb_connect()
    con.execute("SET enable_external_file_cache = false")
    hint = Path(a.table, "metadata", "version-hint.text")
    last = None
    sql = f"SELECT count(*), max(seq) FROM iceberg_scan('{a.table}')"
    while not Path(a.stop).exists():
        try:
            v = hint.read_bytes()
        except FileNotFoundError:
            v = None
        if v is not None and v != last:
            last = v
            q0 = time.monotonic()
            count, top = con.execute(sql).fetchone()
            q1 = time.monotonic()
            print(json.dumps({"t": q1, "q": q1 - q0, "version": v.decode(), "count": count, "max": top}),
                  flush=True)
        time.sleep(0.01)


# --- the node -----------------------------------------------------------------------------------

class Node:
    """`silt serve` on a data directory, its log followed by a thread that notes when each line
    appeared and the process's CPU time then."""

    def __init__(self, silt, work, name, data_dir, config):
        self.log_path = Path(work, f"{name}.log")
        cfg = Path(work, f"{name}.toml")
        cfg.write_text(config)
        env = dict(os.environ, NO_COLOR="1", SILT_LOG="info")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([silt, "serve", "--config", str(cfg), "--data-dir", str(data_dir),
                                      "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
                                     stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        self.pid = self.proc.pid
        self.data_dir = Path(data_dir)
        self.lines = []  # (monotonic time seen, cpu seconds then, line)
        self.lock = threading.Lock()
        self.done = False
        self.follower = threading.Thread(target=self._follow, daemon=True)
        self.follower.start()
        m = self.wait_line(r"silt is running.*mqtt=127\.0\.0\.1:(\d+)", 60)
        self.port = int(m.group(1))

    def cpu(self):
        """utime + stime of every thread of the process (s), from /proc/PID/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def _follow(self):
        with open(self.log_path, "rb") as f:
            pending = b""
            while not self.done:
                chunk = f.read()
                if not chunk:
                    time.sleep(0.005)
                    continue
                now = time.monotonic()
                try:
                    cpu = self.cpu()
                except (FileNotFoundError, ProcessLookupError):
                    cpu = None
                pending += chunk
                *whole, pending = pending.split(b"\n")
                with self.lock:
                    self.lines += [(now, cpu, ANSI.sub("", w.decode(errors="replace"))) for w in whole]

    def matching(self, pattern):
        rx = re.compile(pattern)
        with self.lock:
            return [(t, c, rx.search(line)) for t, c, line in self.lines if rx.search(line)]

    def wait_line(self, pattern, timeout, count=1):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.matching(pattern)
            if len(got) >= count:
                return got[count - 1][2]
            if self.proc.poll() is not None:
                raise SystemExit(f"silt exited ({self.proc.returncode}); log {self.log_path}:\n{self.tail()}")
            time.sleep(0.02)
        raise SystemExit(f"no {pattern!r} in {timeout} s; log {self.log_path}:\n{self.tail()}")

    def tail(self, n=20):
        with self.lock:
            return "\n".join(line for _, _, line in self.lines[-n:])

    def commits(self):
        """[(time seen, silt CPU then, rows)] of this node's commits of the bench table."""
        return [(t, c, int(m.group(1))) for t, c, m in
                self.matching(rf"lakehouse commit\b.*table=\"?{TABLE}\"?\s.*rows=(\d+)")]

    def wait_rows(self, rows, timeout):
        """Waits until this node's commits hold `rows` rows; the commit line that got there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            total = 0
            for c in self.commits():
                total += c[2]
                if total >= rows:
                    return c
            if self.proc.poll() is not None:
                raise SystemExit(f"silt exited ({self.proc.returncode}); log {self.log_path}:\n{self.tail()}")
            time.sleep(0.01)
        raise SystemExit(f"the table did not reach {rows} rows in {timeout} s "
                         f"(committed {sum(c[2] for c in self.commits())}); log {self.log_path}:\n{self.tail()}")

    def problems(self):
        return [m.group(0) for _, _, m in self.matching(r".*(panicked|ERROR|WARN).*")]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.05)
        self.done = True
        self.follower.join(2)
        self.log.close()


def config(lakehouse, compaction_interval_ms=None):
    lines = []
    if compaction_interval_ms is not None:
        lines += ["[lakehouse]", f"compaction_interval_ms = {compaction_interval_ms}", ""]
    lines += ["[[topics]]", 'match = "bench/#"']
    if lakehouse:
        lines += ['lakehouse = "iceberg"', "commit_interval_ms = 10000", f"columns = {COLUMNS}"]
    return "\n".join(lines) + "\n"


def table_dir(data_dir):
    return Path(data_dir, "objects", "lakehouse", "silt", TABLE)


# --- the publishers, from the parent ----------------------------------------------------------

def run_publishers(node, work, publishers, rows, window, rate=0, acks=False, tag="pub"):
    """Starts `publishers` child processes splitting `rows`; returns their results, the silt CPU
    at the common start and the start time."""
    per = [rows // publishers + (1 if i < rows % publishers else 0) for i in range(publishers)]
    go = time.monotonic() + 1.5
    procs, first = [], 0
    for i, n in enumerate(per):
        cmd = [sys.executable, __file__, "publish", "--port", str(node.port), "--client-id", f"{tag}{i}",
               "--topic", f"bench/dev{i}/temp", "--first", str(first), "--count", str(n),
               "--window", str(window), "--rate", str(rate / publishers if rate else 0), "--go", repr(go)]
        if acks:
            cmd += ["--acks", str(Path(work, f"{tag}{i}.acks"))]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        first += n
    while time.monotonic() < go:
        time.sleep(0.001)
    cpu0 = node.cpu()
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"publisher failed ({p.returncode})")
        results.append(json.loads(out))
    return results, cpu0, go


def summarize_publish(results):
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    sent = sum(r["sent"] for r in results)
    return {"sent": sent, "payload_bytes": sum(r["payload_bytes"] for r in results), "t0": t0, "t1": t1,
            "rate": sent / (t1 - t0), "pub_cpu": sum(r["cpu"] for r in results)}


# --- table inspection ---------------------------------------------------------------------------

def static_table(data_dir):
    from pyiceberg.table import StaticTable
    return StaticTable.from_metadata(str(table_dir(data_dir)))


def data_files(t, snapshot_id=None):
    return t.inspect.data_files(snapshot_id=snapshot_id).select(
        ["file_path", "record_count", "file_size_in_bytes"]).to_pylist()


def duck_check(data_dir, rows):
    """DuckDB's count, distinct seqs and min/max seq of the table (every row once?)."""
    con = duckdb_connect()
    try:
        return con.execute(f"SELECT count(*), count(DISTINCT seq), min(seq), max(seq), count(temp), "
                           f"count(unit) FROM iceberg_scan('{table_dir(data_dir)}')").fetchone()
    finally:
        con.close()


def column_bytes(paths):
    """Compressed bytes per column over the row groups of `paths`."""
    import pyarrow.parquet as pq
    out = {}
    for p in paths:
        md = pq.ParquetFile(p).metadata
        for rg in range(md.num_row_groups):
            g = md.row_group(rg)
            for c in range(g.num_columns):
                col = g.column(c)
                name = col.path_in_schema.split(".")[0]
                out[name] = out.get(name, 0) + col.total_compressed_size
    return out


def metadata_sizes(data_dir):
    """{version: bytes} of the table's vN.metadata.json files, and the bytes of all metadata."""
    d = Path(table_dir(data_dir), "metadata")
    versions = {int(p.name[1:-len(".metadata.json")]): p.stat().st_size for p in d.glob("v*.metadata.json")}
    return {"versions": versions, "total": sum(p.stat().st_size for p in d.iterdir())}


def local_path(uri):
    return uri.removeprefix("file://")


# --- pyarrow reference --------------------------------------------------------------------------

def pyarrow_reference(paths, work, repeats=3):
    """The rows of `paths` written again to Parquet as Silt writes them (zstd level 1, 1 Mi-row
    row groups): encoding alone, and pyarrow.json parsing of the payloads plus encoding."""
    import io
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq
    table = pa.concat_tables([pq.read_table(p) for p in paths])
    n = table.num_rows
    out = Path(work, "pyarrow.parquet")
    opts = dict(compression="zstd", compression_level=1, row_group_size=1 << 20)
    schema = pa.schema([("temp", pa.float64()), ("unit", pa.string()), ("seq", pa.int64())])
    envelope = table.drop_columns(["temp", "unit", "seq"])
    lines = b"\n".join(table.column("payload").to_pylist())

    def encode():
        pq.write_table(table, out, **opts)

    def parse_encode():
        parsed = pj.read_json(io.BytesIO(lines), parse_options=pj.ParseOptions(explicit_schema=schema))
        t = envelope
        for name in ("temp", "unit", "seq"):
            t = t.append_column(name, parsed.column(name))
        pq.write_table(t, out, **opts)

    res = {}
    for name, fn in (("encode", encode), ("parse_encode", parse_encode)):
        runs = []
        for _ in range(repeats):
            c0, t0 = time.process_time(), time.monotonic()
            fn()
            runs.append((time.monotonic() - t0, time.process_time() - c0))
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        res[name] = {"rows": n, "rows_s": n / wall, "cpu_us_row": cpu / n * 1e6, "bytes": out.stat().st_size,
                     "mb_s": out.stat().st_size / wall / 1e6}
    out.unlink()
    return res


# --- phases -------------------------------------------------------------------------------------

def phase_fill_and_drain(a, work):
    data = Path(work, "backlog")
    node = Node(a.silt, work, "fill", data, config(lakehouse=False))
    try:
        results, cpu0, _ = run_publishers(node, work, a.publishers, a.rows, a.window, tag="fill")
        cpu1 = node.cpu()
    finally:
        node.stop()
    fill = summarize_publish(results)
    fill["silt_cpu_us_msg"] = (cpu1 - cpu0) / fill["sent"] * 1e6
    fill["silt_cores"] = (cpu1 - cpu0) / (fill["t1"] - fill["t0"])
    fill["pub_cores"] = fill["pub_cpu"] / (fill["t1"] - fill["t0"])
    print(f"fill: {fill}", file=sys.stderr)

    node = Node(a.silt, work, "drain", data, config(lakehouse=True))
    try:
        start = node.matching(r"lakehouse table writer started")
        if not start:
            node.wait_line(r"lakehouse table writer started", 30)
            start = node.matching(r"lakehouse table writer started")
        t_start, cpu_start, _ = start[0]
        t_end, cpu_end, _ = node.wait_rows(a.rows, 600)
        commits = node.commits()
        problems = node.problems()
    finally:
        node.stop()
    t = static_table(data)
    files = data_files(t)
    parquet = sum(f["file_size_in_bytes"] for f in files)
    wall = t_end - t_start
    drain = {"rows": sum(f["record_count"] for f in files), "commits": len(commits), "files": len(files),
             "wall": wall, "rows_s": a.rows / wall, "parquet_bytes": parquet, "parquet_mb_s": parquet / wall / 1e6,
             "payload_mb_s": fill["payload_bytes"] / wall / 1e6, "cpu_us_row": (cpu_end - cpu_start) / a.rows * 1e6,
             "cores": (cpu_end - cpu_start) / wall, "problems": problems,
             "check": duck_check(data, a.rows), "columns": column_bytes([local_path(f["file_path"]) for f in files])}
    print(f"drain: { {k: v for k, v in drain.items() if k != 'columns'} }", file=sys.stderr)
    ref = pyarrow_reference([local_path(f["file_path"]) for f in files], work)
    print(f"pyarrow: {ref}", file=sys.stderr)
    return fill, drain, ref


def phase_live(a, work):
    data = Path(work, "live")
    node = Node(a.silt, work, "live", data, config(lakehouse=True))
    try:
        results, cpu0, _ = run_publishers(node, work, a.publishers, a.rows, a.window, tag="live")
        cpu_pub_end = node.cpu()
        t_end, cpu_end, _ = node.wait_rows(a.rows, 600)
        problems = node.problems()
    finally:
        node.stop()
    live = summarize_publish(results)
    live["silt_cpu_us_msg_publishing"] = (cpu_pub_end - cpu0) / live["sent"] * 1e6
    live["silt_cpu_us_row"] = (cpu_end - cpu0) / live["sent"] * 1e6
    live["table_done_after_last_puback"] = t_end - live["t1"]
    live["pub_cores"] = live["pub_cpu"] / (live["t1"] - live["t0"])
    live["silt_cores"] = (cpu_pub_end - cpu0) / (live["t1"] - live["t0"])
    live["problems"] = problems
    live["check"] = duck_check(data, a.rows)
    print(f"live: {live}", file=sys.stderr)
    return live


def phase_ceiling(a, work):
    """silt-loadgen's QoS 1 fan-in (50 publishers, one subscriber, binary payloads of the JSON
    rows' size) with the table off: what the broker ingests from a faster generator."""
    data = Path(work, "ceiling")
    node = Node(a.silt, work, "ceiling", data, config(lakehouse=False))
    try:
        out = subprocess.run([a.loadgen, "fan-in", "--addr", f"127.0.0.1:{node.port}", "--broker", "silt",
                              "--broker-pid", str(node.pid), "--publishers", "50", "--qos", "1",
                              "--duration", "10", "--payload", "40"], capture_output=True, text=True, check=True)
    finally:
        node.stop()
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"ceiling: {r}", file=sys.stderr)
    return r


def percentile(sorted_xs, q):
    if not sorted_xs:
        return float("nan")
    i = min(len(sorted_xs) - 1, max(0, int(round(q / 100 * len(sorted_xs) + 0.5)) - 1))
    return sorted_xs[i]


def phase_fresh_and_compact(a, work):
    data = Path(work, "fresh")
    rows = int(a.rate * a.fresh_s)
    node = Node(a.silt, work, "fresh", data, config(lakehouse=True))
    stop = Path(work, "watch.stop")
    watcher = subprocess.Popen([sys.executable, __file__, "watch", "--table", str(table_dir(data)),
                                "--stop", str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        results, cpu0, go = run_publishers(node, work, 1, rows, a.window, rate=a.rate, acks=True, tag="fresh")
        cpu_pub_end = node.cpu()
        node.wait_rows(rows, 60)
        time.sleep(0.5)  # the watcher sees the last version
        stop.touch()
        out, _ = watcher.communicate(timeout=30)
        problems = node.problems()
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        node.stop()
    pub = summarize_publish(results)
    acks = array.array("d")
    acks.frombytes(Path(work, "fresh0.acks").read_bytes())
    seen = [json.loads(line) for line in out.splitlines() if line.strip()]
    fresh, i = [], 0
    for s in seen:
        top = s["max"] if s["max"] is not None else -1
        assert s["count"] == top + 1, f"DuckDB saw {s['count']} rows up to seq {top}: a gap or a duplicate"
        while i <= top and i < rows:
            fresh.append(s["t"] - acks[i])
            i += 1
    assert i == rows, f"DuckDB saw {i} of {rows} rows"
    fresh.sort()
    duration = pub["t1"] - pub["t0"]
    t = static_table(data)
    files_before = data_files(t)
    meta = metadata_sizes(data)
    commit_lines = node.commits()
    commits = len(commit_lines)
    gaps = [b[0] - a_[0] for a_, b in zip(commit_lines, commit_lines[1:])]
    f = {"rows": rows, "rate": pub["rate"], "duration": duration, "p50": percentile(fresh, 50),
         "p99": percentile(fresh, 99), "max": fresh[-1], "min": fresh[0],
         "queries": len(seen), "query_p50": statistics.median(s["q"] for s in seen),
         "commits": commits, "files": len(files_before),
         "files_per_hour": len(files_before) / duration * 3600,
         "commit_gap": statistics.median(gaps) if gaps else float("nan"),
         "files_per_hour_cadence": 3600 / statistics.median(gaps) * len(files_before) / commits if gaps else float("nan"),
         "avg_file": sum(x["file_size_in_bytes"] for x in files_before) / len(files_before),
         "parquet_bytes": sum(x["file_size_in_bytes"] for x in files_before),
         "payload_bytes": pub["payload_bytes"],
         "silt_cpu_us_msg": (cpu_pub_end - cpu0) / rows * 1e6, "problems": problems, "metadata": meta,
         "manifests": len(t.current_snapshot().manifests(t.io))}
    print(f"fresh: {f}", file=sys.stderr)

    node = Node(a.silt, work, "compact", data, config(lakehouse=True, compaction_interval_ms=1000))
    try:
        m = node.wait_line(rf"lakehouse compaction\b.*table=\"?{TABLE}\"?\s.*files_before=(\d+).*files_after=(\d+)", 60)
        c0 = node.matching(r"lakehouse table writer started")[0][1]
        c1 = node.matching(r"lakehouse compaction\b")[0][1]
        problems = node.problems()
    finally:
        node.stop()
    t = static_table(data)
    after = data_files(t)
    check = duck_check(data, rows)
    on_disk = sum(p.stat().st_size for p in Path(table_dir(data), "data").rglob("*.parquet"))
    comp = {"files_before": len(files_before), "files_after": len(after), "log": m.group(0),
            "avg_before": f["avg_file"], "avg_after": sum(x["file_size_in_bytes"] for x in after) / len(after),
            "rows_after": sum(x["record_count"] for x in after), "check": check, "bucket_data_bytes": on_disk,
            "cpu_s": (c1 - c0) if c0 is not None and c1 is not None else None, "problems": problems}
    print(f"compaction: {comp}", file=sys.stderr)
    return f, comp


# --- report -------------------------------------------------------------------------------------

def fmt(x, digits=3):
    if isinstance(x, int):
        return f"{x:,}"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def report(a, fill, drain, ref, live, ceiling, fresh, comp, elapsed):
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"\nMachine: {os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}; at {commit}; "
          f"ROWS={a.rows} PUBLISHERS={a.publishers} WINDOW={a.window} RATE={a.rate} FRESH_S={a.fresh_s}; "
          f"phases took {elapsed:.0f} s.\n")
    pr = ref["encode"]
    pj = ref["parse_encode"]
    print("| writing the same rows to Parquet | rows/s | MB/s Parquet | MB/s raw payload | CPU µs/row | ratio rows/s |")
    print("|---|---:|---:|---:|---:|---:|")
    payload_b = fill["payload_bytes"]
    print(f"| Silt table writer, backlog of {fmt(drain['rows'])} rows ({drain['commits']} commits, "
          f"{drain['files']} files) | {fmt(drain['rows_s'])} | {fmt(drain['parquet_mb_s'])} | "
          f"{fmt(drain['payload_mb_s'])} | {fmt(drain['cpu_us_row'])} | 1.00 |")
    for name, r in (("pyarrow: Arrow → Parquet (encode only)", pr),
                    ("pyarrow: JSON payloads parsed (pyarrow.json) + encode", pj)):
        wall = r["rows"] / r["rows_s"]
        print(f"| {name} | {fmt(r['rows_s'])} | {fmt(r['mb_s'])} | {fmt(payload_b / wall / 1e6)} | "
              f"{fmt(r['cpu_us_row'])} | {drain['rows_s'] / r['rows_s']:.2f} |")
    print()
    print("| ingest, PUBLISHERS raw-socket QoS 1 publishers | msgs/s | silt CPU µs/msg | silt cores | "
          "publisher cores |")
    print("|---|---:|---:|---:|---:|")
    print(f"| table off (fill) | {fmt(fill['rate'])} | {fmt(fill['silt_cpu_us_msg'])} | "
          f"{fill['silt_cores']:.2f} | {fill['pub_cores']:.2f} |")
    print(f"| table on (live) | {fmt(live['rate'])} | {fmt(live['silt_cpu_us_msg_publishing'])} | "
          f"{live['silt_cores']:.2f} | {live['pub_cores']:.2f} |")
    dur = ceiling["sent"] / ceiling["pub_msgs_per_s"] if ceiling["pub_msgs_per_s"] else float("nan")
    print(f"| table off, silt-loadgen fan-in 50→1 QoS 1, 40 B binary payloads (reference) | "
          f"{fmt(ceiling['pub_msgs_per_s'])} | {fmt(ceiling['broker_cpu_us_per_msg'])} | "
          f"{ceiling['broker_cpu_s'] / dur:.2f} | {ceiling['loadgen_cpu_s'] / dur:.2f} |")
    print(f"\nlive: silt CPU per row from the first publish to the commit holding the last row "
          f"{fmt(live['silt_cpu_us_row'])} µs; that commit came {live['table_done_after_last_puback']:.1f} s "
          f"after the last PUBACK.\n")
    print("| freshness, 1 publisher @ RATE/s, commit_interval_ms 10000 | value |")
    print("|---|---:|")
    print(f"| PUBACK → visible to DuckDB p50 | {fresh['p50']:.2f} s |")
    print(f"| PUBACK → visible to DuckDB p99 | {fresh['p99']:.2f} s |")
    print(f"| min / max | {fresh['min']:.2f} / {fresh['max']:.2f} s |")
    print(f"| DuckDB query (count, max) p50 | {fresh['query_p50'] * 1000:.0f} ms ({fresh['queries']} queries) |")
    print(f"| rows, commits, data files in {fresh['duration']:.0f} s | {fmt(fresh['rows'])}, {fresh['commits']}, "
          f"{fresh['files']} |")
    print(f"| median time between commits | {fresh['commit_gap']:.2f} s |")
    print(f"| data files per table per hour, extrapolated from that cadence | {fmt(fresh['files_per_hour_cadence'])} |")
    print(f"| data files per table per hour, extrapolated from files / run time | {fmt(fresh['files_per_hour'])} |")
    v = fresh["metadata"]["versions"]
    newest, first = max(v), min(k for k in v if k >= 2)
    growth = (v[newest] - v[first]) / (newest - first) if newest > first else float("nan")
    print(f"| table metadata: vN.metadata.json written per commit, newest | {fmt(v[newest])} B (v{newest}) |")
    print(f"| its growth per commit | {fmt(growth)} B |")
    print(f"| metadata/ folder (every version kept, manifests, manifest lists) | {fmt(fresh['metadata']['total'])} B |")
    print(f"| manifests in the current snapshot before compaction | {fresh['manifests']} |")
    print()
    print("| data files (freshness table) | files | average size |")
    print("|---|---:|---:|")
    print(f"| before compaction | {comp['files_before']} | {comp['avg_before'] / 1024:,.1f} KiB |")
    print(f"| after compaction | {comp['files_after']} | {comp['avg_after'] / 1024:,.1f} KiB |")
    print(f"\nAfter compaction the table's data/ folder holds {fmt(comp['bucket_data_bytes'])} bytes of Parquet "
          f"(the replaced files stay until their snapshots expire); silt CPU from restart to the compaction "
          f"line: {comp['cpu_s']:.2f} s.")
    print()
    print("| bytes | backlog table | freshness table |")
    print("|---|---:|---:|")
    print(f"| raw payload | {fmt(payload_b)} | {fmt(fresh['payload_bytes'])} |")
    print(f"| Parquet (data files) | {fmt(drain['parquet_bytes'])} | {fmt(fresh['parquet_bytes'])} |")
    print(f"| Parquet / payload | {drain['parquet_bytes'] / payload_b:.2f} | "
          f"{fresh['parquet_bytes'] / fresh['payload_bytes']:.2f} |")
    print(f"| Parquet bytes per row | {drain['parquet_bytes'] / drain['rows']:.1f} | "
          f"{fresh['parquet_bytes'] / fresh['rows']:.1f} |")
    print(f"| pyarrow, same rows and settings: bytes per row | {pr['bytes'] / pr['rows']:.1f} | |")
    print("\nParquet bytes per column (backlog table, compressed): " + ", ".join(
        f"{k} {v / drain['rows']:.2f} B/row" for k, v in sorted(drain["columns"].items(), key=lambda kv: -kv[1])))
    print(f"\nchecks (DuckDB count, distinct seq, min, max, non-null temp, unit): backlog {drain['check']}, "
          f"live {live['check']}, after compaction {comp['check']}; compaction line: {comp['log']}")
    for name, p in (("drain", drain["problems"]), ("live", live["problems"]), ("fresh", fresh["problems"]),
                    ("compaction", comp["problems"])):
        if p:
            print(f"\n{name}: warnings in silt's log:\n" + "\n".join(p[:10]))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--rate", type=float, default=0)
    p.add_argument("--go", type=float, default=0)
    p.add_argument("--acks")
    w = sub.add_parser("watch")
    w.add_argument("--table", required=True)
    w.add_argument("--stop", required=True)
    r = sub.add_parser("run")
    r.add_argument("--silt", required=True)
    r.add_argument("--loadgen", required=True)
    r.add_argument("--rows", type=int, default=1_000_000)
    r.add_argument("--publishers", type=int, default=8)
    r.add_argument("--window", type=int, default=32)
    r.add_argument("--rate", type=float, default=1000)
    r.add_argument("--fresh-s", type=float, default=60)
    r.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, tables)")
    a = ap.parse_args()
    if a.cmd == "publish":
        return publish(a)
    if a.cmd == "watch":
        return watch(a)
    work = tempfile.mkdtemp(prefix="silt-bench-lakehouse.")
    print(f"scratch: {work}", file=sys.stderr)
    started = time.monotonic()
    fill, drain, ref = phase_fill_and_drain(a, work)
    live = phase_live(a, work)
    ceiling = phase_ceiling(a, work)
    fresh, comp = phase_fresh_and_compact(a, work)
    report(a, fill, drain, ref, live, ceiling, fresh, comp, time.monotonic() - started)
    if a.keep:
        print(f"\nlogs and tables: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
