"""The README and the docs pages are executable documentation: every shell block a user runs locally is run
here, exactly as printed, in a fresh `bash -lc` from the root of a copy of the repo whose default raw root
(`.zero/raw`) is the tiny demo. No Dagster or zero_assets variable is set: the defaults are what is tested.

Blocks run against one copy: `setup` (make demo, make test, the README's first block), then the blocks
that read what it wrote, whichever page they are on. `make test` in the copy runs one test file
(PYTEST_ADDOPTS), not this suite again.
"""

import shutil
import subprocess

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from helpers.readme_shell import (
    ASSETS,
    PER_SOURCE,
    BackgroundBlock,
    block,
    copy_repo,
    free_port,
    graphql_assets,
    run_block,
    shell_blocks,
    user_environment,
)

RUN_HERE = {"setup", "ui", "cli", "demo-data", "lineage"}  # block names (README, docs/) this module runs
UI_START_LIMIT_S = 60  # the promise: the UI answers within a minute
DEMO_SOURCES = ("line_a_camera", "line_b_camera", "warehouse_scanner")  # the tiny demo's top-level folders
EXTERNAL = ("raw_data",)  # observed, never materialized
REHEARSAL = ("training_rehearsal", "tuned_hyperparameters")  # the campaign group, left out of make demo


def test_every_shell_block_is_run_here_or_says_why_not():
    """The README's blocks and every docs page's: each is marked, and the named ones are the ones run here."""
    blocks = shell_blocks()
    pages = {b.page for b in blocks}
    assert "README.md" in pages and any(page.startswith("docs/") for page in pages), (
        f"the README's blocks and the docs pages' are read: {sorted(pages)}"
    )
    unmarked = [b.where for b in blocks if b.marker is None]
    assert not unmarked, (
        f"shell blocks at {unmarked} need `<!-- readme-test: NAME -->` or `<!-- not run locally: WHY -->`"
    )
    named = [b.name for b in blocks if b.marker == "readme-test"]
    assert sorted(named) == sorted(RUN_HERE), (
        f"blocks marked readme-test {sorted(named)} vs blocks this test runs {sorted(RUN_HERE)}"
    )
    assert all(b.name for b in blocks if b.marker == "not run locally"), "say why a block is not run"


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory, tiny_raw_root):
    """A copy of the repo after the README's first block: `make demo` on the tiny raw root, then `make test`."""
    copy = copy_repo(tmp_path_factory.mktemp("readme") / "repo")
    shutil.copytree(tiny_raw_root, copy / ".zero" / "raw")
    result = run_block(
        block("setup"), copy, timeout_s=1200, PYTEST_ADDOPTS="-q -p no:cacheprovider tests/dagster/test_definitions.py"
    )
    return copy, result


def _instance(repo):
    return DagsterInstance.from_config(str(repo / ".dagster_home"))


def _materialization_counts(repo) -> dict[str, int]:
    with _instance(repo) as instance:
        return {a: len(instance.fetch_materializations(AssetKey(a), limit=100).records) for a in ASSETS}


@pytest.mark.slow
def test_setup_block_materializes_the_graph_and_runs_the_tests(demo_repo):
    repo, result = demo_repo
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "final mAP@[.5:.95]" in result.stdout, "make demo ends with the summary"
    assert " passed" in result.stdout and " failed" not in result.stdout, "make test ran the selected tests"
    assert (repo / ".dagster_home" / "dagster.yaml").read_text() == (repo / "dagster.yaml").read_text()
    # make demo: one run per source (each per-source asset once per source), then the tail once
    assert _materialization_counts(repo) == {a: len(DEMO_SOURCES) if a in PER_SOURCE else 1 for a in ASSETS}
    with _instance(repo) as instance:
        assert sorted(instance.get_dynamic_partitions("raw_sources")) == list(DEMO_SOURCES), (
            "make demo registered the sources"
        )
        for source in DEMO_SOURCES:
            assert instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey("validated_images"), asset_partitions=[source]), limit=1
            ).records


