"""An asynchronous labelling service: one worker process that answers requests in micro-batches.

The learner (the training loop) hands the service *requests* -- an opaque integer id (e.g. a
replay-buffer slot) and a payload (e.g. a uint8 BEV frame) -- and gets the *results* back later,
keyed by id, without waiting for them (Found-RL's asynchronous batch inference; DriveVLM-RL's
reward worker). The worker process builds its batch function once (``factory()``), then loops:
collect requests until ``max_batch`` of them are there or ``max_wait_ms`` have passed since the
first one of the batch arrived, run the batch function on them, send the results back.

    with RewardService(bev_clip_embedder((15, 96, 96)), max_batch=32, max_wait_ms=10) as svc:
        svc.submit(slots, frames)            # blocks only while max_pending requests are in flight
        ids, emb = svc.poll()                # whatever has come back (maybe nothing)
        ids, emb = svc.drain(timeout=30)     # everything that is still in flight

Semantics (docs/reward_service.md has the long form):

- **Back-pressure.** At most ``max_pending`` requests are *in flight* (submitted, result not yet
  received by this process). ``submit`` accepts a prefix of its requests and returns how many it
  accepted: with ``block=True`` (default) and no timeout it waits for room and accepts all; with
  ``block=False`` it accepts only what fits now (maybe 0); with a timeout, what fitted before it
  ran out. Results received while ``submit`` waits are kept for the next ``poll``.
- **Errors.** An exception in the batch function fails that batch only: its ids leave the
  in-flight set, the next ``poll``/``drain``/``submit`` raises one :class:`RewardWorkerError`
  naming them with the worker's traceback, and the service stays usable. A factory that fails
  makes the constructor raise. A worker process that dies is detected (end of pipe, or the process
  is gone) and raises :class:`RewardServiceDead` naming the exit code and the lost ids; the service
  is then unusable (results already received can still be polled).
- **Bounded memory.** Everything that could grow with the run is bounded: the in-flight table and
  the worker's queue by ``max_pending``; results received but not yet polled by ``max_ready``
  (beyond it ``submit`` raises rather than let a learner that never polls grow the heap).
  Statistics are running sums, a fixed batch-size histogram and a fixed ring of recent latencies.
- **Payload transport.** With a ``payload_spec`` (shape, dtype) -- ``bev_clip_embedder`` has one --
  payloads are copied into a shared-memory ring of ``max_pending`` slots allocated once at start;
  only ids and slot numbers go through the pipe, and a slot is reused once its result is back.
  Without one, payloads are pickled through the pipe (any picklable object).
- **One process, spawn.** The worker is started with the ``spawn`` method by default (safe with
  torch and threads); the factory must therefore be picklable (a module-level function or a class
  instance), and a script that creates a service must guard its entry point with
  ``if __name__ == "__main__":``. The learner-side methods are not thread-safe: call them from one
  thread.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["BevClipEmbedder", "RewardService", "RewardServiceDead", "RewardServiceError",
           "RewardWorkerError", "SERVICE_DEFAULTS", "bev_clip_embedder"]

# the agents' settings for their workers (``algo.reward_service``): micro-batch, wait, in-flight
# bound, worker torch threads, and how long the learner waits for labels before failing clearly
SERVICE_DEFAULTS = {"max_batch": 32, "max_wait_ms": 10.0, "max_pending": 256, "threads": 1,
                    "wait_s": 120.0}

LATENCY_WINDOW = 4096  # recent request latencies kept for the p95
TRACEBACK_CHARS = 4000  # a worker traceback is cut to its last this-many characters
_POLL_SLICE = 0.2  # seconds between liveness checks while waiting


class RewardServiceError(RuntimeError):
    """Base class of the service's errors (also: a closed service, a failed factory)."""


