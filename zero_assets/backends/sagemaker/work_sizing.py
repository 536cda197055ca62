"""How many instances a planned Processing job runs on, and how large each one's volume is, from its work:
the count follows `images_per_instance`/`bytes_per_instance` within `instance_count`..`max_instance_count`,
each volume is `volume_size_gb` plus what its busiest host fetches. A job that cannot fit fails before launch.
"""

from __future__ import annotations

import math

from zero_assets.backends.sagemaker.settings import JobCompute, SageMakerSettings, compute_variable
from zero_assets.core.job_request import JobRequest, Work

MAX_VOLUME_GB = 16384  # botocore: ProcessingClusterConfig.VolumeSizeInGB
MAX_INSTANCES = 100  # botocore: ProcessingClusterConfig.InstanceCount
GIB = 1 << 30
# Memory-optimised instances and their memory (GiB), from the smallest: what a table job is sized along.
MEMORY_LADDER = (
    ("ml.r5.large", 16),
    ("ml.r5.xlarge", 32),
    ("ml.r5.2xlarge", 64),
    ("ml.r5.4xlarge", 128),
    ("ml.r5.8xlarge", 256),
    ("ml.r5.12xlarge", 384),
    ("ml.r5.16xlarge", 512),
    ("ml.r5.24xlarge", 768),
)


def volume_gb(compute: JobCompute, read_bytes: int) -> int:
    """The volume of an instance that fetches `read_bytes`: the configured base plus those bytes."""
    return compute.volume_size_gb + math.ceil(read_bytes / GIB)


def wanted_instances(asset: str, compute: JobCompute, work: Work) -> int:
    """The count the work asks for, within the least and most the compute allows."""
    least, most = compute.instance_count, min(compute.max_instance_count, MAX_INSTANCES)
    if least > most:
        raise ValueError(
            f"{asset}: {compute_variable(asset, 'instance_count')}={least} is above "
            f"{compute_variable(asset, 'max_instance_count')}={compute.max_instance_count} (SageMaker allows "
            f"{MAX_INSTANCES}); lower the first or raise the second"
        )
    asked = [
        math.ceil(amount / per)
        for amount, per in ((work.objects, compute.images_per_instance), (work.bytes, compute.bytes_per_instance))
        if per
    ]
    return max(least, min(most, max(asked, default=1), max(work.objects, 1)))


def instances_for(asset: str, compute: JobCompute, work: Work) -> int:
    """Instances for `work`; ValueError naming the setting when it cannot fit."""
    count = wanted_instances(asset, compute, work)
    most = min(compute.max_instance_count, MAX_INSTANCES)
    room = (MAX_VOLUME_GB - compute.volume_size_gb) * GIB
    if room <= 0:
        raise ValueError(
            f"{asset}: {compute_variable(asset, 'volume_size_gb')}={compute.volume_size_gb} leaves no room for "
            f"what it reads on SageMaker's largest volume ({MAX_VOLUME_GB} GB); lower it"
        )
    # Evenly split, the least count that could fit; then as many more as the busiest host needs.
    count = min(most, max(count, math.ceil(work.bytes * work.disk_factor / room)))
    while volume_gb(compute, work.disk_bytes(count)) > MAX_VOLUME_GB and count < most:
        count += 1
    busiest = work.disk_bytes(count)
    if volume_gb(compute, busiest) > MAX_VOLUME_GB:
        raise ValueError(
            f"{asset}: {work.objects} objects, {work.bytes / GIB:,.0f} GiB to read; on {count} instances "
            f"({compute_variable(asset, 'max_instance_count')}={compute.max_instance_count}) the busiest would "
            f"hold {busiest / GIB:,.0f} GiB, more than SageMaker's largest volume ({MAX_VOLUME_GB} GB) holds on "
            f"top of {compute_variable(asset, 'volume_size_gb')}={compute.volume_size_gb}; raise "
            f"{compute_variable(asset, 'max_instance_count')}, or split the source"
        )
    return count


def request_volume_gb(request: JobRequest, compute: JobCompute) -> int:
    """The base volume, what the busiest host fetches, and three times the tables it reads whole."""
    scanned = 3 * request.scan.bytes if request.scan else 0
    return volume_gb(compute, (request.reads.disk_bytes if request.reads else 0) + scanned)


def request_instance_type(request: JobRequest, compute: JobCompute) -> str:
    """`compute.instance_type`, or for a table scan the smallest `MEMORY_LADDER` type with room for its rows."""
    if request.scan is None or not compute.memory_bytes_per_row:
        return compute.instance_type
    names = [name for name, _ in MEMORY_LADDER]
    if compute.instance_type not in names:
        return compute.instance_type
    wanted = request.scan.rows * compute.memory_bytes_per_row
    ladder = MEMORY_LADDER[names.index(compute.instance_type) :]
    return next((name for name, gib in ladder if gib * GIB >= wanted), ladder[-1][0])


def read_list_uri(aws: SageMakerSettings, request: JobRequest) -> str:
    """Where the runner writes `request`'s read list: `<s3 root>/reads/<asset>/<fingerprint16>`."""
    return f"{aws.s3_root()}/reads/{request.asset}/{request.fingerprint[:16]}"
