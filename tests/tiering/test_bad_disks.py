"""Bad disks, end to end: real `silt serve` processes, a real S3-compatible server (SeaweedFS),
paho clients, kill -9, bytes flipped in segment files, a real full disk (a small tmpfs).

Every payload carries its topic and sequence number and is checked byte for byte (SHA-256): a
subscriber must never receive garbage. The counts must show in `$SYS/broker/storage/...` and
`$SYS/broker/tiering/...`.

1. a byte flipped in an older, sealed, uploaded segment: healed from the object store;
2. a byte flipped in a sealed segment not yet uploaded: quarantined; the broker starts after
   kill -9 and after SIGTERM; the rest is indexed, delivered and uploaded; `ack = "object"`
   publishes after it are answered; the gap is in the log, `$SYS` and the manifest;
3. a byte flipped in the middle of the active segment after kill -9: every acknowledged batch
   after it is still there;
4. a full disk: publishes are refused (PUBACK 0x80), then accepted again once space is freed,
   without a restart; SIGTERM exits 0; every acknowledged message is there after a restart;
5. an incomplete multipart upload of an earlier node: aborted at start, counted and logged.

Test 4 mounts a tmpfs: as root, or (when not root) by running itself again under
`unshare -rm`; it fails, never skips, when neither works.
"""

import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tiering_harness import (
    SESSION_FOREVER, Closed, Ledger, MqttClient, Receiver, SiltNode, SysMonitor, is_success, kill_process,
    wait_until, write_config,
)

pytest_plugins = ["tiering_harness"]  # the `tiering` fixture

MiB = 1 << 20


class Figures(SysMonitor):
    """Every `$SYS/broker/...` figure (storage and tiering), by name relative to that prefix."""

    PREFIX = "$SYS/broker/"


def figures(t, node):
    m = Figures(node)
    t.clients.append(m.client)
    return m


def persistent_subscriber(t, node, client_id, *filters):
    c = t.client(node, client_id, clean_start=False, session_expiry=SESSION_FOREVER)
    c.subscribe(*filters, qos=1)
    c.close()


def resume(t, node, client_id, receiver):
    c = t.client(node, client_id, clean_start=False, session_expiry=SESSION_FOREVER, on_message=receiver)
    assert c.session_present, f"{client_id}: the session was not found on {node.name}"
    return c


def publish_all(client, ledger, topics, count, size, window=50):
    keys = []

    def items():
        for i in range(count):
            topic = topics[i % len(topics)]
            p = ledger.make(topic, size)
            keys.append(Ledger.parse(p))
            yield topic, p

    rcs = client.publish_many(items(), window=window)
    for key, rc in zip(keys, rcs):
        ledger.record(key, rc, size)
    bad = [(k, hex(rc)) for k, rc in zip(keys, rcs) if not is_success(rc)]
    assert not bad, f"{len(bad)} publishes refused, e.g. {bad[:5]}"
    return keys


def segment_files(data_dir):
    return sorted(Path(data_dir, "log").glob("*.log"))


def flip_inside(path, key):
    """Flips one bit in the middle of message `key`'s payload in the segment file `path`;
    returns whether the payload was found there."""
    topic, seq = key
    data = bytearray(Path(path).read_bytes())
    at = data.find(f"{topic}#{seq}#".encode())
    if at < 0:
        return False
    data[at + 200] ^= 0x08
    Path(path).write_bytes(bytes(data))
    return True


def keys_in(path, ledger):
    """The ledger's messages whose payload lies in the segment file `path`, in file order."""
    data = Path(path).read_bytes()
    found = []
    for m in re.finditer(rb"([a-z]+/\d+)#(\d+)#", data):
        key = (m.group(1).decode(), int(m.group(2)))
        if key in ledger.digests:
            found.append(key)
    return found


def deliver_all(t, node, client_id, ledger, expect, timeout=120):
    """Resumes the persistent session and checks it gets exactly `expect` ({topic: [seq]}),
    byte for byte, and nothing else."""
    rx = Receiver(ledger)
    c = resume(t, node, client_id, rx)
    rx.wait_for({(tp, s) for tp, seqs in expect.items() for s in seqs}, timeout)
    rx.assert_exact(expect)
    c.close()
    return rx


def without(expected, lost):
    return {tp: [s for s in seqs if (tp, s) not in lost] for tp, seqs in expected.items()}


# --- 1 ---------------------------------------------------------------------------------------

