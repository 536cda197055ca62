"""`zero-assets`: the commands that are not materializations (demo data, sources, summary, render-jobs,
lineage, gc, fail-dead-runs); `zero-assets --help` lists them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zero_assets.ops.demo_data import make_demo_raw_root

SUMMARY_KEYS = {
    "raw_image_index": ("dagster/row_count", "images_without_annotation", "annotations_without_image"),
    "validated_images": ("images_in", "accepted", "quarantined", "duplicates", "labels_rejected", "train", "val"),
    "training_set": ("dagster/row_count", "excluded", "train", "val"),
    "arrow_shards": ("shards", "dagster/size_bytes", "train_rows", "val_rows"),
    "fsx_warm_state": ("shards", "dagster/size_bytes", "copied", "already_warm"),
    # A cache hit records its building job's wall time as built_job_wall_s.
    "trained_checkpoint": ("steps", "images_per_s", "final_loss", "world_size", "job_wall_s", "built_job_wall_s"),
    "map_report": ("mAP", "mAP_50", "mAP_75", "val_images"),
}


def _make_demo_data(args: argparse.Namespace) -> int:
    summary = make_demo_raw_root(args.out, images=args.images, seed=args.seed, shuffled_labels=args.shuffle_labels)
    print(json.dumps(summary, indent=1))
    return 0


def _settings():
    """The `ZeroSettings` the code location's assets get here, resolved as a run resolves them."""
    from zero_assets.backends.from_env import backend_settings, resolved

    return resolved(backend_settings()[0])