class RewardWorkerError(RewardServiceError):
    """The batch function raised (or returned a wrong result) in the worker. ``ids``: the failed
    requests (no result will come for them); ``traceback``: the worker's traceback text(s). The
    service stays usable."""

    def __init__(self, message: str, ids: np.ndarray, traceback: str):
        super().__init__(message)
        self.ids = ids
        self.traceback = traceback


class RewardServiceDead(RewardServiceError):
    """The worker process is gone. ``ids``: the requests in flight when it died (lost);
    ``exitcode``: the process's exit code (negative: killed by that signal)."""

    def __init__(self, message: str, ids: np.ndarray, exitcode: int | None):
        super().__init__(message)
        self.ids = ids
        self.exitcode = exitcode


# ---------------------------------------------------------------------------------------- worker
def _tail(text: str, n: int = TRACEBACK_CHARS) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def _check_results(results, n: int):
    """The batch function's output as something with one row per request, or a ValueError."""
    if isinstance(results, np.ndarray):
        if results.ndim == 0 or len(results) != n:
            raise ValueError(f"the batch function returned an array of shape {results.shape} for "
                             f"{n} request(s); it must have one row per request (shape ({n}, ...))")
        return results
    if isinstance(results, (list, tuple)):
        if len(results) != n:
            raise ValueError(f"the batch function returned {len(results)} result(s) for {n} "
                             f"request(s); it must return one per request, in order")
        return list(results)
    raise ValueError(f"the batch function must return a list or an ndarray with one row per "
                     f"request, got {type(results).__name__}")


def _ring_view(raw, spec, n: int) -> np.ndarray:
    shape, dtype = spec
    return np.frombuffer(raw, np.uint8).view(np.dtype(dtype)).reshape(n, *shape)


def _worker_main(factory, req_conn, res_conn, max_batch: int, max_wait: float, ring_raw=None,
                 spec=None, n_slots: int = 0):
    """The worker process: build the batch function, then batch, run, send back. With a payload
    ring, requests name ring slots and the batch function gets one (n, *shape) array copied
    from them; otherwise it gets the list of unpickled payloads."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle
    try:
        fn = factory()
        if not callable(fn):
            raise TypeError(f"the factory returned {type(fn).__name__}, not a batch function")
    except BaseException:
        try:
            res_conn.send(("fatal", _tail(traceback.format_exc())))
        finally:
            _leave(1)
    ring = _ring_view(ring_raw, spec, n_slots) if ring_raw is not None else None
    res_conn.send(("ready", os.getpid()))

    pending: collections.deque = collections.deque()  # (id, payload or ring slot, arrival time)
    cond = threading.Condition()
    stop = [False]

    def reader():  # keeps the request pipe drained even while a batch runs (no deadlock)
        try:
            while True:
                msg = req_conn.recv()
                if msg[0] != "req":
                    break  # "stop"
                _, ids, payloads = msg
                now = time.monotonic()
                with cond:
                    for i in range(len(ids)):
                        pending.append((int(ids[i]), payloads[i], now))
                    cond.notify()
        except (EOFError, OSError):  # the learner is gone
            pass
        finally:
            with cond:
                stop[0] = True
                cond.notify()

    threading.Thread(target=reader, name="reward-service-reader", daemon=True).start()
    busy = 0.0
    while True:
        with cond:
            while not pending and not stop[0]:
                cond.wait()
            if stop[0]:
                break
            deadline = pending[0][2] + max_wait
            while len(pending) < max_batch and not stop[0]:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                cond.wait(left)
            if stop[0]:
                break
            depth = len(pending)
            batch = [pending.popleft() for _ in range(min(max_batch, depth))]
        ids = np.fromiter((b[0] for b in batch), np.int64, len(batch))
        t0 = time.monotonic()
        payloads = None
        try:
            if ring is not None:  # copied out: the learner may reuse a slot once its result is back
                payloads = ring[np.fromiter((b[1] for b in batch), np.int64, len(batch))]
            else:
                payloads = [b[1] for b in batch]
            out = _check_results(fn(payloads), len(batch))
            msg = ("ok", ids, out)
        except BaseException:
            msg = ("err", ids, _tail(traceback.format_exc()))
        del batch, payloads
        t1 = time.monotonic()
        busy += t1 - t0
        try:
            try:
                res_conn.send((*msg, t1, depth, busy))
            except (pickle.PicklingError, TypeError, AttributeError):
                res_conn.send(("err", ids, _tail(traceback.format_exc()), t1, depth, busy))
        except (BrokenPipeError, EOFError, OSError):
            break  # the learner is gone
    _leave(0)


def _leave(code: int):
    """Exit the worker at once: everything owed has been sent (sends are synchronous), and a full
    interpreter shutdown with torch loaded takes seconds that close() would wait for. Standard
    streams are flushed; atexit handlers do not run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def _shutdown(proc, req_conn, res_conn, timeout: float = 5.0):
    """Stop the worker (politely, then by force) and close both pipes. Safe to call twice."""
    try:
        if proc.is_alive():
            try:
                req_conn.send(("stop",))
            except (OSError, ValueError):
                pass
            proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(2.0)
    except (AssertionError, ValueError):  # not started / already closed
        pass
    for c in (req_conn, res_conn):
        try:
            c.close()
        except OSError:
            pass
    try:
        proc.close()
    except (ValueError, AttributeError):
        pass


