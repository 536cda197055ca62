"""One Dagster process for the fault tests: materialize a selection against a real instance on disk.

python tests/faults/fault_driver.py --home DAGSTER_HOME --raw DIR --state DIR --select a,b [--source S]
    [--pause-before-marker | --hold-before-marker] [--lake URI] [--local-state DIR]

A selection of per-source assets runs for one source (`--source`, default the raw root's first folder),
registered as a partition first.

Prints one JSON line, `RESULT {...}`, with success and each materialized asset's cache decision and
uri. `--pause-before-marker` makes it stop (sleep) after an output is published and before its
completion marker is written, having written its pid to `<state>/paused-before-marker`: the point
a test kills it at. `--hold-before-marker` stops at the same point, with its pid in
`<state>/held-before-marker`, until `<state>/release` exists, then goes on: a run held inside the
output's lease for as long as a test needs, whatever the asset (job-backed or in-process).

The lake is `<state>/lake` unless `--lake` names another (an s3:// URI); `--raw` may be one too
(then pass `--source`). `--local-state` stands in for this machine's `.zero/` (where an s3:// lake's
job folders are): two processes with different ones are two hosts, sharing nothing on disk.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from dagster import DagsterInstance, materialize
from fault_assets import FAULT_ASSETS

import zero_assets.core.settings as settings_module
import zero_assets.launch.once as once
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import ALL_ASSETS, PER_SOURCE_ASSETS, SOURCE_SPECS
from zero_assets.defs.partitions import RAW_SOURCES


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--home", "--raw", "--state", "--select"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--pause-before-marker", action="store_true")
    parser.add_argument("--hold-before-marker", action="store_true")
    parser.add_argument(
        "--source", help="the partition of the per-source assets (default: the raw root's first folder)"
    )
    parser.add_argument("--lake", help="the lake's URI (default: <state>/lake)")
    parser.add_argument("--local-state", help="this process's .zero/ folder: its jobs folders for an s3:// lake")
    args = parser.parse_args()
    state = Path(args.state)
    if args.local_state:
        settings_module.DEFAULT_STATE = Path(args.local_state)  # read when the jobs folder is asked for
    if args.pause_before_marker or args.hold_before_marker:
        mark = once.mark_output_complete

        def paused_mark(*a, **k):
            if args.pause_before_marker:
                (state / "paused-before-marker").write_text(str(os.getpid()))
                time.sleep(600)
            else:
                (state / "held-before-marker").write_text(str(os.getpid()))
                while not (state / "release").exists():
                    time.sleep(0.1)
            return mark(*a, **k)

        once.mark_output_complete = paused_mark  # every asset's marker is written by the one protocol
    (state / "fsx").mkdir(parents=True, exist_ok=True)
    lake = args.lake or str(state / "lake")
    settings = ZeroSettings(raw_uri=args.raw, lake_uri=lake, fsx_mount=str(state / "fsx"))
    selection = args.select.split(",")
    per_source = {key.to_user_string() for asset in PER_SOURCE_ASSETS for key in asset.keys}
    source = (
        args.source or sorted(p.name for p in Path(args.raw).iterdir() if p.is_dir())[0]
        if per_source & set(selection)
        else None
    )
    with DagsterInstance.from_config(args.home) as instance:
        if source:
            instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
        result = materialize(
            [*SOURCE_SPECS, *ALL_ASSETS, *FAULT_ASSETS],
            selection=selection,
            instance=instance,
            raise_on_error=False,
            partition_key=source,
            resources={"settings": settings, "jobs": LocalJobRunner(settings=settings)},
        )
        assets = {}
        for name in selection:
            for event in result.asset_materializations_for_node(name):
                meta = {k: v.value for k, v in event.metadata.items()}
                assets[name] = {key: str(meta.get(key)) for key in ("cache", "cache_reason", "dagster/uri", "job_name")}
        print(
            "RESULT " + json.dumps({"success": result.success, "run_id": result.run_id, "assets": assets}), flush=True
        )
    sys.exit(0 if result.success else 1)


if __name__ == "__main__":
    main()
