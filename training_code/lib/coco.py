"""Read a source's COCO `annotations.json` and match it to the files listed under that source.

The raw data contract: `<raw_root>/<source>/annotations.json`, `file_name` relative to the source
folder, `categories[].name` the text the model grounds, `bbox` as COCO `[x, y, w, h]` in the stored
pixel frame (before EXIF orientation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .storage import safe_relative_key

ANNOTATIONS_FILE = "annotations.json"


@dataclass
class SourceAnnotations:
    source: str
    categories: dict[int, str]  # COCO category id -> name
    by_file: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # file_name -> annotations
    image_entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # file_name -> COCO image entry

    def annotations_for(self, file_name: str) -> list[dict[str, Any]]:
        return self.by_file.get(file_name, [])


def parse_annotations(source: str, raw: bytes, where: str) -> SourceAnnotations:
    """Parse one COCO file; `where` names it in errors."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error}); fix or remove the file") from error
    for section in ("images", "annotations", "categories"):
        if not isinstance(document.get(section), list):
            raise ValueError(f"{where}: COCO section {section!r} is missing or not a list")
    categories = {}
    for entry in document["categories"]:
        if not isinstance(entry.get("name"), str) or not entry["name"].strip():
            raise ValueError(f"{where}: category {entry.get('id')!r} has no usable 'name'")
        categories[int(entry["id"])] = entry["name"].strip()
    parsed = SourceAnnotations(source=source, categories=categories)
    files_by_id = {}
    for image in document["images"]:
        file_name = safe_relative_key(str(image.get("file_name", "")))
        files_by_id[image["id"]] = file_name
        parsed.image_entries[file_name] = image
        parsed.by_file.setdefault(file_name, [])
    for annotation in document["annotations"]:
        file_name = files_by_id.get(annotation.get("image_id"))
        if file_name is None:
            raise ValueError(f"{where}: annotation {annotation.get('id')!r} points at unknown image_id {annotation.get('image_id')!r}")
        parsed.by_file[file_name].append(annotation)
    return parsed


def annotated_files_without_image(parsed: SourceAnnotations, listed_files: set[str]) -> list[str]:
    """COCO image entries that carry annotations but whose file is not in the listing."""
    return sorted(f for f, anns in parsed.by_file.items() if anns and f not in listed_files)
