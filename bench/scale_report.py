"""The report of ``python -m bench scale``: Markdown tables (included by
docs/benchmarks/scale.md) and one PNG figure (matplotlib, the ``bench`` extra, imported
only to draw).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot", "render_markdown"]


def _f(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def _latency(section: dict[str, Any], pinning: dict[str, Any]) -> list[str]:
    lines = [
        f"Latency vs nodes (non-blocking acquire + release of a free key, µs; load "
        f"{section['loadavg'][0]:g} -> {section['loadavg'][1]:g}). Floor: `SET NX PX` + "
        "`DEL` over bare sockets to the same N nodes, waiting for a quorum of replies "
        "(1 node: one blocking socket). "
        + (
            f"Pinned: servers on CPU {pinning['servers_cpus']}, client on {pinning['client_cpus']}."
            if pinning.get("pinned")
            else "Not pinned: servers and client share every CPU."
        ),
        "",
        "| nodes | ours p50 | p95 | floor p50 | p95 | ours / floor (p50) "
        "| pottery p50 | p95 | pottery / ours (p50) |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in section["rows"]:
        ours, floor, pottery = row["ours"], row["floor"], row["pottery"]
        lines.append(
            f"| {row['nodes']} | {_f(ours['p50_us'])} | {_f(ours['p95_us'])} "
            f"| {_f(floor['p50_us'])} | {_f(floor['p95_us'])} | {row['ours_over_floor_p50']:.2f} "
            f"| {_f(pottery['p50_us'])} | {_f(pottery['p95_us'])} "
            f"| {row['pottery_over_ours_p50']:.2f} |"
        )
    cpu = section.get("cpu_per_op") or {}
    if cpu:
        lines += [
            "",
            "Where the time goes (CPU per acquire + release from `getrusage`, µs: user = "
            "Python and the C it calls, system = the kernel's socket work; less "
            "sensitive to other work than wall time):",
            "",
            "| | wall | user | system | voluntary switches |",
            "|---|--:|--:|--:|--:|",
        ]
        for slug, row in cpu.items():
            who, n = slug.split("_")
            name = f"{'ours' if who == 'ours' else 'floor'}, {n} node{'s' if n != '1' else ''}"
            lines.append(
                f"| {name} | {_f(row['wall_us'])} | {_f(row['user_us'])} "
                f"| {_f(row['system_us'])} | {row['voluntary_switches']:.2f} |"
            )
    return lines


def _threads(section: dict[str, Any]) -> list[str]:
    names = section["names"]
    slugs = list(names)
    lines = [
        "",
        f"ops/s vs threads (each thread its own key; load {section['loadavg'][0]:g} -> "
        f"{section['loadavg'][1]:g}):",
        "",
        "| threads | " + " | ".join(f"{names[s]} ops/s | p95 µs" for s in slugs) + " | load |",
        "|--:|" + "--:|--:|" * len(slugs) + "--:|",
    ]
    for row in section["rows"]:
        cells = [f"{_f(row[s]['ops_per_s'], 0)} | {_f(row[s]['p95_us'])}" for s in slugs]
        lines.append(f"| {row['threads']} | " + " | ".join(cells) + f" | {row['loadavg']:g} |")
    first = section["rows"][0]
    if len(section["rows"]) > 1 and first["threads"] == 1:
        lines += [
            "",
            "ops/s over the same one's ops/s with 1 thread:",
            "",
            "| threads | " + " | ".join(names[s] for s in slugs) + " |",
            "|--:|" + "--:|" * len(slugs),
        ]
        for row in section["rows"][1:]:
            cells = [_f(row[s]["ops_per_s"] / first[s]["ops_per_s"], 2) for s in slugs]
            lines.append(f"| {row['threads']} | " + " | ".join(cells) + " |")
    return lines


def _renewals(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Renewal CPU vs leases held (5 nodes, ttl 3 s, one watchdog renewing every 1 s in "
        "batches; CPU = the whole process's `time.process_time` over the window):",
        "",
        "| leases held | renewals/s | CPU, % of a core | CPU µs / renewal | lost | load |",
        "|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        per = "-" if row["cpu_us_per_renewal"] is None else _f(row["cpu_us_per_renewal"])
        lines.append(
            f"| {row['leases']:,} | {_f(row['renewals_per_s'], 0)} "
            f"| {row['cpu_share_of_a_core'] * 100:.1f} | {per} | {row['lost']} "
            f"| {row['loadavg']:g} |"
        )
    return lines


def _hot_key(rows: list[dict[str, Any]], plan: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Hot key vs duplicates queued (real `celery worker`s: {plan['hot_workers']} prefork "
        f"x {plan['hot_concurrency']}, 5 lock nodes; same-key RedlockTask, "
        f"{plan['hot_body_s']:g} s body, redlock_retry_backoff_max 4 s; all duplicates "
        "published at once). Busy = share of first start to last end with a body inside; "
        "messages = published by the caller + by the workers (retries, wakes, fallbacks); "
        "ran once / overlaps read from the bodies' own stamps on an observer Redis; "
        "fairness = rank correlation of run order with publish order (1: first come, "
        "first run):",
        "",
        "| duplicates | redlock_handoff | busy | span s | broker messages | per task "
        "| ran once | ran twice | overlaps | fairness |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        timed_out = " (timed out)" if row["timed_out"] else ""
        lines.append(
            f"| {row['duplicates']} | {'on (default)' if row['handoff'] else 'off'} "
            f"| {row['busy_share'] * 100:.0f}%{timed_out} | {row['span_s']} "
            f"| {row['broker_messages']} | {row['messages_per_task']:.2f} "
            f"| {row['ran_once']} of {row['duplicates']} | {row['ran_twice_or_more']} "
            f"| {row['overlapping_bodies']} | {row.get('fairness', '-')} |"
        )
    return lines


def _handoff(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Hand-off latency (holder in one process, waiter blocked in `acquire(..., "
        "blocking=True, timeout=5)` in another; from the start of the holder's "
        "`release()` to the waiter's `acquire` returning; ms):",
        "",
        "| lock | nodes | p50 | p95 | max | samples | missed | load |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        if not row.get("samples"):
            lines.append(f"| {row['lock']} | {row['nodes']} | - | - | - | 0 | {row['missed']} |")
            continue
        lines.append(
            f"| {row['lock']} | {row['nodes']} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} "
            f"| {row['max_ms']:.2f} | {row['samples']} | {row['missed']} | {row['loadavg']:g} |"
        )
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    libs = machine["libraries"]
    lines = [
        "#### Scale benchmark",
        "",
        f"`python -m bench scale`, {report['started_at']}: {machine['cpu']}, "
        f"{machine['cpus']} CPUs, {machine['python']}, redis-server "
        f"{machine['redis_server']['version']} on loopback; celery-redlock "
        f"{libs['celery-redlock']}, redis-py {libs['redis']}, pottery {libs['pottery']}. "
        f"Load average {machine['loadavg_at_start'][0]:g} at the start, "
        f"{report['loadavg_at_end'][0]:g} at the end; each table gives its own. "
        f"Took {report['duration_s']:g} s.",
        "",
        "![Scale benchmark](bench/results/scale.png)",
        "",
    ]
    lines += _latency(report["latency_vs_nodes"], report.get("pinning", {}))
    lines += _threads(report["ops_vs_threads"])
    lines += _renewals(report["renewals"])
    lines += _hot_key(report["hot_key"], report["plan"])
    lines += _handoff(report["handoff_latency"])
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """One PNG, five panels: one per table."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    lat, thr, ren = axes[0][0], axes[0][1], axes[0][2]
    hot, hand = axes[1][0], axes[1][1]
    rows = report["latency_vs_nodes"]["rows"]
    nodes = [row["nodes"] for row in rows]
    for who, style, color in (
        ("ours", "o-", "C0"),
        ("floor", "s--", "C2"),
        ("pottery", "^:", "C1"),
    ):
        lat.plot(nodes, [row[who]["p50_us"] for row in rows], style, color=color, label=who)
        lat.plot(nodes, [row[who]["p95_us"] for row in rows], style, color=color, alpha=0.3)
    lat.set(
        title="acquire + release vs nodes (p50; faint: p95)",
        xlabel="nodes",
        ylabel="µs",
        yscale="log",
    )
    lat.set_xticks(nodes)
    lat.legend()
    section = report["ops_vs_threads"]
    threads = [row["threads"] for row in section["rows"]]
    for slug, name in section["names"].items():
        thr.plot(threads, [row[slug]["ops_per_s"] for row in section["rows"]], "o-", label=name)
    thr.set(title="throughput vs threads", xlabel="threads", ylabel="ops/s", yscale="log")
    thr.set_xticks(threads)
    thr.legend(fontsize=8)
    leases = [row["leases"] for row in report["renewals"]]
    ren.plot(leases, [row["cpu_share_of_a_core"] * 100 for row in report["renewals"]], "o-")
    ren.set_xticks(leases)
    ren.set(
        title="watchdog CPU vs leases held (ttl 3 s)",
        xlabel="leases",
        ylabel="% of a core",
        xscale="log",
    )
    for handoff, style in ((True, "o-"), (False, "s--")):
        picked = [row for row in report["hot_key"] if row["handoff"] is handoff]
        hot.plot(
            [row["duplicates"] for row in picked],
            [row["busy_share"] * 100 for row in picked],
            style,
            label=f"redlock_handoff {'on' if handoff else 'off'}",
        )
    hot.set(
        title="hot key: lock busy share",
        xlabel="duplicates queued",
        ylabel="% of span",
        xscale="log",
    )
    hot.set_xticks(sorted({row["duplicates"] for row in report["hot_key"]}))
    hot.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    hot.set_ylim(0, 105)
    hot.legend()
    measured = [row for row in report["handoff_latency"] if row.get("samples")]
    labels = [
        f"{row['lock']}\n({row['nodes']} node{'s' if row['nodes'] > 1 else ''})" for row in measured
    ]
    for offset, (stat, alpha) in enumerate((("p50", 1.0), ("p95", 0.45))):
        hand.bar(
            [i + offset * 0.4 for i in range(len(measured))],
            [row[f"{stat}_ms"] for row in measured],
            width=0.4,
            alpha=alpha,
            color="C0",
            label=stat,
        )
    hand.set_xticks([i + 0.2 for i in range(len(measured))], labels)
    hand.legend()
    hand.set(title="hand-off latency (release -> blocked acquire)", ylabel="ms", yscale="log")
    axes[1][2].axis("off")
    machine = report["machine"]
    axes[1][2].text(
        0,
        0.5,
        f"python -m bench scale\n{report['started_at']}\n{machine['cpu']}\n"
        f"{machine['cpus']} CPUs, load {machine['loadavg_at_start'][0]:g} -> "
        f"{report['loadavg_at_end'][0]:g}\n{machine['python']}\n"
        f"redis-server {machine['redis_server']['version']}",
        fontsize=10,
        va="center",
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