def _widen_pipe(conn, want: int = 1 << 20) -> int:
    """Grow a pipe's kernel buffer (Linux: up to /proc/sys/fs/pipe-max-size, 1 MiB by default) so
    that submitting a few frames does not wait for the worker to read them. Returns the size (0
    where it cannot be read)."""
    try:
        import fcntl

        fd = conn.fileno()
        for size in (want, want // 2, want // 4):
            try:
                return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
            except OSError:
                continue
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (ImportError, AttributeError, OSError, ValueError):
        return 0


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "the worker process is gone (exit code unknown)"
    if code < 0:
        try:
            return f"the worker process was killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"the worker process was killed by signal {-code} (exit code {code})"
    return f"the worker process exited with code {code}"


def _ids_text(ids, n: int = 12) -> str:
    ids = [int(i) for i in ids]
    s = ", ".join(map(str, ids[:n]))
    return s + (f", ... ({len(ids)} in all)" if len(ids) > n else "")


# ---------------------------------------------------------------------------------------- service
class RewardService:
    """One worker process answering labelling requests in micro-batches. See the module docstring.

    ``factory``: a picklable callable, called once in the worker, returning the batch function
    ``fn(payloads) -> list | ndarray`` (one result per payload, in order).

    ``payload_spec``: ``(shape, dtype)`` of every payload (default: the factory's
    ``payload_spec`` attribute, if any). With it, payloads travel through a shared-memory ring of
    ``max_pending`` slots (no pickling; the learner copies each payload once), ``submit`` refuses
    payloads of another shape or dtype, and ``fn`` gets one ``(n, *shape)`` array. Without it,
    payloads are pickled through the pipe and ``fn`` gets a list.
    ``start_timeout``: seconds to wait for the factory (model loads).
    ``max_ready``: results received but not yet polled beyond which ``submit`` raises (a learner
    that never polls would otherwise grow memory without bound)."""

    def __init__(self, factory: Callable[[], Callable[[list], Any]], *, max_batch: int = 32,
                 max_wait_ms: float = 10.0, max_pending: int = 64, start_method: str = "spawn",
                 name: str = "reward-service", start_timeout: float = 300.0,
                 max_ready: int = 16384, payload_spec=None):
        if not callable(factory):
            raise TypeError(f"factory must be callable (it builds the batch function in the worker), "
                            f"got {type(factory).__name__}")
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not float(max_wait_ms) >= 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        if int(max_pending) < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        methods = mp.get_all_start_methods()
        if start_method not in methods:
            raise ValueError(f"unknown start_method {start_method!r}; valid here: {', '.join(methods)}")
        if start_method != "fork":
            try:
                pickle.dumps(factory)
            except Exception as e:
                raise TypeError(f"the factory {factory!r} cannot be pickled ({e}); with start_method="
                                f"{start_method!r} it must be a module-level function or an instance "
                                f"of a module-level class (no lambdas or closures)") from None
        self.name = str(name)
        self.max_batch, self.max_pending = int(max_batch), int(max_pending)
        self.max_wait_ms = float(max_wait_ms)
        if payload_spec is None:
            payload_spec = getattr(factory, "payload_spec", None)
        self.payload_spec = _check_spec(payload_spec) if payload_spec is not None else None
        self._factory_repr = _short_repr(factory)
        self._closed = False
        self._dead: RewardServiceDead | None = None
        # bounded state: in-flight table (<= max_pending), received results (<= max_ready)
        self._in_flight: dict[int, tuple[float, int]] = {}  # id -> (submit time, ring slot or -1)
        self._ready: collections.deque = collections.deque()  # (ids, results) chunks
        self._n_ready = 0
        self.max_ready = int(max_ready)  # received but not polled: beyond this, submit refuses
        self._errors: list[tuple[np.ndarray, str]] = []
        self._row_template: np.ndarray | None = None  # (0, ...) array once results are arrays
        # statistics: fixed size
        self._n_submitted = self._n_completed = self._n_failed = self._n_batches = 0
        self._n_error_batches = self._n_refused = 0
        self._batch_hist = np.zeros(self.max_batch + 1, np.int64)
        self._lat = np.zeros(LATENCY_WINDOW, np.float64)
        self._lat_n = 0
        self._lat_sum = 0.0
        self._max_in_flight = self._max_worker_depth = 0
        self._blocked_s = 0.0
        self._busy_s = self._busy0 = 0.0
        self._t_start = time.monotonic()

        ctx = mp.get_context(start_method)
        self._ring = None
        ring_raw = None
        if self.payload_spec is not None:  # fixed: max_pending payloads, allocated once
            shape, dtype = self.payload_spec
            ring_raw = ctx.RawArray("B", max(self.max_pending * int(np.prod(shape)) * dtype.itemsize, 1))
            self._ring = _ring_view(ring_raw, self.payload_spec, self.max_pending)
            self._free = list(range(self.max_pending - 1, -1, -1))  # free ring slots (a stack)
        req_r, self._req = ctx.Pipe(duplex=False)  # learner -> worker
        self.pipe_bytes = _widen_pipe(self._req)
        self._res, res_w = ctx.Pipe(duplex=False)  # worker -> learner
        self._proc = ctx.Process(target=_worker_main, name=self.name, daemon=True,
                                 args=(factory, req_r, res_w, self.max_batch, self.max_wait_ms / 1000,
                                       ring_raw, self.payload_spec, self.max_pending))
        self._proc.start()
        # only the worker holds its ends now: its death shows up here as end-of-pipe
        req_r.close()
        res_w.close()
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._req, self._res)
        self.pid = self._proc.pid
        try:
            self._wait_ready(float(start_timeout))
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self._res.poll(min(_POLL_SLICE, max(deadline - time.monotonic(), 0)))
                msg = self._res.recv() if got else None
            except (EOFError, OSError):
                self._proc.join(1.0)
                raise RewardServiceError(
                    f"reward service {self.name!r}: {_describe_exit(self._proc.exitcode)} while "
                    f"building the batch function with {self._factory_repr}") from None
            if msg is not None:
                if msg[0] == "ready":
                    return
                if msg[0] == "fatal":
                    raise RewardServiceError(
                        f"reward service {self.name!r}: the factory {self._factory_repr} failed in "
                        f"the worker:\n{msg[1]}")
            if not self._proc.is_alive() and not self._res.poll(0):
                raise RewardServiceError(
                    f"reward service {self.name!r}: {_describe_exit(self._proc.exitcode)} while "
                    f"building the batch function with {self._factory_repr}")
            if time.monotonic() >= deadline:
                raise RewardServiceError(
                    f"reward service {self.name!r}: the worker did not finish building the batch "
                    f"function with {self._factory_repr} within {timeout:.0f} s (start_timeout)")

    # ------------------------------------------------------------------ state
    @property
    def in_flight(self) -> int:
        """Requests submitted whose results have not been received yet (<= max_pending)."""
        return len(self._in_flight)

    @property
    def ready(self) -> int:
        """Results received and not yet returned by ``poll``."""
        return self._n_ready

    @property
    def alive(self) -> bool:
        return not self._closed and self._dead is None and self._proc.is_alive()

    def _check_open(self):
        if self._closed:
            raise RewardServiceError(f"reward service {self.name!r} is closed")
        if self._dead is not None:
            raise self._dead

    def _raise_errors(self):
        if not self._errors:
            return
        errs, self._errors = self._errors, []
        ids = np.concatenate([e[0] for e in errs])
        first = errs[0][1].rstrip()
        last_line = first.splitlines()[-1] if first else "?"
        more = f" (and {len(errs) - 1} more failed batch(es); first traceback shown)" if len(errs) > 1 else ""
        raise RewardWorkerError(
            f"reward service {self.name!r}: the batch function failed on {len(ids)} request(s), ids "
            f"{_ids_text(ids)}: {last_line}{more}; no results will come for them (resubmit or drop "
            f"them). Worker traceback (pid {self.pid}):\n{first}", ids, "\n\n".join(e[1] for e in errs))

    def _mark_dead(self):
        try:
            self._proc.join(1.0)
            code = self._proc.exitcode
        except ValueError:
            code = None
        lost = np.fromiter(self._in_flight.keys(), np.int64, len(self._in_flight))
        self._in_flight.clear()
        self._dead = RewardServiceDead(
            f"reward service {self.name!r}: {_describe_exit(code)}; {len(lost)} request(s) were in "
            f"flight and are lost" + (f" (ids {_ids_text(lost)})" if len(lost) else "")
            + "; close() this service and start a new one", lost, code)
        raise self._dead

    def _handle(self, msg):
        kind, ids, body, t_done, depth, busy = msg
        self._busy_s = busy
        self._max_worker_depth = max(self._max_worker_depth, int(depth))
        self._n_batches += 1
        self._batch_hist[min(len(ids), self.max_batch)] += 1
        pop = self._in_flight.pop
        ring = self._ring is not None
        if kind == "ok":
            for i in ids.tolist():
                t = pop(i, None)
                if t is not None:
                    if ring:
                        self._free.append(t[1])
                    lat = t_done - t[0]
                    self._lat[self._lat_n % LATENCY_WINDOW] = lat
                    self._lat_n += 1
                    self._lat_sum += lat
            self._n_completed += len(ids)
            if isinstance(body, np.ndarray) and self._row_template is None:
                self._row_template = body[:0].copy()
            self._ready.append((ids, body))
            self._n_ready += len(ids)
        else:
            for i in ids.tolist():
                t = pop(i, None)
                if t is not None and ring:
                    self._free.append(t[1])
            self._n_failed += len(ids)
            self._n_error_batches += 1
            self._errors.append((ids, body))

    def _pump(self, timeout: float = 0.0) -> int:
        """Receive what the worker has sent; with a timeout, wait up to it for the first message.
        Returns the number of messages handled. Detects a dead worker."""
        deadline = time.monotonic() + max(timeout, 0.0)
        n = 0
        try:
            while True:
                if self._res.poll(0):
                    self._handle(self._res.recv())
                    n += 1
                    continue
                left = deadline - time.monotonic()
                if n or left <= 0:
                    break
                if self._res.poll(min(left, _POLL_SLICE)):
                    continue
                if not self._proc.is_alive():
                    break
        except (EOFError, OSError):
            self._mark_dead()
        if not self._proc.is_alive() and not self._res.poll(0):
            self._mark_dead()
        return n

    # ------------------------------------------------------------------ learner API
    def submit(self, ids, payloads: Sequence | np.ndarray, block: bool = True,
               timeout: float | None = None) -> int:
        """Queue requests ``ids[i] -> payloads[i]``; returns how many were accepted (a prefix).

        ``block=True, timeout=None``: waits while ``max_pending`` requests are in flight and
        accepts all. ``block=False``: accepts what fits now. A timeout: what fitted before it ran
        out. Ids must be integers, unique, and not already in flight."""
        self._check_open()
        self._raise_errors()
        ids = np.asarray(ids)
        if ids.ndim == 0:
            ids = ids[None]
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or len(ids) == 0):
            raise ValueError(f"ids must be a 1-D sequence of integers, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int64, copy=False)
        if self.payload_spec is not None and isinstance(payloads, np.ndarray) and len(ids) == 1 \
                and payloads.shape == self.payload_spec[0]:
            payloads = payloads[None]  # one id, one bare payload
        if len(payloads) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(payloads)} payloads: give one payload per id")
        if len(ids) == 0:
            return 0
        if len(ids) > 1 and len(np.unique(ids)) != len(ids):
            u, c = np.unique(ids, return_counts=True)
            raise ValueError(f"duplicate ids in one submit: {_ids_text(u[c > 1])}")
        self._pump(0.0)  # results already sent count as back, not in flight
        busy = [i for i in ids.tolist() if i in self._in_flight]
        if busy:
            raise ValueError(f"ids already in flight (results are keyed by id): {_ids_text(busy)}; "
                             f"wait for their results or use fresh ids")
        if self.payload_spec is not None:
            payloads = self._as_ring_payloads(payloads, len(ids))
        if self._n_ready >= self.max_ready:
            raise RewardServiceError(
                f"reward service {self.name!r}: {self._n_ready} results are waiting to be collected; "
                f"call poll() (submitting more without polling would grow memory without bound)")
        n, sent = len(ids), 0
        deadline = None if timeout is None else time.monotonic() + max(float(timeout), 0.0)
        t_block = None
        try:
            while sent < n:
                self._pump(0.0)
                room = self.max_pending - len(self._in_flight)
                if room > 0:
                    k = min(room, n - sent)
                    self._send(ids[sent:sent + k], payloads[sent:sent + k])
                    sent += k
                    continue
                if not block:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                if t_block is None:
                    t_block = time.monotonic()
                self._pump(_POLL_SLICE if left is None else min(left, _POLL_SLICE))
        finally:
            if t_block is not None:
                self._blocked_s += time.monotonic() - t_block
            self._n_refused += n - sent
        return sent

    def _as_ring_payloads(self, payloads, n: int) -> np.ndarray:
        shape, dtype = self.payload_spec
        try:
            arr = payloads if isinstance(payloads, np.ndarray) else np.stack(list(payloads))
        except (ValueError, TypeError) as e:
            raise ValueError(f"payloads must be {dtype} arrays of shape {shape} (this service's "
                             f"payload_spec), stacked or as a list; they do not stack: {e}") from None
        if arr.shape[1:] != shape or arr.dtype != dtype:
            raise ValueError(f"payloads must be {dtype} arrays of shape {shape} (this service's "
                             f"payload_spec); got {arr.dtype} {arr.shape[1:]} (all: {arr.shape})")
        return arr

    def _send(self, ids: np.ndarray, payloads):
        now = time.monotonic()
        if self._ring is not None:
            slots = np.array([self._free.pop() for _ in range(len(ids))], np.int64)
            self._ring[slots] = payloads
            msg = ("req", ids, slots)
        else:
            slots = np.full(len(ids), -1, np.int64)
            msg = ("req", ids, payloads if isinstance(payloads, (np.ndarray, list)) else list(payloads))
        try:
            self._req.send(msg)
        except (BrokenPipeError, EOFError, OSError):
            self._mark_dead()
        for i, sl in zip(ids.tolist(), slots.tolist()):
            self._in_flight[i] = (now, sl)
        self._n_submitted += len(ids)
        self._max_in_flight = max(self._max_in_flight, len(self._in_flight))

    def poll(self, timeout: float = 0.0) -> tuple[np.ndarray, Any]:
        """Results received so far: ``(ids int64 (n,), results)``. ``results`` stacks the rows
        when the batch function returns arrays (an empty (0, ...) array once their shape is known),
        else it is a list. With ``timeout`` > 0, waits up to that long for something to arrive.
        Raises a pending :class:`RewardWorkerError` first (results stay for the next call)."""
        if self._closed:
            raise RewardServiceError(f"reward service {self.name!r} is closed")
        if self._dead is None:
            if self._errors:
                self._raise_errors()
            try:
                self._pump(0.0)
                if not self._n_ready and not self._errors and timeout > 0 and self._in_flight:
                    self._pump(timeout)
            except RewardServiceDead:
                if not self._n_ready:
                    raise
            self._raise_errors()
        elif not self._n_ready:
            raise self._dead
        return self._take()

    def _take(self) -> tuple[np.ndarray, Any]:
        chunks = list(self._ready)
        self._ready.clear()
        self._n_ready = 0
        if not chunks:
            return np.zeros(0, np.int64), (self._row_template.copy() if self._row_template is not None
                                           else [])
        ids = np.concatenate([c[0] for c in chunks])
        if all(isinstance(c[1], np.ndarray) for c in chunks):
            return ids, np.concatenate([c[1] for c in chunks])
        out: list = []
        for c in chunks:
            out.extend(list(c[1]))
        return ids, out

    def drain(self, timeout: float | None = None) -> tuple[np.ndarray, Any]:
        """Wait until nothing is in flight, then ``poll()``. Raises TimeoutError (results kept)
        if that takes longer than ``timeout`` seconds."""
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while self._in_flight:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"reward service {self.name!r}: {len(self._in_flight)} request(s) "
                                   f"still in flight after {timeout} s")
            self._pump(_POLL_SLICE if left is None else min(left, _POLL_SLICE))
        return self.poll()

    def stats(self) -> dict[str, float]:
        """Counters since the start: requests, batches, batch sizes, latency (submit -> result
        sent by the worker, ms; p95 over the last 4096 requests), queue high-water marks,
        worker errors, time the learner spent blocked in submit, worker busy share."""
        n_lat = min(self._lat_n, LATENCY_WINDOW)
        up = max(time.monotonic() - self._t_start, 1e-9)
        sizes = np.arange(self.max_batch + 1)
        return {
            "requests": self._n_submitted,
            "completed": self._n_completed,
            "failed": self._n_failed,
            "refused": self._n_refused,
            "in_flight": len(self._in_flight),
            "batches": self._n_batches,
            "mean_batch_size": float((self._batch_hist * sizes).sum() / max(self._n_batches, 1)),
            "full_batches": int(self._batch_hist[self.max_batch]),
            "latency_mean_ms": 1e3 * self._lat_sum / max(self._lat_n, 1),
            "latency_p95_ms": float(1e3 * np.percentile(self._lat[:n_lat], 95)) if n_lat else 0.0,
            "max_in_flight": self._max_in_flight,
            "worker_queue_high_water": self._max_worker_depth,
            "worker_errors": self._n_error_batches,
            "blocked_s": self._blocked_s,
            "worker_busy_share": (self._busy_s - self._busy0) / up,
        }

    def reset_stats(self) -> None:
        """Zero the counters, histogram, latencies and high-water marks (e.g. after a warm-up,
        or per logging interval); requests in flight are unaffected."""
        self._n_submitted = self._n_completed = self._n_failed = self._n_batches = 0
        self._n_error_batches = self._n_refused = 0
        self._batch_hist[:] = 0
        self._lat_n, self._lat_sum = 0, 0.0
        self._max_in_flight = len(self._in_flight)
        self._max_worker_depth = 0
        self._blocked_s = 0.0
        self._busy0 = self._busy_s
        self._t_start = time.monotonic()

    def batch_size_histogram(self) -> np.ndarray:
        """Counts of batches by size (index = size, 0..max_batch)."""
        return self._batch_hist.copy()

    # ------------------------------------------------------------------ lifetime
    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker (requests still in flight are dropped) and release it. Idempotent;
        also runs when the service is garbage-collected or the interpreter exits."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _shutdown(self._proc, self._req, self._res, timeout)
        self._in_flight.clear()
        self._ready.clear()
        self._errors.clear()
        self._n_ready = 0

    def __enter__(self) -> "RewardService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "dead" if self._dead is not None else f"pid {self.pid}"
        return (f"RewardService({self.name!r}, {state}, max_batch={self.max_batch}, "
                f"max_wait_ms={self.max_wait_ms}, max_pending={self.max_pending}, "
                f"in_flight={len(self._in_flight)})")