@pytest.mark.slow
def test_cli_block_materializes_selections_against_the_demo_instance(demo_repo):
    repo, _ = demo_repo
    before = _materialization_counts(repo)
    result = run_block(block("cli"), repo, timeout_s=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    after = _materialization_counts(repo)
    # one source's two assets, 'key:training_set+' less the rehearsal, then 'raw_image_index+' for that source again
    expected = {a: 1 for a in ASSETS} | {"raw_image_index": 2, "validated_images": 2}
    assert {a: after[a] - before[a] for a in ASSETS} == expected
    with _instance(repo) as instance:

        def latest(asset):
            return instance.get_latest_materialization_event(AssetKey(asset)).asset_materialization.metadata

        assert (
            latest("validated_images")["upstream"].value["raw_image_index"]["uri"]
            == latest("raw_image_index")["dagster/uri"].value
        )
        assert latest("validated_images")["cache"].value == "hit", "unchanged inputs launch no job"
        assert latest("training_set")["cache"].value == "hit", (
            "the selection of sources rebuilt unchanged is the one already made"
        )
        assert latest("arrow_shards")["cache"].value == "hit", "and its shards are the ones already packed"
    assert "map_report" in result.stdout and "mAP" in result.stdout, "zero-assets summary printed"


@pytest.mark.slow
def test_lineage_block_answers_for_the_latest_checkpoint_and_an_image(demo_repo):
    repo, _ = demo_repo
    result = run_block(block("lineage"), repo, timeout_s=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "checkpoint " in result.stdout and "trained on" in result.stdout
    assert '"truncated"' in result.stdout, "the planted truncated JPEG is reported quarantined with its reason"


@pytest.mark.slow
def test_demo_data_block_writes_a_raw_root(demo_repo):
    repo, _ = demo_repo
    result = run_block(block("demo-data"), repo, timeout_s=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    raw = repo / ".zero" / "raw-small"
    sources = sorted(p.name for p in raw.iterdir())
    assert len(sources) == 3 and all((raw / s / "annotations.json").is_file() for s in sources)


def _latest_in_ui(repo, log) -> dict:
    """The README's `dagster dev` in `repo` on a free port (Dagster's own variable for `-p`): once it answers,
    each asset's latest materialization as its GraphQL API lists it."""
    port = free_port()
    server = BackgroundBlock(block("ui"), repo, log, DAGSTER_DG_DEV_PORT=str(port))
    try:
        server.wait_for_http(f"http://127.0.0.1:{port}/server_info", UI_START_LIMIT_S)
        return graphql_assets(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.mark.slow
def test_ui_block_serves_the_demo_materializations(demo_repo, tmp_path):
    repo, _ = demo_repo
    latest = _latest_in_ui(repo, tmp_path / "dagster-dev.log")
    assert set(latest) == set(ASSETS) | set(EXTERNAL) | set(REHEARSAL)
    assert all(latest[a] for a in ASSETS), f"every asset shows its latest materialization: {latest}"
    assert not any(latest[a] for a in REHEARSAL), "make demo leaves the rehearsal and the tuning out"


@pytest.mark.slow
def test_ui_block_serves_a_clone_where_make_demo_never_ran(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    assert not (repo / ".dagster_home").exists()
    latest = _latest_in_ui(repo, tmp_path / "dagster-dev.log")
    assert latest == {a: None for a in (*ASSETS, *EXTERNAL, *REHEARSAL)}
    assert (repo / ".dagster_home" / "dagster.yaml").is_file(), (
        "activate created the instance with the repo's dagster.yaml"
    )


def test_activate_warns_when_a_second_code_location_is_exported(tmp_path):
    """Dagster hides this failure (`dagster dev` runs on with no UI), so the activate script names it."""
    repo = copy_repo(tmp_path / "repo")
    result = subprocess.run(
        ["bash", "-elc", "source .venv/bin/activate && echo DAGSTER_HOME=$DAGSTER_HOME"],
        cwd=repo,
        env=user_environment(DAGSTER_MODULE_NAME="zero_assets.definitions"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "DAGSTER_MODULE_NAME is set" in result.stderr and "unset DAGSTER_MODULE_NAME" in result.stderr
    assert f"DAGSTER_HOME={repo / '.dagster_home'}" in result.stdout