def _sources(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from zero_assets.defs.change_detection.raw_sources import list_sources, register_sources, remove_source

    if args.remove:
        with DagsterInstance.get() as instance:
            for source in args.remove:
                remove_source(instance, source)
                print(f"{source}\tremoved")
        return 0
    raw_uri = _settings().raw_uri
    sources = list_sources(raw_uri)
    if not args.register:
        if sources:
            print("\n".join(sources))
        else:  # stdout stays a plain list (scripts loop over it); the note goes to stderr
            print(f"no sources (top-level folders) under {raw_uri}", file=sys.stderr)
        return 0
    with DagsterInstance.get() as instance:
        added, refused = register_sources(instance, sources)
    for source in sources:
        verdict = "added" if source in added else f"refused: {refused[source]}" if source in refused else "registered"
        print(f"{source}\t{verdict}")
    return 0


def _summary(_: argparse.Namespace) -> int:
    from dagster import AssetKey, DagsterInstance

    from zero_assets.defs.assets import PER_SOURCE_ASSETS
    from zero_assets.defs.partitions import RAW_SOURCES
    from zero_assets.launch.upstream import latest_by_partition, latest_materializations

    per_source = {key.to_user_string() for asset in PER_SOURCE_ASSETS for key in asset.keys}
    instance = DagsterInstance.get()
    sources = instance.get_dynamic_partitions(RAW_SOURCES.name)
    missing = False
    for asset, keys in SUMMARY_KEYS.items():
        if asset in per_source:
            partitions, latest = sorted(sources), latest_by_partition(instance, AssetKey(asset), sources)
        else:
            records = latest_materializations(instance, AssetKey(asset))
            partitions, latest = [None], {None: records[0]} if records else {}
        for source in partitions:
            label = f"{asset}[{source}]" if source else asset
            record = latest.get(source)
            if record is None or record.asset_materialization is None:
                print(f"{label:<40} not materialized")
                missing = True
                continue
            metadata = record.asset_materialization.metadata
            values = ", ".join(f"{k}={_plain(metadata[k].value)}" for k in keys if k in metadata)
            uri = metadata["dagster/uri"].value if "dagster/uri" in metadata else "?"
            print(f"{label:<40} {values}\n{'':<40} uri={uri}")
        if asset in per_source and not sources:
            print(f"{asset:<40} no sources registered (zero-assets sources --register)")
            missing = True
    final = instance.get_latest_materialization_event(AssetKey("map_report"))
    if final is not None and final.asset_materialization is not None:
        metrics = final.asset_materialization.metadata
        print(f"\nfinal mAP@[.5:.95] = {_plain(metrics['mAP'].value)}   mAP@0.5 = {_plain(metrics['mAP_50'].value)}")
    return 1 if missing else 0


def _render_jobs(args: argparse.Namespace) -> int:
    from zero_assets.backends.from_env import resolved, sagemaker_settings
    from zero_assets.ops.job_plan import instance_lookup, render_jobs

    # The SageMaker backend's settings whatever ZERO_BACKEND says, resolved as a run resolves them.
    settings, aws = (resolved(resource) for resource in sagemaker_settings())
    options = {"source": args.source} if args.source else {}
    if args.config:
        import yaml

        options["run_config"] = yaml.safe_load(args.config.read_text()) or {}
    if args.from_instance:
        from dagster import DagsterInstance

        with DagsterInstance.get() as instance:
            rendered = render_jobs(settings, aws, instance_lookup(instance), **options)
    else:
        rendered = render_jobs(settings, aws, **options)
    args.out.mkdir(parents=True, exist_ok=True)
    for asset, _service, operation, params in rendered:
        path = args.out / f"{asset}.{operation}.json"
        path.write_text(json.dumps(params, indent=1, sort_keys=True) + "\n")
        print(path)
    return 0


def _lineage(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from zero_assets.ops.lineage import LATEST, checkpoint_lineage, find_checkpoint, image_fate

    with DagsterInstance.get() as instance:
        if args.image:
            print(json.dumps(image_fate(instance, args.image), indent=1, default=str))
            return 0
        found = checkpoint_lineage(instance, find_checkpoint(instance, args.checkpoint or LATEST))
    print("\n".join(found.lines()))
    return 0


def _gc(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from zero_assets.core.settings import ZeroSettings
    from zero_assets.defs.assets import ALL_ASSETS
    from zero_assets.ops.garbage import DEFAULT_GRACE_HOURS, delete_unreferenced, find_unreferenced, report_lines

    lake = args.lake or _settings().lake_uri
    jobs_root = str(ZeroSettings(lake_uri=lake).jobs_root())  # `<lake>/_jobs`; on this machine for an s3:// lake
    assets = [key.to_user_string() for asset in ALL_ASSETS for key in asset.keys]
    grace_s = (DEFAULT_GRACE_HOURS if args.grace_hours is None else args.grace_hours) * 3600
    with DagsterInstance.get() as instance:
        if args.delete:
            verdicts, deleted = delete_unreferenced(instance, lake, assets, grace_s, jobs_root)
        else:
            verdicts, deleted = find_unreferenced(instance, lake, assets, grace_s, jobs_root), None
    print("\n".join(report_lines(verdicts, deleted)))
    return 0


def _plain(value: object) -> object:
    return round(value, 4) if isinstance(value, float) else value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zero-assets", description="zero_assets command line")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("make-demo-data", help="write the deterministic demo raw root")
    demo.add_argument("--out", type=Path, required=True, help="new or empty folder for the raw root")
    demo.add_argument("--images", type=int, default=240, help="good images to render (bad cases are added on top)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--shuffle-labels",
        action="store_true",
        help="same images, labels shuffled across images and boxes: a model trained on them should score near zero",
    )
    demo.set_defaults(handler=_make_demo_data)
    sources = commands.add_parser(
        "sources", help="list the raw root's sources (top-level folders, one delimiter listing)"
    )
    sources.add_argument(
        "--register", action="store_true", help="add the sources that are not partitions yet to the instance"
    )
    sources.add_argument(
        "--remove",
        action="append",
        default=[],
        metavar="NAME",
        help="delete the partition NAME (one added by hand, or whose folder is gone); repeatable",
    )
    sources.set_defaults(handler=_sources)
    summary = commands.add_parser(
        "summary", help="print the latest materialization of each asset (per source for the per-source ones)"
    )
    summary.set_defaults(handler=_summary)
    render = commands.add_parser(
        "render-jobs", help="write every SageMaker/FSx request the graph would send, one JSON file each"
    )
    render.add_argument("--out", type=Path, required=True, help="folder for <asset>.<Operation>.json files")
    render.add_argument(
        "--source",
        help="the source the per-source jobs are rendered for (default: an example name; no listing is made)",
    )
    render.add_argument(
        "--config",
        type=Path,
        help="a run config file (YAML or JSON, as `dagster asset materialize --config` takes): the assets' "
        "config a run with it would use (default: each asset's default config)",
    )
    render.add_argument(
        "--from-instance",
        action="store_true",
        help="fingerprint with the latest materializations in the instance at $DAGSTER_HOME, so each request is "
        "the one the next materialization sends (default: stand-in upstream versions)",
    )
    render.set_defaults(handler=_render_jobs)
    lineage = commands.add_parser("lineage", help="which raw images reached which checkpoint")
    target = lineage.add_mutually_exclusive_group()
    target.add_argument(
        "checkpoint", nargs="?", help="a trained_checkpoint uri or the run id that wrote it (default: the latest)"
    )
    target.add_argument("--image", help="a raw image key (<source>/<path>): which checkpoints it reached, or why not")
    lineage.set_defaults(handler=_lineage)
    gc = commands.add_parser(
        "gc", help="list (with --delete, remove) lake outputs and job folders no stored materialization names"
    )
    gc.add_argument("--delete", action="store_true", help="remove them (default: a dry run that only lists them)")
    gc.add_argument("--grace-hours", type=float, help="keep anything written this recently, in hours (default: a day)")
    gc.add_argument("--lake", help="the lake the assets write to (ZERO_LAKE_URI, else the backend's default)")
    gc.set_defaults(handler=_gc)
    dead = commands.add_parser(
        "fail-dead-runs",
        help="mark failed the runs in progress whose run worker on this host is gone, and free their pool slots",
    )
    dead.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="RUN_ID",
        help="fail this run whatever this host can tell (a run of a host that is gone for good); repeatable",
    )
    dead.set_defaults(handler=_fail_dead_runs)
    return parser


def _fail_dead_runs(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from zero_assets.launch.run_owner import fail_dead_runs, fail_run

    with DagsterInstance.get() as instance:
        for run_id in args.run:
            if instance.get_run_by_id(run_id) is None:
                raise LookupError(f"no run {run_id} in the instance at $DAGSTER_HOME")
        by_hand = "failed by hand (zero-assets fail-dead-runs --run)"
        failed = {run_id: by_hand for run_id in args.run if fail_run(instance, run_id, by_hand)}
        failed |= fail_dead_runs(instance)
    for run_id, reason in failed.items():
        print(f"{run_id}\t{reason}")
    if not failed:
        print("no run in progress has a dead run worker on this host", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (FileExistsError, FileNotFoundError, LookupError, ValueError) as error:
        print(f"zero-assets {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
