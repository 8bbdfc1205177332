"""The asynchronous reward service: batching, back-pressure, results by id, errors, a dead worker,
cleanup, bounded memory, and the real BEV-CLIP embedder against in-process ``BevClip.embed``.

Every service here is a real worker process (spawn start method). Spawning costs ~2 s (the child
imports torch through ``drivemind.agents``), so most tests share one module-scoped service.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from drivemind.reward_service import (RewardService, RewardServiceDead, RewardServiceError,
                                             RewardWorkerError, bev_clip_embedder)

ECHO, FAIL, SLOW, SHORT = 0, 1, 2, 3
MAX_BATCH, MAX_PENDING, MAX_WAIT_MS = 8, 16, 300.0
WIDTH = 128  # the shared service's payloads: int64 (WIDTH,), through its shared-memory ring


class Scripted:
    """Test factory (module level, so it pickles by reference into the worker). Payload: int64
    array ``[value, command, ...]``; result row: ``[2 * value, batch size, worker pid]``.
    Commands: ECHO; FAIL (the batch raises); SLOW (the batch sleeps ``slow_s`` first); SHORT (the
    batch returns one row too few)."""

    def __init__(self, slow_s: float = 0.8, fail_build: bool = False):
        self.slow_s, self.fail_build = slow_s, fail_build

    def __call__(self):
        if self.fail_build:
            raise RuntimeError("model file is corrupt (asked to fail in the factory)")
        pid, slow_s = os.getpid(), self.slow_s

        def fn(payloads):
            cmds = {int(p[1]) for p in payloads}
            if FAIL in cmds:
                raise ValueError("asked to fail")
            if SLOW in cmds:
                time.sleep(slow_s)
            out = np.array([[2 * int(p[0]), len(payloads), pid] for p in payloads], np.int64)
            return out[:-1] if SHORT in cmds else out

        return fn


def req(values, cmd=ECHO, width=WIDTH):
    p = np.zeros((len(values), width), np.int64)
    p[:, 0] = values
    p[:, 1] = cmd
    return p


@pytest.fixture(scope="module")
def svc():
    s = RewardService(Scripted(), max_batch=MAX_BATCH, max_wait_ms=MAX_WAIT_MS,
                      max_pending=MAX_PENDING, name="test-service",
                      payload_spec=((WIDTH,), np.int64))
    yield s
    s.close()


@pytest.fixture
def clean(svc):
    """The shared service with nothing in flight or waiting, before and after the test."""
    svc.drain(timeout=30)
    yield svc
    try:
        svc.drain(timeout=30)
    except RewardWorkerError:
        svc.drain(timeout=30)


def process_exists(pid: int) -> bool:
    """Whether a process with this pid exists (a child of ours, or anyone's)."""
    if pid in [c.pid for c in mp.active_children()]:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc); skips the test elsewhere."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pytest.skip("needs /proc to read a process's resident memory")


def by_id(ids, results) -> dict[int, np.ndarray]:
    return {int(i): r for i, r in zip(ids, results)}


# ------------------------------------------------------------------ results, batching
def test_results_come_back_keyed_by_id_out_of_order(clean):
    rng = np.random.default_rng(0)
    ids = 10**12 + rng.permutation(40)  # opaque ids, submitted in shuffled order, in 3 submits
    values = rng.integers(0, 10**6, size=40)
    for a, b in ((0, 5), (5, 21), (21, 40)):
        assert clean.submit(ids[a:b], req(values[a:b])) == b - a
    got, res = clean.drain(timeout=30)
    assert sorted(got.tolist()) == sorted(ids.tolist())
    assert res.shape == (40, 3) and res.dtype == np.int64
    table = by_id(got, res)
    for i, v in zip(ids, values):
        assert table[int(i)][0] == 2 * v
    assert np.all(res[:, 2] == clean.pid)  # computed in the worker process
    assert clean.pid != os.getpid()
    assert clean.in_flight == 0 and clean.ready == 0
    ids2, res2 = clean.poll()
    assert len(ids2) == 0 and res2.shape == (0, 3)  # nothing left; shape known from earlier rows


