"""The web UI, as a person uses it: the README's `dagster dev` block in a fresh clone, headless Chromium.

The UI is started the README's way (activated shell, `dagster dev` from the repo root, the instance the
activate script creates), the six assets must appear in one lineage graph, and "Materialize all" on
the tiny raw root (the clone's default `.zero/raw`) must end in a successful run.
"""

import shutil
import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from playwright.sync_api import sync_playwright

from readme_shell import ASSETS, BackgroundBlock, block, copy_repo, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [  # a closed network: no background fetches, no sandbox as root
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


@pytest.fixture
def dagster_dev(tiny_raw_root, tmp_path):
    repo = copy_repo(tmp_path / "repo")
    shutil.copytree(tiny_raw_root, repo / ".zero" / "raw")
    port = free_port()
    server = BackgroundBlock(block("ui"), repo, tmp_path / "dagster-dev.log", DAGSTER_CLI_DEV_PORT=str(port))
    try:
        server.wait_for_http(f"http://127.0.0.1:{port}/server_info", timeout_s=120)
        yield f"http://127.0.0.1:{port}", repo / ".dagster_home"
    finally:
        server.stop()


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
        run = _wait_for_run(home, timeout_s=900)
        page.goto(f"{url}/runs/{run.run_id}", wait_until="domcontentloaded")  # the run page a user follows
        page.get_by_text("Success", exact=True).first.wait_for(timeout=60_000)
        page.screenshot(path=str(home / "run.png"))
        browser.close()
    assert run.is_success, f"run ended as {run.status}"
    with DagsterInstance.from_config(str(home)) as instance:
        assert all(instance.get_latest_materialization_event(AssetKey(a)) for a in ASSETS)


def _wait_for_run(home: Path, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    with DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            runs = instance.get_runs()
            if runs and runs[0].is_finished:
                return runs[0]
            time.sleep(3)
    raise TimeoutError(f"the run launched from the UI did not finish within {timeout_s}s")
