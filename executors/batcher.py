"""Per-stage batching on an executor: up to ``max_batch_size`` requests, waiting at most
``max_wait_ms`` after the first one for more (Clipper's delayed batching)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field


@dataclass
class WorkItem:
    """One request's ready inputs for one stage."""

    header: dict
    inputs: list
    path: tuple = ()
    trace: list = field(default_factory=list)
    after_head: bool = False  # first_valid stages: the head (choice) is already applied


class Batcher:
    """A thread that drains a stage's queue into batches and hands them to ``run``."""

    def __init__(self, hosted, run, stopping: threading.Event):
        self.hosted = hosted
        self.config = hosted.stage.batch
        self.run = run
        self.queue: queue.Queue[WorkItem] = queue.Queue()
        self._stopping = stopping
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{hosted.stage.name}", daemon=True)
        self.thread.start()

    def put(self, item: WorkItem) -> None:
        self.queue.put(item)

    def __len__(self) -> int:
        return self.queue.qsize()

    def _loop(self) -> None:
        max_size, wait = self.config.max_batch_size, self.config.max_wait_ms / 1000
        while not (self._stopping.is_set() and self.queue.empty()):
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
            deadline = time.perf_counter() + wait
            while len(batch) < max_size:
                try:  # take what is already queued without waiting
                    batch.append(self.queue.get_nowait())
                    continue
                except queue.Empty:
                    pass
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    batch.append(self.queue.get(timeout=left))
                except queue.Empty:
                    break
            self.run(self.hosted, batch)
