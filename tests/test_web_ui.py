"""The web UI, as a person uses it: the README's `dagster dev` block in a fresh clone, headless Chromium.

The UI is started the README's way (activated shell, `dagster dev` from the repo root, the instance the
activate script creates), the sources are registered the README's way (`zero-assets sources
--register`), every asset must appear in one lineage graph, and "Materialize all" on the tiny raw root
(the clone's default `.zero/raw`) opens the launch dialog for the sources: with every source chosen
it launches a backfill that must end with every source's assets and the tail materialized. The
partitions view of `raw_image_index` then shows each source with its status.
"""

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from dagster._core.execution.backfill import BulkActionStatus
from playwright.sync_api import sync_playwright

from readme_shell import ASSETS, PER_SOURCE, BackgroundBlock, block, clone_environment, copy_repo, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [  # a closed network: no background fetches, no sandbox as root
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
SOURCES = ["line_a_camera", "line_b_camera", "warehouse_scanner"]  # the tiny demo's top-level folders
FINISHED = {BulkActionStatus.COMPLETED, BulkActionStatus.COMPLETED_SUCCESS, BulkActionStatus.COMPLETED_FAILED,
            BulkActionStatus.FAILED, BulkActionStatus.CANCELED}


@pytest.fixture
def dagster_dev(tiny_raw_root, tmp_path):
    repo = copy_repo(tmp_path / "repo")
    shutil.copytree(tiny_raw_root, repo / ".zero" / "raw")
    port = free_port()
    server = BackgroundBlock(block("ui"), repo, tmp_path / "dagster-dev.log", DAGSTER_CLI_DEV_PORT=str(port))
    try:
        server.wait_for_http(f"http://127.0.0.1:{port}/server_info", timeout_s=120)
        registered = subprocess.run(["bash", "-elc", "source .venv/bin/activate && zero-assets sources --register"], cwd=repo,
                                    env=clone_environment(repo), capture_output=True, text=True, timeout=120)
        assert registered.returncode == 0, registered.stderr
        assert [line.split("\t")[0] for line in registered.stdout.splitlines()] == SOURCES
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
        for asset in [*ASSETS, "raw_data"]:  # every asset is listed and drawn
            page.get_by_text(asset, exact=True).first.wait_for(timeout=60_000)
        page.get_by_role("button", name="Materialize all").click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Partition selection").wait_for(timeout=30_000)
        dialog.get_by_role("button", name="All", exact=True).click()  # every source
        dialog.get_by_text(f"{len(SOURCES)} partitions").wait_for(timeout=30_000)
        page.screenshot(path=str(home / "launch-dialog.png"))
        dialog.get_by_role("button", name="Launch backfill").click()
        backfill = _wait_for_backfill(home, timeout_s=1200)
        page.goto(f"{url}/runs/b/{backfill.backfill_id}", wait_until="domcontentloaded")  # the backfill page a user follows
        page.get_by_text(backfill.backfill_id).first.wait_for(timeout=60_000)
        page.screenshot(path=str(home / "backfill.png"))
        # The partitions view of the index: one row per source, each with its status.
        page.goto(f"{url}/assets/raw_image_index?view=partitions", wait_until="domcontentloaded")
        for source in SOURCES:
            page.get_by_text(source, exact=True).first.wait_for(timeout=60_000)
        page.get_by_text(f"Materialized ({len(SOURCES)})", exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("Failed (0)", exact=True).first.wait_for(timeout=60_000)
        page.screenshot(path=str(home / "partitions.png"))
        browser.close()
    assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, f"backfill ended as {backfill.status}"
    with DagsterInstance.from_config(str(home)) as instance:
        for asset in PER_SOURCE:
            for source in SOURCES:
                records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[source]), limit=1)
                assert records.records, f"{asset} of source {source} materialized"
        assert all(instance.get_latest_materialization_event(AssetKey(a)) for a in ASSETS)
        assert all(run.is_success for run in instance.get_runs()), "every run of the backfill succeeded"


def _wait_for_backfill(home: Path, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    with DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            backfills = instance.get_backfills()
            if backfills and backfills[0].status in FINISHED:
                return backfills[0]
            time.sleep(3)
    raise TimeoutError(f"the backfill launched from the UI did not finish within {timeout_s}s")
