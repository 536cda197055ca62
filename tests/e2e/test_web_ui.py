"""The web UI, as a person uses it: the README's `dagster dev` block in a fresh clone, headless Chromium.

The UI is started the README's way (activated shell, `dagster dev` from the repo root, the instance the
activate script creates), the sources are registered the README's way (`zero-assets sources
--register`), every asset must appear in one lineage graph, and "Materialize all" on the tiny raw root
(the clone's default `.zero/raw`) opens the launch dialog for the sources: with every source chosen
it launches a backfill that must end with every source's assets and the tail materialized. The
partitions view of `raw_image_index` then shows each source with its status.

Then what the UI shows of the result: every materialization carries Dagster's standard row count, size
and location (asked through the UI's GraphQL API); `map_report` and `validated_images` show their
tables as tables and their pictures as images (asserted in the rendered page's DOM, screenshots saved
under the test's temp folder); and after a job script is edited and the code location reloaded, its
asset reports stale with a code-version cause.
"""

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from dagster._core.execution.backfill import BulkActionStatus
from helpers.readme_shell import ASSETS, PER_SOURCE, BackgroundBlock, block, clone_environment, copy_repo, free_port
from playwright.sync_api import sync_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [  # a closed network: no background fetches, no sandbox as root
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SOURCES = ["line_a_camera", "line_b_camera", "warehouse_scanner"]  # the tiny demo's top-level folders
FINISHED = {
    BulkActionStatus.COMPLETED,
    BulkActionStatus.COMPLETED_SUCCESS,
    BulkActionStatus.COMPLETED_FAILED,
    BulkActionStatus.FAILED,
    BulkActionStatus.CANCELED,
}


@pytest.fixture
def dagster_dev(tiny_raw_root, tmp_path):
    repo = copy_repo(tmp_path / "repo")
    shutil.copytree(tiny_raw_root, repo / ".zero" / "raw")
    port = free_port()
    server = BackgroundBlock(block("ui"), repo, tmp_path / "dagster-dev.log", DAGSTER_DG_DEV_PORT=str(port))
    try:
        server.wait_for_http(f"http://127.0.0.1:{port}/server_info", timeout_s=120)
        registered = subprocess.run(
            ["bash", "-elc", "source .venv/bin/activate && zero-assets sources --register"],
            cwd=repo,
            env=clone_environment(repo),
            capture_output=True,
            text=True,
            timeout=120,
        )
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
        # The graph's group; the campaign's rehearsal and tuning are a group of their own, run by hand.
        page.goto(f"{url}/locations/__repository__@zero_assets/asset-groups/zero", wait_until="domcontentloaded")
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
        backfill = _wait_for_backfill(home, timeout_s=600)  # about 3 min; inside pytest's 15-min limit
        page.goto(
            f"{url}/runs/b/{backfill.backfill_id}", wait_until="domcontentloaded"
        )  # the backfill page a user follows
        page.get_by_text(backfill.backfill_id).first.wait_for(timeout=60_000)
        page.screenshot(path=str(home / "backfill.png"))
        # The partitions view of the index: one row per source, each with its status.
        page.goto(f"{url}/assets/raw_image_index?view=partitions", wait_until="domcontentloaded")
        for source in SOURCES:
            page.get_by_text(source, exact=True).first.wait_for(timeout=60_000)
        page.get_by_text(f"Materialized ({len(SOURCES)})", exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("Failed (0)", exact=True).first.wait_for(timeout=60_000)
        page.screenshot(path=str(home / "partitions.png"))
        _assert_standard_metadata(url)
        _assert_tables_and_pictures(page, url, home)
        _assert_code_edit_shows_stale(page, url, home.parent)
        browser.close()
    assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, f"backfill ended as {backfill.status}"
    with DagsterInstance.from_config(str(home)) as instance:
        for asset in PER_SOURCE:
            for source in SOURCES:
                records = instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[source]), limit=1
                )
                assert records.records, f"{asset} of source {source} materialized"
        assert all(instance.get_latest_materialization_event(AssetKey(a)) for a in ASSETS)
        assert all(run.is_success for run in instance.get_runs()), "every run of the backfill succeeded"


