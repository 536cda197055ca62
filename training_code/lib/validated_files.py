"""The files of a validated_images output by name: what the validation job writes and the selection job reads."""

ACCEPTED_FILE = "accepted.parquet"
# The next run's cache; outside the manifest's hashes, as a local etag holds an mtime.
VERDICTS_FILE = "verdicts.parquet"
CATEGORIES_FILE = "categories.json"
