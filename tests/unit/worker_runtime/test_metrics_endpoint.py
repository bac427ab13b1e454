"""The launcher serves the pod's Prometheus metrics while the example trains."""

from __future__ import annotations

import re
import time
import urllib.request

from localjob import LocalJob, free_port


def scrape(port: int) -> str | None:
    """The endpoint's text; None when nothing answered, or the answer was cut off with no body (the
    launcher exiting as it served: every gauge exists from the start, so a served page is never empty)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read().decode() or None
    except OSError:
        return None


def sample(text: str, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def test_metrics_endpoint_shows_steps_moving_and_the_checkpoint_stall(job: LocalJob) -> None:
    port = free_port()
    job.start_node(
        "a",
        ["--steps", "20", "--step-delay", "0.2"],
        nnodes="1",
        env={"PHALANX_METRICS_PORT": str(port)},
    )
    steps: list[float] = []
    stalls: list[float] = []
    phases: set[str] = set()
    deadline = time.monotonic() + 120
    while job.nodes["a"].poll() is None and time.monotonic() < deadline:
        text = scrape(port)
        if text is not None:
            step = sample(text, "phalanx_worker_step")
            stall = sample(text, "phalanx_worker_checkpoint_stall_seconds")
            assert step is not None and stall is not None, text
            steps.append(step)
            stalls.append(stall)
            phases.update(re.findall(r'^phalanx_worker_phase\{phase="(\w+)"\} 1\.0$', text, re.MULTILINE))
        time.sleep(0.3)
    assert job.wait_node("a", 30) == 0, job.node_output("a")

    moving = [step for step in steps if step > 0]
    assert len(set(moving)) >= 2, f"the step never moved while scraped: {steps}"
    assert moving == sorted(moving), f"the step went backwards: {steps}"
    assert max(stalls) > 0, "the checkpoint stall was never reported"
    assert "training" in phases, phases
    assert scrape(port) is None, "the endpoint outlived the launcher"
