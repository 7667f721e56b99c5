"""Operators that take memory on purpose: ``fields["mb"]`` written (every page), held ``fields["sec"]``."""

import os
import time

LEAKED = []  # what a leaking subject leaves in its worker


def hold(subject):
    start = time.monotonic()
    block = b"x" * (int(subject.fields.get("mb", 0)) << 20)
    if subject.fields.get("leak"):
        LEAKED.append(block)
    time.sleep(float(subject.fields.get("sec", 0.3)))
    return {"start": start, "end": time.monotonic(), "pid": os.getpid(), "mb": len(block) >> 20}