STANDARD_KEYS = {
    "dagster/row_count": "IntMetadataEntry",
    "dagster/size_bytes": "IntMetadataEntry",
    "dagster/uri": "PathMetadataEntry",
}
LATEST_ENTRIES = """query($key: AssetKeyInput!, $partitions: [String!]) { assetOrError(assetKey: $key) { ... on Asset {
  assetMaterializations(partitions: $partitions, limit: 1) { partition metadataEntries { label __typename } } } } }"""
STALENESS = """{ assetNodes { assetKey { path } staleStatus staleCauses { key { path } category reason } } }"""


def _graphql(url: str, query: str, **variables) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    assert "errors" not in answer, answer["errors"]
    return answer["data"]


def _assert_standard_metadata(url: str) -> None:
    """Every asset's latest materialization (each source's, where partitioned) has the standard keys, typed."""
    for asset in ASSETS:
        for partitions in [[s] for s in SOURCES] if asset in PER_SOURCE else [None]:
            [latest] = _graphql(url, LATEST_ENTRIES, key={"path": [asset]}, partitions=partitions)["assetOrError"][
                "assetMaterializations"
            ]
            types = {entry["label"]: entry["__typename"] for entry in latest["metadataEntries"]}
            assert {key: types.get(key) for key in STANDARD_KEYS} == STANDARD_KEYS, (asset, partitions, types)


def _assert_tables_and_pictures(page, url: str, home: Path) -> None:
    """The latest materialization's metadata as the asset's events page draws it: tables as <table>,
    pictures as <img>."""
    for asset, partition, table_header in (("map_report", None, "AP@0.5"), ("validated_images", SOURCES[0], "reason")):
        page.goto(
            f"{url}/assets/{asset}?view=events" + (f"&partition={partition}" if partition else ""),
            wait_until="domcontentloaded",
        )
        pictures = page.locator('img[src^="data:image/"]')
        pictures.first.wait_for(timeout=60_000)
        page.locator(f'table th:text-is("{table_header}")').first.wait_for(timeout=60_000)
        for index in range(pictures.count()):  # drawn, not a broken image
            assert pictures.nth(index).evaluate("img => img.complete && img.naturalWidth > 0"), (asset, index)
        page.locator(f'table th:text-is("{table_header}")').first.scroll_into_view_if_needed()
        page.screenshot(path=str(home / f"{asset}-table.png"))
        pictures.first.scroll_into_view_if_needed()
        page.screenshot(path=str(home / f"{asset}-pictures.png"))


def _assert_code_edit_shows_stale(page, url: str, repo: Path) -> None:
    """Edit the evaluation script, reload the code location as the UI's button does: map_report is stale
    for its code version, and what feeds it is not."""
    script = repo / "training_code" / "evaluate.py"
    script.write_text(script.read_text() + "# an edit that changes no behaviour still changes the code version\n")
    [location] = [
        e["name"]
        for e in _graphql(url, "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }")[
            "workspaceOrError"
        ]["locationEntries"]
    ]
    reloaded = _graphql(
        url,
        "mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }",
        name=location,
    )
    assert reloaded["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", reloaded
    nodes = {"/".join(n["assetKey"]["path"]): n for n in _graphql(url, STALENESS)["assetNodes"]}
    assert nodes["map_report"]["staleStatus"] == "STALE", nodes["map_report"]
    assert {"category": "CODE", "key": {"path": ["map_report"]}, "reason": "has a new code version"} in nodes[
        "map_report"
    ]["staleCauses"]
    assert nodes["trained_checkpoint"]["staleStatus"] == "FRESH", nodes["trained_checkpoint"]
    # The asset page's "Unsynced" tag; hovering it lists the cause the way the UI words it.
    page.goto(f"{url}/assets/map_report", wait_until="domcontentloaded")
    unsynced = page.get_by_text("Unsynced (1)", exact=True).first
    unsynced.wait_for(timeout=60_000)
    unsynced.hover()
    page.get_by_text("1 code version change", exact=True).first.wait_for(timeout=30_000)
    page.screenshot(path=str(repo / ".dagster_home" / "map_report-stale.png"))


def _wait_for_backfill(home: Path, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    with DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            backfills = instance.get_backfills()
            if backfills and backfills[0].status in FINISHED:
                return backfills[0]
            time.sleep(3)
        runs = ", ".join(f"{run.run_id[:8]} {run.status.value}" for run in instance.get_runs())
    raise TimeoutError(f"the backfill launched from the UI did not finish within {timeout_s}s; its runs: {runs}")
