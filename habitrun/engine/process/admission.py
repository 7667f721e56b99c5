"""Memory admission: a subject starts only while the predicted peaks of what runs, plus its own, fit the budget.

What each live worker holds is charged against ``memory_budget_mb``: an idle
worker its own resident memory (read from /proc when asked), a busy one the
largest predicted peak of the runs it holds (a measured peak includes the
worker's own memory) plus what the worker grew beyond a fresh one. A
subject goes to a free worker when the sum with it still fits.

Order and fairness: the queue is sorted by predicted peak, largest first,
so the big subjects start early and the small ones fill around them. When
the first in line does not fit, smaller ones that fit may pass it for
``PATIENCE_SEC`` (at least the stage's mean duration); after that nothing
more is admitted until it fits, so no subject waits forever behind a
stream of small ones.

Alone: a subject whose prediction exceeds the whole budget, one that was
killed for memory while others ran, and, while nothing of the stage is
known yet, the first one (the smallest input: a probe) run alone: they
start only once no other subject runs, and nothing starts beside them. No
probe where memory is plenty: while nothing is known and each worker slot's
share of the budget holds at least ``PROBE_ROOM`` fresh workers (counted
as no less than ``FRESH_WORKER_MB`` each: at least 600 MB), a subject
is charged half that share (no prediction, no error recorded; the other
half is room for workers' growth) and the workers fill at once; the first
measured peaks then predict the rest. Roomy: while every slot's largest
prediction (or share) fits half the budget, and what the workers hold (read
again once a second) fills under half of it, no subject can be held back:
``take`` just hands out the next one, without the per-subject sums. A
subject killed for memory while others ran is not charged: it goes back to
the queue to run alone, and the model learns from the kill. Killed while
alone, it is charged (an out-of-memory failure). Idle persistent workers
that grew by more than ``GROWN_FRACTION`` of the budget are recycled when
the first in line does not fit.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable

from habitrun.engine.contract import FailureKind, SubjectOutcome, SubjectTask
from habitrun.engine.process import protocol as P
from habitrun.engine.process.handle import WorkerHandle
from habitrun.engine.process.memory import MB, tree_rss_fast
from habitrun.engine.process.memstats import StageMemory
from habitrun.planner.memory_model import PeakModel

PATIENCE_SEC = 2.0  # the first in line may be passed by smaller subjects this long (or a mean duration)
SCAN = 256  # queued subjects looked at for one that fits past the first in line
GROWN_FRACTION = 0.1  # an idle worker grown by this much of the budget is recycled when memory is short
FRESH_WORKER_MB = 30.0  # a worker's own memory before any is measured
RESORT_SEC = 1.0  # a long queue is sorted again at most this often
REREAD_SEC = 0.1  # an idle worker's memory is read again no sooner
MAX_REMEMBERED = 256  # idle workers' memory remembered at most (then only the live ones and the least)
PROBE_ROOM = 20  # no probe while a slot's share of the budget holds this many fresh workers


class Admission:
    """One stage's admission of subjects into the pool's workers under a memory budget."""

    def __init__(self, budget_mb: float, model: PeakModel, stats: StageMemory,
                 workers: Callable[[], list[WorkerHandle]], mean_sec: Callable[[], float | None],
                 recycles: bool, slots: Callable[[], int] | None = None) -> None:
        self.budget = budget_mb
        self.slots = slots  # the pool's worker slots now (None: always probe when nothing is known)
        self.shared: set[str] = set()  # admitted on a slot's share, not a prediction
        self.model = model
        self.stats = stats
        self.workers = workers  # the pool's live workers
        self.mean_sec = mean_sec  # the stage's mean subject duration so far
        self.recycles = recycles  # persistent workers (an isolated one leaves after its subject anyway)
        self.predicted: dict[str, float | None] = {}  # subject -> prediction, as of the last sort
        self.admitted: dict[str, float | None] = {}  # subject -> its prediction when it started
        self.alone: set[str] = set(model.floor)  # run alone (killed for memory beside others)
        self.exclusive: WorkerHandle | None = None  # the worker running a subject alone
        self.waiting: dict[str, float] = {}  # subject -> since when it waits for memory with a worker free
        self.idle_mb: dict[int, float] = {}  # worker pid -> its resident MB when last seen idle
        self.read_at: dict[int, float] = {}  # worker pid -> when its memory was last read
        self.sorted_version = -1
        self.sorted_at = 0.0
        self.roomy = False  # as of the last sort: every slot may hold the largest prediction twice over
        self.room_checked_at = -RESORT_SEC  # when what the workers hold was last summed (roomy)
        self.room_ok = False

    # ------------------------------------------------------------- charges
    def base_mb(self) -> float:
        """A fresh worker's own memory: the least any idle worker was seen holding."""
        return min(self.idle_mb.values()) if self.idle_mb else FRESH_WORKER_MB

    def idle_rss(self, w: WorkerHandle) -> float:
        now = time.monotonic()
        if now - self.read_at.get(w.pid, -1.0) < REREAD_SEC:  # read a moment ago: /proc costs a few syscalls
            return self.idle_mb.get(w.pid, self.base_mb())
        self.read_at[w.pid] = now
        rss = tree_rss_fast(w.pid)
        if len(self.idle_mb) > MAX_REMEMBERED:  # isolated mode: a pid per subject; keep the live ones and the least
            fresh = self.base_mb()
            live = {x.pid for x in self.workers()}
            self.idle_mb = {pid: mb for pid, mb in self.idle_mb.items() if pid in live or mb == fresh}
            self.read_at = {pid: at for pid, at in self.read_at.items() if pid in live}
        if rss:
            self.idle_mb[w.pid] = rss / MB
            if not w.binding:
                self.model.set_baseline(self.base_mb())
        return self.idle_mb.get(w.pid, self.base_mb())

    def growth(self, w: WorkerHandle) -> float:
        return max(0.0, self.idle_mb.get(w.pid, 0.0) - self.base_mb())

    def runs_mb(self, w: WorkerHandle) -> float:
        """The largest predicted peak of the runs ``w`` holds (0: none)."""
        peak = 0.0
        for task in w.outstanding:
            peak = max(peak, self.admitted.get(task.subject_id) or self.base_mb())
        return peak

    def charge(self, w: WorkerHandle) -> float:
        if not w.outstanding:
            return self.idle_rss(w) if not w.dead else 0.0
        return self.runs_mb(w) + self.growth(w)

    def used(self) -> float:
        return sum(self.charge(w) for w in self.workers())

    def fits(self, w: WorkerHandle, predicted: float, used: float) -> bool:
        after = max(self.runs_mb(w), predicted) + self.growth(w)
        return used - self.charge(w) + after <= self.budget

    # ------------------------------------------------------------- order
    def predict(self, task: SubjectTask) -> float | None:
        sid = task.subject_id
        if sid in self.predicted and self.sorted_version == self.model.version:
            return self.predicted[sid]
        value = self.predicted[sid] = self.model.predict(sid)
        return value

    def share(self) -> float | None:
        """With nothing known, what a subject is charged instead of probing: its slot's share of a budget
        roomy against a fresh worker; None: too tight, probe."""
        if self.slots is None:
            return None
        share = self.budget / max(1, self.slots())
        worker = max(self.base_mb(), FRESH_WORKER_MB)  # a forked worker's RSS can be a few MB: not a yardstick
        return share / 2 if share >= PROBE_ROOM * worker else None

    def must_run_alone(self, sid: str, predicted: float | None) -> bool:
        return predicted is None or sid in self.alone or predicted > self.budget

    def charged(self, sid: str, predicted: float | None) -> tuple[float | None, bool]:
        """What ``sid`` is charged, and whether that is a slot's share (nothing known, no probe)."""
        if predicted is None and sid not in self.alone:
            share = self.share()
            if share is not None:
                return share, True
        return predicted, False

    def order(self, queue: deque[SubjectTask], now: float) -> None:
        """Sort the queue: largest predicted peak first, those to run alone last; before anything is
        known, the smallest feature first (the probe)."""
        model = self.model
        if self.sorted_version == model.version or (len(queue) > 500 and now - self.sorted_at < RESORT_SEC):
            return
        self.sorted_version, self.sorted_at = model.version, now
        self.predicted = {t.subject_id: model.predict(t.subject_id) for t in queue}
        if self.stats.predicted_max_mb is None and model.knows_anything:
            known = [p for p in self.predicted.values() if p is not None]
            self.stats.predicted_max_mb = max(known) if known else None
        self.roomy = self.is_roomy()
        if not model.knows_anything:
            features = model.features
            items = sorted(queue, key=lambda t: features.get(t.subject_id, float("inf")))
        else:
            budget, alone, predicted = self.budget, self.alone, self.predicted

            def rank(t: SubjectTask) -> tuple[bool, float]:
                p = predicted[t.subject_id]
                return (p is None or t.subject_id in alone or p > budget, -(p or 0.0))

            items = sorted(queue, key=rank)
        queue.clear()
        queue.extend(items)

    def is_roomy(self) -> bool:
        """Whether, by the current predictions, no subject can be held back (see the module's docstring)."""
        if self.alone or self.slots is None:
            return False
        if not self.model.knows_anything:
            largest = self.share()
        else:
            known = [v for v in self.predicted.values() if v is not None]
            largest = None if len(known) < len(self.predicted) else max(known, default=0.0)
        return largest is not None and largest * self.slots() <= self.budget / 2

    def still_roomy(self, now: float) -> bool:
        if not self.roomy or self.exclusive is not None:
            return False
        if now - self.room_checked_at >= RESORT_SEC:  # the workers' own memory may have grown
            self.room_checked_at = now
            self.room_ok = self.used() <= self.budget / 2
        return self.room_ok

    # ------------------------------------------------------------- taking
    def take(self, queue: deque[SubjectTask], w: WorkerHandle, now: float) -> SubjectTask | None:
        """The next subject for ``w`` (removed from ``queue``), or None: none may start on it now."""
        if not queue:
            return None
        if self.exclusive is not None:
            if not self.exclusive.dead and self.exclusive.outstanding:
                return None
            self.exclusive = None
        self.order(queue, now)
        if self.still_roomy(now):
            head = queue.popleft()
            predicted, shared = self.charged(head.subject_id, self.predict(head))
            return self.start(head, predicted, now, shared)
        used = self.used()  # also measures the idle workers (a fresh one's memory is the model's baseline)
        head = queue[0]
        predicted, shared = self.charged(head.subject_id, self.predict(head))
        others_run = any(x.outstanding for x in self.workers() if x is not w)
        if predicted is None or self.must_run_alone(head.subject_id, predicted) or not (
                others_run or w.outstanding or self.fits(w, predicted, used)):
            # Alone; or it cannot fit even with nothing running (the idle workers' own memory): then alone too.
            if w.outstanding or others_run or self.recycle_grown():  # grown idle workers go first
                self.wait(head, now, w)
                return None
            queue.popleft()
            self.exclusive = w
            self.stats.alone(head.subject_id, over=predicted is not None and predicted > self.budget)
            return self.start(head, predicted, now)
        if self.fits(w, predicted, used):  # not alone: known
            queue.popleft()
            return self.start(head, predicted, now, shared)
        self.wait(head, now, w)
        self.recycle_grown()
        patience = max(PATIENCE_SEC, self.mean_sec() or 0.0)
        if now - self.waiting.get(head.subject_id, now) >= patience:
            return None  # its turn: what runs drains until it fits
        for index, task in enumerate(itertools.islice(queue, 1, SCAN), start=1):
            p, shared = self.charged(task.subject_id, self.predict(task))
            if p is None or self.must_run_alone(task.subject_id, p):
                continue
            if self.fits(w, p, used):  # not alone: known
                del queue[index]
                return self.start(task, p, now, shared)
        return None

    def wait(self, task: SubjectTask, now: float, w: WorkerHandle) -> None:
        """``task`` could not start though ``w`` is ready for it: it waits for memory from now."""
        if not w.outstanding:
            self.waiting.setdefault(task.subject_id, now)

    def start(self, task: SubjectTask, predicted: float | None, now: float, shared: bool = False) -> SubjectTask:
        sid = task.subject_id
        self.admitted[sid] = predicted
        if shared:
            self.shared.add(sid)
        since = self.waiting.pop(sid, None)
        if since is not None:
            self.stats.waited(now - since)
        return task

    def recycle_grown(self) -> int:
        """Memory is short: retire idle persistent workers that grew well beyond a fresh one; how many."""
        if not self.recycles:
            return 0
        retired = 0
        for w in self.workers():
            if w.outstanding or w.leaving or not w.can_send:
                continue
            if self.growth(w) > GROWN_FRACTION * self.budget:
                w.retire()
                w.send((P.RETIRE,))
                self.idle_mb.pop(w.pid, None)
                self.stats.recycled += 1
                retired += 1
        return retired

    def wants_worker(self) -> bool:
        """Whether starting another worker may let a subject start (its own memory counts too)."""
        if self.exclusive is not None and not self.exclusive.dead and self.exclusive.outstanding:
            return False
        return self.budget - self.used() >= self.base_mb()

    # ------------------------------------------------------------- outcomes
    def after(self, w: WorkerHandle | None, outcome: SubjectOutcome) -> bool:
        """Learn from an outcome; True when it is an out-of-memory kill to retry alone, not to report."""
        sid = outcome.task.subject_id
        ran_alone = w is not None and w is self.exclusive
        if ran_alone and not w.outstanding:  # type: ignore[union-attr]
            self.exclusive = None
        predicted = self.admitted.pop(sid, None)
        if sid in self.shared:  # a share, not a prediction: no error, and no floor from it
            self.shared.discard(sid)
            predicted = None
        if outcome.ok:
            usage = outcome.usage
            peak = usage[3] / 1024 if usage is not None and usage[3] is not None else None
            if peak is not None:
                self.model.measured(sid, peak)
                if predicted is not None:
                    self.stats.error(predicted, peak)
            return False
        if outcome.kind != FailureKind.OOM or w is None:
            return False
        if w.watched.oom_note is not None:  # past its own worker_memory_limit_mb: alone it would be too
            return False
        self.model.killed(sid, w.watched.last_rss_mb, predicted)
        if sid in self.alone or ran_alone:
            self.alone.add(sid)
            return False  # it failed alone: charged
        self.alone.add(sid)
        self.stats.oom_retried_alone += 1
        return True
