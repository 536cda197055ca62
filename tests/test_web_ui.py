"""The web UI, as a person uses it: `dagster dev` on loopback, headless Chromium driven by Playwright.

It checks the six assets appear in one lineage graph, clicks "Materialize all" on a tiny raw root,
and waits for the run to succeed.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ASSETS = ["raw_image_index", "validated_images", "arrow_shards", "fsx_warm_state", "trained_checkpoint", "map_report"]
CHROMIUM_ARGS = [  # a closed network: no background fetches, no sandbox as root
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s")


@pytest.fixture
def dagster_dev(tiny_raw_root, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    (tmp_path / "fsx").mkdir()
    port = _free_port()
    env = {
        **os.environ, "DAGSTER_HOME": str(home), "ZERO_RAW_URI": str(tiny_raw_root),
        "ZERO_LAKE_URI": str(tmp_path / "lake"), "ZERO_FSX_MOUNT": str(tmp_path / "fsx"),
    }
    command = [str(Path(sys.executable).parent / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)]
    log = open(tmp_path / "dagster-dev.log", "wb")
    server = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/server_info", timeout_s=120)
        yield f"http://127.0.0.1:{port}", home
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.mark.slow
def test_materialize_all_from_the_browser(dagster_dev):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: apt-get install chromium (.ci/run does)")
    url, home = dagster_dev
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"{url}/asset-groups", wait_until="domcontentloaded")  # "Global asset lineage"
        skip = page.get_by_role("button", name="Skip")  # the first-visit newsletter dialog
        skip.wait_for(timeout=30_000)
        skip.click()
        for asset in ASSETS:  # every asset is listed and drawn
            page.get_by_text(asset, exact=True).first.wait_for(timeout=60_000)
        page.get_by_role("button", name="Materialize all").click()
        page.get_by_text("Launched run", exact=False).first.wait_for(timeout=60_000)
        page.screenshot(path=str(home / "graph.png"))
        browser.close()

    deadline = time.monotonic() + 600
    with DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            runs = instance.get_runs()
            if runs and runs[0].is_finished:
                break
            time.sleep(3)
        assert runs and runs[0].is_success, f"run ended as {runs[0].status if runs else 'never launched'}"
        assert all(instance.get_latest_materialization_event(AssetKey(a)) for a in ASSETS)
