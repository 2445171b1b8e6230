"""django-celery-beat: two real ``celery beat`` processes on one database schedule
(SQLite) with :class:`RedlockDatabaseScheduler`, and one real worker; each tick runs
exactly once.

The project is tests/apps/djangoproj (settings from the environment). The schedule is
migrated into a temporary SQLite file and given one entry, an IntervalSchedule of
2 s, in a subprocess: Django's settings are process-wide, so this process never
sets Django up. What ran is judged from the observer Redis only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServerFactory, wait_all_ready
from tests.support.observe import settles

pytest.importorskip("django_celery_beat", reason="django-celery-beat is not installed")

pytestmark = pytest.mark.slow

CHECKOUT = Path(__file__).resolve().parents[2]
#: The Django project runs as a top-level package, ``djangoproj``, as a user's would.
APPS_DIR = CHECKOUT / "tests" / "apps"
SCHEDULER = "celery_redlock.contrib.django_celery_beat:RedlockDatabaseScheduler"
PERIOD = 2
#: Ticks to see executed before judging (the last one is not judged: a duplicate of
#: it could still be on its way).
TICKS = 5
ANY_OUTCOME = "won|sent by another beat"

SETUP = f"""
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0, interactive=False)
from django_celery_beat.models import IntervalSchedule, PeriodicTask
every = IntervalSchedule.objects.create(every={PERIOD}, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="count", task="ticks.count", interval=every)
"""


def test_two_database_beats_send_each_tick_once(
    redis_server_factory: RedisServerFactory, redis_nodes: RedisNodes, tmp_path: Path
) -> None:
    broker = redis_server_factory()
    observer_server = redis_server_factory()
    observer = observer_server.client(decode_responses=True)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "djangoproj.settings",
        "DJANGO_DB_PATH": str(tmp_path / "schedule.sqlite3"),
        "BROKER_URL": broker.url,
        "REDLOCK_NODES": ",".join(redis_nodes.urls),
        "OBSERVER_URL": observer_server.url,
        "PYTHONPATH": os.pathsep.join([str(APPS_DIR), str(CHECKOUT)]),
    }
    subprocess.run([sys.executable, "-c", SETUP], env=env, check=True, timeout=120)
    worker = CeleryProcess.worker("djangoproj", log_path=tmp_path / "w1.log", cwd=APPS_DIR, env=env)
    beats = [
        CeleryProcess.beat(
            "djangoproj",
            name=name,
            scheduler=SCHEDULER,
            log_path=tmp_path / f"{name}.log",
            pidfile=tmp_path / f"{name}.pid",
            cwd=APPS_DIR,
            env=env,
        )
        for name in ("beat1", "beat2")
    ]
    processes = [worker, *beats]
    try:
        wait_all_ready(processes)
        deadline = time.monotonic() + 60 + TICKS * PERIOD
        while True:
            runs = [line.split() for line in observer.lrange("runs", 0, -1)]
            # Enough ticks ran, and both beats have been at it for a few of them.
            looked = [_ticks(beat, ANY_OUTCOME) for beat in beats]
            if len({tick for tick, _ in runs}) >= TICKS and min(map(len, looked)) >= 3:
                break
            assert time.monotonic() < deadline, f"ticks seen so far: {runs}"
            time.sleep(0.1)
        last = sorted(int(tick) for tick, _ in runs)[-1]  # may still be arriving
        first = sorted(int(tick) for tick, _ in runs)[0]

        def ran() -> Counter[int]:
            return Counter(int(line.split()[0]) for line in observer.lrange("runs", 0, -1))

        def sent_not_run() -> list[int]:
            sent = {tick for beat in beats for tick in _ticks(beat, ANY_OUTCOME)}
            return sorted(t for t in range(first, last) if t in sent and t not in ran())

        # A tick a beat logged as sent (won, or found taken) runs; one none did (each
        # logged it missed, or a loaded machine held it past the whole period: beat
        # does not catch a tick up) may be missing. None runs twice.
        none: list[int] = []
        settles(sent_not_run, none, "ticks a beat logged as sent that never ran")
        per_tick = ran()  # "None" would fail here
        judged = [tick for tick in sorted(per_tick) if tick < last]
        assert {tick: per_tick[tick] for tick in judged} == dict.fromkeys(judged, 1)
        won = Counter(tick for beat in beats for tick in _ticks(beat, "won"))
        assert all(won[tick] == 1 for tick in judged), won
        # Once both had started, each beat looked at a tick at most once; of those both
        # looked at, one won it and the other found it taken.
        both = [tick for tick in judged if tick >= max(seen[0] for seen in looked)]
        assert len(both) >= 2, looked
        for beat in beats:
            seen = _ticks(beat, ANY_OUTCOME + "|not sent: [^:]+")
            assert len(seen) == len(set(seen)), (beat.name, seen)
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            print(f"--- {process.name} log tail ---\n{process.tail(30)}")


def _ticks(beat: CeleryProcess, outcome: str) -> list[int]:
    """The ticks of entry ``count`` that ``beat`` logged with ``outcome`` (a regex)."""
    pattern = re.compile(rf"beat tick (?:{outcome}): entry 'count' tick (\d+)")
    return [int(found[1]) for found in map(pattern.search, beat.log().splitlines()) if found]
