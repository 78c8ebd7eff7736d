"""Segment ids: 32 hex digits, time-ordered (48-bit milliseconds then 80 random bits), unique across sites."""

from __future__ import annotations

import os
import time


def new_segment_id() -> str:
    return f"{int(time.time() * 1000) & 0xFFFFFFFFFFFF:012x}{os.urandom(10).hex()}"