def _check_spec(spec) -> tuple[tuple[int, ...], np.dtype]:
    try:
        shape, dtype = spec
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise ValueError(f"payload_spec must be (shape, dtype), e.g. ((15, 96, 96), 'uint8'); got "
                         f"{spec!r} ({e})") from None
    if min(shape, default=1) < 1 or dtype.hasobject:
        raise ValueError(f"payload_spec needs positive dimensions and a plain dtype, got {spec!r}")
    return shape, dtype


def _short_repr(obj, n: int = 120) -> str:
    r = repr(obj)
    return r if len(r) <= n else r[:n] + "..."


# ---------------------------------------------------------------------------------------- BEV-CLIP
@dataclass(frozen=True)
class BevClipEmbedder:
    """Picklable factory: in the worker, loads BEV-CLIP (``weights``: a resolved checkpoint path)
    with ``threads`` torch threads and returns ``fn(frames) -> (N, dim)`` unit embeddings
    (``dtype``). Its ``payload_spec`` makes the service carry frames in shared memory."""

    bev_shape: tuple[int, int, int]
    weights: str
    threads: int = 1
    dtype: str = "float32"

    @property
    def payload_spec(self):
        return self.bev_shape, "uint8"

    def __call__(self):
        import torch

        from .vlm.bev_clip import BevClip

        torch.set_num_threads(self.threads)
        model = BevClip.load(self.weights, bev_shape=self.bev_shape)
        dtype = np.dtype(self.dtype)

        def embed(frames):
            x = np.asarray(frames) if isinstance(frames, np.ndarray) else np.stack(frames)
            return model.embed(x, batch_size=max(len(x), 1)).astype(dtype, copy=False)

        return embed


def bev_clip_embedder(bev_shape, weights=None, threads: int = 1,
                      dtype: str = "float32") -> BevClipEmbedder:
    """The factory for the main use: embed batches of uint8 BEV frames with BEV-CLIP in the worker.

    ``weights``: a checkpoint path or name (None: the default ``bev_clip_cpu.pt``), resolved here,
    in the learner, so a missing file fails now with the folders searched, and the worker loads
    exactly that file. ``dtype``: float32 or float16 (what the replay buffer stores)."""
    shape = tuple(int(s) for s in bev_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"bev_shape must be (C, H, W), got {tuple(bev_shape)}")
    if np.dtype(dtype) not in (np.float32, np.float16):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    from .vlm.bev_clip import find_weights

    return BevClipEmbedder(shape, str(find_weights(weights).resolve()), int(threads),
                           np.dtype(dtype).name)
