"""Stopping a process together with everything it started, including processes in sessions of their own.

NVFlare 2.9's simulator starts each site's worker with ``os.setsid``: the workers leave the simulator's process
group, so signalling that group (``os.killpg``) leaves them running, re-parented to init. Here the tree is walked
by parent process id instead, each process frozen (SIGSTOP) as it is found so that none can start another or be
re-parented unseen, and then every one is killed.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil


def frozen_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it, each stopped with SIGSTOP; walked again until a walk finds no new one
    (a stopped process cannot start another, so the list is then complete). Empty when ``pid`` is gone."""
    try:
        found = {pid: psutil.Process(pid)}
    except psutil.NoSuchProcess:
        return []
    fresh = list(found.values())
    while fresh:
        for proc in fresh:
            send(proc, signal.SIGSTOP)
        children = [child for proc in fresh for child in _children(proc)]
        fresh = [child for child in children if child.pid not in found]
        found.update((child.pid, child) for child in fresh)
    return list(found.values())


def kill_tree(pid: int, wait_s: float = 20.0) -> tuple[list[int], float]:
    """Kill ``pid`` and every process below it (:func:`frozen_tree`, then SIGKILL), waiting at most ``wait_s``
    seconds for them to be gone. Returns (the ids of those still there after the wait, seconds taken). A zombie
    (dead, not yet reaped by its parent) counts as gone; the caller reaps its own child (``Popen.wait``)."""
    started = time.monotonic()
    tree = frozen_tree(pid)
    for proc in tree:
        send(proc, signal.SIGKILL)
    deadline = started + wait_s
    left = [p for p in tree if _running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _running(p)]
    return [p.pid for p in left], time.monotonic() - started


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.NoSuchProcess:
        return []


def send(proc: psutil.Process, sig: int) -> None:
    """Send ``sig`` to ``proc``; nothing when it is gone (or its pid now belongs to another process)."""
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def _running(proc: psutil.Process) -> bool:
    return proc.is_running() and alive(proc.pid)  # is_running: the same process, not a new one with its pid


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
