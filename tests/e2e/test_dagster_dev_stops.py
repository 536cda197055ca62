"""Ctrl-C stops `dagster dev`: the README's block in a fresh clone, with the raw-data sensor on (its first
tick's runs done, its ticks going on) and a run in flight (its validation job decoding), gets SIGINT on
its process group as a terminal sends it, and 10 s later no process of its session is left: not the
webserver, the daemon, the code server, the run worker, nor the job and its decode workers (Dagster's
code-server restart race gets longer limits: see RESTART_WARNING).

The automation sensor stays off here: a run worker it launches at the moment of Ctrl-C is still
importing the code location, and Dagster holds a run worker's SIGINT until its run starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.readme_shell import BackgroundBlock, block, clone_environment, copy_repo, free_port

STOP_LIMIT_S = 10.0
# Dagster's own race (dagster/_cli/proxy_server_manager.py): its thread that restarts a crashed code
# server wakes every 5 s, and on a loaded host it can wake after Ctrl-C has stopped the code server but
# before `dagster dev` has stopped the webserver and daemon. It then starts a new code server, which
# Ctrl-C never reached: `dagster dev` waits for it to load before exiting, and the new server exits once
# its heartbeat (45 s) lapses. That case gets these limits; the processes Ctrl-C reached keep 10 s.
RESTART_WARNING = "Restarting the code server process"
RESTART_LIMIT_S = 60.0
RESTARTED_SERVER_LIMIT_S = 150.0
START_LIMIT_S = 300.0
LOCATION = {"repositoryLocationName": "zero_assets", "repositoryName": "__repository__"}
SENSOR = "new_raw_data_sensor"
RUNS_QUERY = """query($statuses: [RunStatus!]) { runsOrError(filter: {statuses: $statuses}) {
    ... on Runs { results { runId } } } }"""


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    assert "errors" not in answer, answer
    return answer["data"]


def session_processes(session: int) -> dict[int, str]:
    """Every live process of the session (zombies left out: they are gone, waiting to be reaped) -> its command."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == session and fields[0] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except (OSError, ValueError):
            continue
    return found


def stop_limit(pid: int, in_flight: dict[int, str], restarted: bool) -> float:
    """Seconds after SIGINT that the process may live: see RESTART_WARNING."""
    if not restarted:
        return STOP_LIMIT_S
    if pid not in in_flight:
        return RESTARTED_SERVER_LIMIT_S
    return RESTART_LIMIT_S if in_flight[pid].rstrip().endswith("dagster dev") else STOP_LIMIT_S


IN_PROGRESS = ["QUEUED", "NOT_STARTED", "STARTING", "STARTED"]


def runs(port: int, statuses: list[str]) -> list[str]:
    return [run["runId"] for run in graphql(port, RUNS_QUERY, {"statuses": statuses})["runsOrError"]["results"]]


def launch_validation(port: int, source: str) -> str:
    launched = graphql(
        port,
        """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
             ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
        {
            "p": {
                "selector": {
                    **LOCATION,
                    "jobName": "__ASSET_JOB",
                    "assetSelection": [{"path": ["raw_image_index"]}, {"path": ["validated_images"]}],
                },
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": source}]},
            }
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


@pytest.mark.slow
def test_ctrl_c_stops_dagster_dev_with_sensors_on_and_a_run_in_flight(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    env = clone_environment(repo)
    venv = repo / ".venv" / "bin"
    subprocess.run(
        [str(venv / "zero-assets"), "make-demo-data", "--out", str(repo / ".zero" / "raw"), "--images", "60"],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    server = BackgroundBlock(block("ui"), repo, tmp_path / "dagster-dev.log", DAGSTER_DG_DEV_PORT=str(port))
    try:
        server.wait_for_http(f"http://127.0.0.1:{port}/server_info", START_LIMIT_S)
        started = graphql(
            port,
            """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
                 ... on Sensor { sensorState { status } } } }""",
            {"s": {**LOCATION, "sensorName": SENSOR}},
        )["startSensor"]
        assert started.get("sensorState", {}).get("status") == "RUNNING", started
        sources = sorted(p.name for p in (repo / ".zero" / "raw").iterdir() if p.is_dir())
        deadline = time.monotonic() + START_LIMIT_S
        while len(runs(port, ["SUCCESS"])) < len(sources) or runs(port, IN_PROGRESS):
            assert time.monotonic() < deadline, f"the sensor's first runs did not finish:\n{server.tail()}"
            time.sleep(1)
        launch_validation(port, sources[0])
        deadline = time.monotonic() + START_LIMIT_S
        while not any("training_code.validate" in c for c in session_processes(server.process.pid).values()):
            assert time.monotonic() < deadline, f"no validation job started:\n{server.tail()}"
            assert server.process.poll() is None, server.tail()
            time.sleep(0.5)
        time.sleep(2)  # the job's decode workers start
        in_flight = session_processes(server.process.pid)
        os.killpg(server.process.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        interrupted, gone = time.monotonic(), {}
        while left := session_processes(server.process.pid):
            elapsed = time.monotonic() - interrupted
            gone |= {pid: elapsed for pid in in_flight if pid not in left and pid not in gone}
            restarted = RESTART_WARNING in server.log.read_text(errors="replace")
            if any(elapsed >= stop_limit(pid, in_flight, restarted) for pid in left):
                break
            time.sleep(0.1)
        gone |= {pid: time.monotonic() - interrupted for pid in in_flight if pid not in left and pid not in gone}
        timeline = "\n".join(
            f"{gone[pid]:5.1f} s  {in_flight[pid][:110]}" if pid in gone else f"alive  {in_flight[pid][:110]}"
            for pid in sorted(in_flight, key=lambda pid: gone.get(pid, RESTART_LIMIT_S))
        )
        print(f"dagster dev: {len(in_flight)} processes in flight; gone after SIGINT:\n{timeline}")
        assert not left, (
            f"{time.monotonic() - interrupted:.0f} s after SIGINT these processes of dagster dev are alive:\n"
            + "\n".join(f"{pid} {command}" for pid, command in left.items())
            + f"\n{timeline}\n{server.tail()}"
        )
    finally:
        for pid in session_processes(server.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.stop()