def test_batches_never_exceed_max_batch_and_fill_when_requests_wait(clean):
    hist0 = clean.batch_size_histogram()
    clean.submit(np.arange(12), req(np.arange(12)))  # one message: 8 now, then 4 after max_wait
    ids, res = clean.drain(timeout=30)
    sizes = by_id(ids, res[:, 1])
    assert sorted(sizes.values()) == [4] * 4 + [8] * 8
    assert all(sizes[i] == 8 for i in range(8))  # first come, first batched
    hist = clean.batch_size_histogram() - hist0
    assert hist[8] == 1 and hist[4] == 1 and hist.sum() == 2


def test_partial_batch_waits_max_wait_and_gathers_late_requests(clean):
    t0 = time.monotonic()
    clean.submit([1, 2], req([1, 2]))
    clean.submit([3, 4, 5], req([3, 4, 5]))  # arrives well within max_wait of the first
    ids, res = clean.drain(timeout=30)
    elapsed = time.monotonic() - t0
    assert sorted(ids.tolist()) == [1, 2, 3, 4, 5]
    assert np.all(res[:, 1] == 5)  # one batch of 5 (< max_batch): it was released by max_wait
    assert elapsed >= 0.9 * MAX_WAIT_MS / 1000  # the worker waited for more before running it
    st = clean.stats()
    assert st["latency_mean_ms"] > 0 and st["latency_p95_ms"] >= 0.9 * MAX_WAIT_MS * 0.5


# ------------------------------------------------------------------ back-pressure
def test_back_pressure_non_blocking_refuses_and_blocking_waits(clean):
    st0 = clean.stats()
    ids = np.arange(100, 100 + MAX_PENDING)
    p = req(ids)
    p[0, 1] = SLOW  # the first batch sleeps slow_s (0.8 s): the queue stays full meanwhile
    assert clean.submit(ids, p) == MAX_PENDING
    assert clean.in_flight == MAX_PENDING
    more = np.arange(200, 206)
    assert clean.submit(more, req(more), block=False) == 0  # no room: nothing accepted
    assert clean.submit(more, req(more), timeout=0.01) == 0  # blocking with a short timeout
    assert clean.in_flight == MAX_PENDING
    t0 = time.monotonic()
    assert clean.submit(more, req(more)) == len(more)  # waits until results make room
    waited = time.monotonic() - t0
    assert clean.in_flight <= MAX_PENDING
    got, res = clean.drain(timeout=30)
    assert sorted(got.tolist()) == sorted(ids.tolist() + more.tolist())
    assert all(r[0] == 2 * i for i, r in by_id(got, res).items())
    st = clean.stats()
    assert st["refused"] - st0["refused"] == 2 * len(more)
    assert st["max_in_flight"] == MAX_PENDING
    assert st["worker_queue_high_water"] <= MAX_PENDING
    assert st["blocked_s"] - st0["blocked_s"] > 0 and waited > 0.1


def test_non_blocking_submit_accepts_the_prefix_that_fits(clean):
    ids = np.arange(300, 300 + MAX_PENDING - 3)
    p = req(ids)
    p[0, 1] = SLOW
    clean.submit(ids, p)
    more = np.arange(400, 410)
    n = clean.submit(more, req(more), block=False)
    assert n == 3 and clean.in_flight == MAX_PENDING
    got, _ = clean.drain(timeout=30)
    assert set(more[:3].tolist()) <= set(got.tolist()) and not set(more[3:].tolist()) & set(got.tolist())


# ------------------------------------------------------------------ errors
def test_batch_error_names_the_ids_and_the_service_stays_usable(clean):
    clean.submit(np.arange(500, 508), req(np.arange(500, 508)))  # a full good batch first
    clean.submit([600, 601, 602], req([0, 0, 0], cmd=FAIL))
    with pytest.raises(RewardWorkerError) as ei:
        clean.drain(timeout=30)
    err = ei.value
    assert sorted(err.ids.tolist()) == [600, 601, 602]
    msg = str(err)
    assert "600, 601, 602" in msg and "ValueError: asked to fail" in msg
    assert "Traceback" in err.traceback and "fn" in err.traceback
    assert clean.in_flight == 0
    ids, res = clean.poll()  # the good batch's results were kept
    assert sorted(ids.tolist()) == list(range(500, 508))
    clean.submit([700], req([21]))
    ids, res = clean.drain(timeout=30)
    assert ids.tolist() == [700] and res[0, 0] == 42
    assert clean.stats()["worker_errors"] >= 1