def test_flipped_byte_in_an_uploaded_segment_is_healed_from_the_store(tiering):
    t = tiering
    config = t.config(storage={"segment_bytes": MiB, "segment_max_age_ms": 1000, "tail_cache_bytes": 0},
                      mqtt={"sys_interval_secs": 1})
    node = t.node("a", config)
    persistent_subscriber(t, node, "heal-sub", "heal/#")
    ledger = Ledger()
    pub = t.client(node, "heal-pub")
    publish_all(pub, ledger, [f"heal/{i}" for i in range(4)], 240, 16 * 1024)
    pub.close()
    assert node.stop() == 0, node.log_tail()

    segs = segment_files(node.data_dir)
    assert len(segs) >= 3, segs
    seg = segs[0]
    objects = {o["base"]: o for o in t.manifest()["objects"]}
    base = int(seg.stem)
    assert base in objects, "the oldest segment is uploaded"
    keys = keys_in(seg, ledger)
    victim = keys[len(keys) // 2]
    before = seg.read_bytes()
    assert flip_inside(seg, victim)

    node.start()
    mon = figures(t, node)
    deliver_all(t, node, "heal-sub", ledger, ledger.acked_by_topic("heal/"))
    mon.wait("storage/healed_batches", lambda v: v >= 1, 30)
    assert mon.latest("storage/quarantined_batches") in (None, 0.0)
    assert re.search(r"WARN.*healed from a good copy", node.log_text()), node.log_tail()
    uploaded = t.s3.get_bytes(f"{t.prefix}/{objects[base]['key']}")
    local = seg.read_bytes()
    assert local == before, "the local copy is what it was before the flip"
    # The object holds the same bytes, except same-length stand-ins for the memory-tier `$SYS`
    # figures published while the segment was active: the victim's batch came from there.
    at = local.find(f"{victim[0]}#{victim[1]}#".encode())
    assert len(uploaded) >= len(local) and uploaded[at:at + 16 * 1024] == local[at:at + 16 * 1024]
    assert node.stop() == 0, node.log_tail()


# --- 2 ---------------------------------------------------------------------------------------

def test_flipped_byte_in_a_segment_not_yet_uploaded_is_quarantined_and_nothing_stops(tiering):
    t = tiering
    config = t.config(storage={"segment_bytes": 256 * 1024, "segment_max_age_ms": 1000, "tail_cache_bytes": 0},
                      mqtt={"sys_interval_secs": 1},
                      tiering={"object_ack_window_ms": 100, "shutdown_upload_timeout_ms": 60000},
                      topics=[{"match": "obj/#", "ack": "object"}])
    node = t.node("a", config)
    persistent_subscriber(t, node, "gap-sub", "gap/#", "obj/#")
    persistent_subscriber(t, node, "bucket-sub", "gap/#", "obj/#")
    mon = figures(t, node)
    mon.wait("tiering/upload_lag_bytes", lambda v: v == 0, 60, since=time.monotonic() + 2)
    uploaded_end = max((o["end"] for o in t.manifest()["objects"]), default=0)

    # The store is unreachable: segments are sealed but not uploaded.
    t.s3.stop()
    ledger = Ledger()
    pub = t.client(node, "gap-pub")
    publish_all(pub, ledger, [f"gap/{i}" for i in range(4)], 200, 8 * 1024)
    pub.close()
    time.sleep(1.5)  # the last one sealed by age too
    assert node.kill() != 0

    sealed = [s for s in segment_files(node.data_dir)[:-1] if int(s.stem) >= uploaded_end]
    assert len(sealed) >= 3, f"sealed segments not uploaded: {sealed}"
    damaged = max(sealed[1:], key=lambda s: len(keys_in(s, ledger)))
    keys = keys_in(damaged, ledger)
    assert len(keys) > 10, f"{damaged} holds {len(keys)} messages"
    victim = keys[len(keys) // 2]
    assert flip_inside(damaged, victim)

    t.s3.start()
    node.start()  # after kill -9 it starts
    mon = figures(t, node)
    mon.wait("storage/quarantined_batches", lambda v: v == 1, 60)
    mon.wait("tiering/uploaded_gaps", lambda v: v >= 1, 90)
    mon.wait("tiering/upload_lag_bytes", lambda v: v == 0, 90, since=time.monotonic() + 2)
    text = node.log_text()
    assert re.search(r"ERROR.*quarantined, its records are lost", text), node.log_tail()
    assert "uploads stop" not in text and "index stops here" not in text
    quarantined = list(Path(node.data_dir, "log", "quarantine").glob("*.bad"))
    assert len(quarantined) == 1, quarantined
    gapped = [o for o in t.manifest()["objects"] if o.get("gaps")]
    assert len(gapped) == 1 and gapped[0]["base"] == int(damaged.stem), gapped
    (start, end), = gapped[0]["gaps"]

    # `ack = "object"` publishes after the gap are answered.
    obj = t.client(node, "obj-pub")
    for _ in range(5):
        p = ledger.make("obj/x", 1024)
        rc = obj.publish("obj/x", p, timeout=60)
        assert is_success(rc), f"PUBACK {rc:#x} for an ack = object publish after the gap"
        ledger.record(Ledger.parse(p), rc, len(p))
    obj.close()

    expected = without(ledger.acked_by_topic(), {victim})
    deliver_all(t, node, "gap-sub", ledger, expected)

    # After SIGTERM it starts too.
    assert node.stop() == 0, node.log_tail()
    node.start()
    assert node.stop() == 0, node.log_tail()
    assert start < end

    # Everything but the lost message reached the bucket: a node with an empty disk serves it.
    t.wipe(node)
    fresh = t.node("b", config)
    deliver_all(t, fresh, "bucket-sub", ledger, expected)


# --- 3 ---------------------------------------------------------------------------------------

def test_flipped_byte_in_the_middle_of_the_active_segment_keeps_what_follows(tiering):
    t = tiering
    config = t.config(storage={"segment_bytes": 64 * MiB, "segment_max_age_ms": 3600000},
                      mqtt={"sys_interval_secs": 1})
    node = t.node("a", config)
    persistent_subscriber(t, node, "active-sub", "act/#")
    ledger = Ledger()
    pub = t.client(node, "active-pub")
    publish_all(pub, ledger, [f"act/{i}" for i in range(3)], 300, 4096)
    pub.close()
    assert node.kill() != 0

    seg = segment_files(node.data_dir)[-1]
    keys = keys_in(seg, ledger)
    assert len(keys) == 300, "everything is in the active segment"
    victim = keys[150]
    assert flip_inside(seg, victim)

    node.start()
    mon = figures(t, node)
    rx = deliver_all(t, node, "active-sub", ledger, without(ledger.acked_by_topic(), {victim}))
    got = rx.distinct()
    after = [k for k in keys[151:] if k in ledger.acked]
    assert all(k in got for k in after), "every acknowledged batch after the bad one is there"
    assert len(got) == len(ledger.acked) - 1, f"{len(got)} received of {len(ledger.acked)} acknowledged"
    mon.wait("storage/quarantined_batches", lambda v: v == 1, 30)
    assert "cut a torn or corrupt tail" not in node.log_text()
    assert node.stop() == 0, node.log_tail()


# --- 4 ---------------------------------------------------------------------------------------

def _can_mount():
    return os.geteuid() == 0


@pytest.fixture
def full_disk_dirs():
    with tempfile.TemporaryDirectory(prefix="silt-full-disk-") as d:
        base = Path(d)
        data = base / "data"
        data.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(data)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"mounting a tmpfs on {data} failed: {r.stderr.strip()} (run as root or under unshare -rm)")
        try:
            yield base, data
        finally:
            subprocess.run(["umount", "-l", str(data)], capture_output=True)


def fill(path):
    """Writes a filler file until the disk is full."""
    chunk = b"\x5a" * (64 << 10)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                if f.write(chunk) == 0:
                    break
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        while True:
            try:
                if f.write(b"\x5a") == 0:
                    break
            except OSError:
                break


def test_full_disk_refuses_then_recovers_without_a_restart(request):
    if not _can_mount() and not os.environ.get("SILT_TEST_UNSHARED"):
        # Run this test again in a user and mount namespace, where it may mount a tmpfs.
        if shutil.which("unshare") is None:
            pytest.fail("the full-disk test mounts a tmpfs: run it as root or install unshare (util-linux)")
        r = subprocess.run(["unshare", "-rm", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            f"{__file__}::{request.node.name}"],
                           env={**os.environ, "SILT_TEST_UNSHARED": "1"})
        assert r.returncode == 0, "the full-disk test failed inside unshare -rm"
        return
    base, data = request.getfixturevalue("full_disk_dirs")
    # Index flushes every 300 ms: RocksDB meets the full disk too, and must get its writes back.
    # (It resumes by itself once the free space is at least its largest write buffer, 64 MiB by
    # default: hence a 160 MiB disk.)
    config = write_config(base / "silt.toml", storage={"segment_bytes": MiB, "fsync": "always",
                                                       "index_flush_interval_ms": 300},
                          mqtt={"sys_interval_secs": 1},
                          tiering={"object_store": f"file://{base / 'objects'}"})
    node = SiltNode("full", data, config=config, log_dir=base)
    clients = []
    try:
        node.start()
        ledger = Ledger()
        c = MqttClient(node.port, "offline-sub", clean_start=False, session_expiry=SESSION_FOREVER)
        c.subscribe("full/#", qos=1)
        c.close()
        live_rx = Receiver(ledger)
        live = MqttClient(node.port, "live-sub", clean_start=False, session_expiry=SESSION_FOREVER,
                          on_message=live_rx)
        clients.append(live)
        live.subscribe("full/#", qos=1)
        pub = MqttClient(node.port, "full-pub")
        clients.append(pub)
        before = publish_all(pub, ledger, ["full/a", "full/b"], 100, 4096)
        live_rx.wait_for(set(before), 60, idle=0)

        filler = data / "filler"
        fill(filler)
        refused = []
        # The active segment may still hold preallocated zeros (up to a segment, 1 MiB here):
        # publishes stored there are durable and rightly acknowledged. Past them the log needs
        # new blocks or a new segment file, and is refused.
        for _ in range(800):
            p = ledger.make("full/a", 4096)
            rc = pub.publish("full/a", p, timeout=30)
            ledger.record(Ledger.parse(p), rc, len(p))
            if not is_success(rc):
                refused.append(rc)
                if len(refused) >= 20:
                    break
        time.sleep(2)  # a few index flushes fail meanwhile
        assert refused, "the disk was full, yet every publish was acknowledged"
        assert all(rc == 0x80 for rc in refused), [hex(rc) for rc in refused]
        assert node.running

        filler.unlink()
        p = ledger.make("full/b", 4096)

        def accepted():
            rc = pub.publish("full/b", p, timeout=30)
            ledger.record(Ledger.parse(p), rc, len(p))
            return is_success(rc)
        wait_until(accepted, 60, interval=0.5, what="a publish accepted after the disk has room again")
        after = publish_all(pub, ledger, ["full/a", "full/b"], 100, 4096)
        # Dispatch went on too (RocksDB got its writes back): the live subscriber gets them.
        live_rx.wait_for(set(after), 90, idle=0)
        assert not live_rx.bad, live_rx.bad[:5]
        for cl in clients:
            cl.close()
        clients.clear()
        assert node.stop() == 0, "SIGTERM after a full disk exits 0:\n" + node.log_tail()

        node.start()
        rx = Receiver(ledger)
        c = MqttClient(node.port, "offline-sub", clean_start=False, session_expiry=SESSION_FOREVER, on_message=rx)
        clients.append(c)
        rx.wait_for(ledger.acked, 120)
        rx.assert_exact(ledger.acked_by_topic("full/"))
        c.close()
        clients.clear()
        assert node.stop() == 0, node.log_tail()
    finally:
        for cl in clients:
            try:
                cl.close()
            except Exception:
                pass
        if node.proc is not None:
            kill_process(node.proc)
        print(f"\n---- silt log tail ----\n{node.log_tail(80)}")


# --- 5 ---------------------------------------------------------------------------------------

def test_incomplete_multipart_uploads_of_earlier_nodes_are_aborted(tiering):
    t = tiering
    config = t.config(mqtt={"sys_interval_secs": 1})
    node = t.node("a", config)
    assert node.stop() == 0
    epoch = t.manifest()["epoch"]
    s3 = t.s3.client()
    stale_key = f"{t.prefix}/segments/{1 << 40:020}-{epoch:08}.seg"
    own_key = f"{t.prefix}/segments/{1 << 41:020}-{epoch + 1:08}.seg"  # the next node's epoch
    stale = s3.create_multipart_upload(Bucket=t.s3.bucket, Key=stale_key)["UploadId"]
    s3.upload_part(Bucket=t.s3.bucket, Key=stale_key, UploadId=stale, PartNumber=1, Body=b"x" * 1024)
    own = s3.create_multipart_upload(Bucket=t.s3.bucket, Key=own_key)["UploadId"]

    def listed():
        r = s3.list_multipart_uploads(Bucket=t.s3.bucket, Prefix=f"{t.prefix}/segments/")
        return {(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])}
    assert listed() == {(stale_key, stale), (own_key, own)}, "SeaweedFS lists multipart uploads"

    node.start()
    mon = figures(t, node)
    mon.wait("tiering/aborted_uploads", lambda v: v == 1, 60)
    assert listed() == {(own_key, own)}, "the earlier epoch's upload is aborted, this epoch's kept"
    assert "aborted an incomplete multipart upload" in node.log_text(), node.log_tail()
    s3.abort_multipart_upload(Bucket=t.s3.bucket, Key=own_key, UploadId=own)
    assert node.stop() == 0