def test_wrong_number_of_results_is_an_error(clean):
    clean.submit([800, 801], req([1, 2], cmd=SHORT))
    with pytest.raises(RewardWorkerError, match="one row per request"):
        clean.drain(timeout=30)


def test_bad_requests_are_refused_before_sending(clean):
    with pytest.raises(ValueError, match=r"int64 arrays of shape \(128,\).*got int64 \(2,\)"):
        clean.submit([1], req([1], width=2))
    with pytest.raises(ValueError, match="payload_spec.*int32"):
        clean.submit([1], req([1]).astype(np.int32))
    with pytest.raises(ValueError, match="duplicate ids"):
        clean.submit([1, 1], req([1, 2]))
    with pytest.raises(ValueError, match="2 ids but 3 payloads"):
        clean.submit([1, 2], req([1, 2, 3]))
    with pytest.raises(ValueError, match="integers"):
        clean.submit([1.5], req([1]))
    p = req([1])
    p[0, 1] = SLOW
    clean.submit([900], p)
    with pytest.raises(ValueError, match="already in flight.*900"):
        clean.submit([900], req([1]))
    assert clean.stats()["in_flight"] == 1


def test_bad_arguments_fail_before_spawning():
    with pytest.raises(TypeError, match="cannot be pickled"):
        RewardService(lambda: (lambda xs: xs))
    with pytest.raises(ValueError, match="unknown start_method 'threads'; valid here: .*spawn"):
        RewardService(Scripted(), start_method="threads")
    with pytest.raises(ValueError, match="max_batch"):
        RewardService(Scripted(), max_batch=0)
    with pytest.raises(TypeError, match="callable"):
        RewardService(42)


def test_failing_factory_raises_with_the_worker_traceback():
    with pytest.raises(RewardServiceError, match="factory .* failed in the worker") as ei:
        RewardService(Scripted(fail_build=True), name="broken")
    assert "model file is corrupt" in str(ei.value) and "Traceback" in str(ei.value)


# ------------------------------------------------------------------ dead worker, cleanup
def test_killed_worker_is_detected_and_close_leaves_no_child():
    with RewardService(Scripted(slow_s=30.0), max_batch=4, max_wait_ms=1.0, name="victim") as s:
        pid = s.pid
        assert process_exists(pid) and pid != os.getpid()
        s.submit([1, 2], [(7, ECHO), (8, ECHO)])  # no payload_spec: any picklable payloads
        ids, res = s.drain(timeout=30)
        assert by_id(ids, res[:, 0]) == {1: 14, 2: 16}
        p = req([1, 2], width=2)
        p[:, 1] = SLOW
        s.submit([11, 12], p)  # the worker is busy with these when it dies
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RewardServiceDead, match="SIGKILL") as ei:
            s.drain(timeout=20)
        assert time.monotonic() - t0 < 15  # detected, not a hang until the slow batch's end
        assert sorted(ei.value.ids.tolist()) == [11, 12] and ei.value.exitcode == -signal.SIGKILL
        assert "11, 12" in str(ei.value)
        with pytest.raises(RewardServiceDead):
            s.submit([13], req([1], width=2))
        with pytest.raises(RewardServiceDead):
            s.poll()
        assert not s.alive
    assert not process_exists(pid)
    with pytest.raises(RewardServiceError, match="closed"):
        s.poll()


EXIT_SCRIPT = """
import functools, sys
from drivemind.reward_service import RewardService
if __name__ == "__main__":
    svc = RewardService(functools.partial(functools.partial, list), max_wait_ms=1.0)  # echo
    svc.submit([1, 2], [10, 20])
    ids, res = svc.drain(timeout=60)
    print(svc.pid, sorted(zip(ids.tolist(), res)), flush=True)
    sys.exit(0)  # no close(): the service must go with the interpreter
"""


def test_worker_goes_away_when_the_interpreter_exits_without_close(tmp_path):
    import subprocess

    script = tmp_path / "leave_open.py"
    script.write_text(EXIT_SCRIPT)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    pid_text, results = out.stdout.strip().split(" ", 1)
    assert results == "[(1, 10), (2, 20)]"
    pid = int(pid_text)
    deadline = time.monotonic() + 10
    while process_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_exists(pid)


# ------------------------------------------------------------------ memory
def _sizes(s: RewardService) -> dict:
    return {"in_flight": (len(s._in_flight), sys.getsizeof(s._in_flight)),
            "ready": (len(s._ready), sys.getsizeof(s._ready)),
            "errors": len(s._errors), "lat": s._lat.nbytes, "hist": s._batch_hist.nbytes,
            "free_slots": (len(s._free), sys.getsizeof(s._free)), "ring": s._ring.nbytes}


def test_memory_stays_bounded_over_10k_requests(clean):
    n, k = 10_000, 2 * MAX_BATCH  # full batches only: no max_wait pauses
    rss = {}
    for r in range(n // k):
        ids = np.arange(r * k, (r + 1) * k) + 10**9
        assert clean.submit(ids, req(ids)) == k  # 1 kB payloads
        got, res = clean.drain(timeout=30)
        assert len(got) == k and np.array_equal(np.sort(got), ids)
        if r == 100:
            early, rss["early"] = _sizes(clean), rss_bytes(clean.pid)
    late, rss["late"] = _sizes(clean), rss_bytes(clean.pid)
    assert late == early
    assert late["in_flight"][0] == 0 and late["ready"][0] == 0 and late["free_slots"][0] == MAX_PENDING
    st = clean.stats()
    assert st["max_in_flight"] <= MAX_PENDING and st["worker_queue_high_water"] <= MAX_PENDING
    # a leak of the 1 kB payloads (or their results) would add ~8 MB in the worker
    assert rss["late"] - rss["early"] < 4 * 2**20, rss


# ------------------------------------------------------------------ BEV-CLIP embedder
BEV_SHAPE = (15, 96, 96)


def _frames(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    masks = rng.random((n, *BEV_SHAPE)) < rng.uniform(0.02, 0.4, size=(n, 15, 1, 1))
    return (masks * 255).astype(np.uint8)


def test_bev_clip_embedder_missing_weights_fail_in_the_learner(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_bev_clip.pt.*not found"):
        bev_clip_embedder(BEV_SHAPE, weights=tmp_path / "no_such_bev_clip.pt")
    with pytest.raises(ValueError, match="bev_shape"):
        bev_clip_embedder((96, 96))


@pytest.mark.usefixtures("one_torch_thread")
def test_bev_clip_embedder_float16_in_process():
    from drivemind.vlm.bev_clip import BevClip

    frames = _frames(5, seed=3)
    fn = bev_clip_embedder(BEV_SHAPE, dtype="float16")()  # the factory, called here
    out = fn(list(frames))
    ref = BevClip.load(bev_shape=BEV_SHAPE).embed(frames)
    assert out.dtype == np.float16 and out.shape == (5, 384)
    np.testing.assert_allclose(out.astype(np.float32), ref, atol=2e-3)


@pytest.mark.usefixtures("one_torch_thread")
def test_bev_clip_service_matches_in_process_embed_by_id():
    from drivemind.vlm.bev_clip import BevClip

    frames = _frames(40)
    ref = BevClip.load(bev_shape=BEV_SHAPE).embed(frames)
    factory = bev_clip_embedder(BEV_SHAPE, threads=1)
    rng = np.random.default_rng(1)
    order = rng.permutation(40)
    slots = 5000 + 7 * np.arange(40)  # slot ids, not positions
    # max_pending 16 < 40 frames: ring slots are reused while earlier batches are embedded
    with RewardService(factory, max_batch=32, max_wait_ms=10.0, max_pending=16, name="bev-clip") as s:
        pid = s.pid
        assert s.payload_spec == (BEV_SHAPE, np.dtype(np.uint8))
        with pytest.raises(ValueError, match=r"uint8 arrays of shape \(15, 96, 96\)"):
            s.submit([1], frames[:1, :, :64])  # refused in the learner, before sending
        for a, b in ((0, 3), (3, 30), (30, 40)):  # out of order, uneven submits
            s.submit(slots[order[a:b]], frames[order[a:b]])
        ids, emb = s.drain(timeout=120)
        st = s.stats()
    assert not process_exists(pid)  # close() on leaving `with`
    assert emb.shape == (40, 384) and emb.dtype == np.float32
    pos = {int(sl): k for k, sl in enumerate(slots)}
    got = np.stack([emb[list(ids).index(sl)] for sl in slots])
    assert sorted(pos[int(i)] for i in ids) == list(range(40))
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert st["completed"] == 40 and st["batches"] >= 3 and st["mean_batch_size"] <= 16
