"""Read a source's COCO `annotations.json` and match it to the files listed under that source.

Contract: `<raw_root>/<source>/annotations.json`, `file_name` relative to the source folder, `bbox` as
COCO `[x, y, w, h]` in the stored frame (before EXIF orientation). An unusable file is an
`AnnotationError`; a bad entry in a usable file is one `rejected` row and the rest is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .labels import HugeInteger, annotation_id, is_int, short
from .storage import key_problem

ANNOTATIONS_FILE = "annotations.json"
# Past this an annotations file is refused before parsing: json.loads holds about 8 times the file.
DEFAULT_MAX_ANNOTATION_BYTES = 1 << 30
# What counting annotations per file needs; parsing with keep=INDEX_FIELDS drops the rest of every object
# (segmentation polygons are most of a COCO file).
INDEX_FIELDS = frozenset({"images", "annotations", "categories", "id", "file_name", "image_id", "name"})
SECTIONS = ("images", "annotations", "categories")
# Integers longer than this are not parsed into Python ints (a 5,000-digit one raises in int()).
MAX_INT_DIGITS = 100
# Every digit as "0", so finding a run past MAX_INT_DIGITS is a plain substring search (a regex is slow).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"0" * 9)
_LONG_RUN = b"0" * (MAX_INT_DIGITS + 1)


class AnnotationError(ValueError):
    """The whole annotations file is unusable; the message names the file and the field."""


@dataclass
class SourceAnnotations:
    source: str
    categories: dict[int, str]  # COCO category id -> name
    by_file: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # file_name -> annotations
    image_entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # file_name -> COCO image entry
    rejected: list[dict[str, Any]] = field(default_factory=list)  # rows of tables.REJECTED_LABELS, keyed by this file

    def annotations_for(self, file_name: str) -> list[dict[str, Any]]:
        return self.by_file.get(file_name, [])


def parse_annotations(
    source: str,
    raw: bytes,
    where: str,
    max_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES,
    keep: Iterable[str] | None = None,
) -> SourceAnnotations:
    """Parse one COCO file; `where` names it in errors. `keep`: the only object fields to hold on to."""
    document = load_document(raw, where, max_bytes, keep)
    parsed = SourceAnnotations(source=source, categories={})
    file_key = f"{source}/{ANNOTATIONS_FILE}"

    def reject(entry: Any, place: str, reason: str, detail: str) -> None:
        row = {"key": file_key, "annotation_id": annotation_id(entry), "category": "", "bbox": []}
        parsed.rejected.append({**row, "reason": reason, "detail": f"{place}: {detail}"})

    def objects(section: str) -> Iterable[tuple[str, dict[str, Any]]]:
        """(place, entry) of each entry of `section` that is an object; the others are rejected."""
        for n, entry in enumerate(document[section]):
            if isinstance(entry, dict):
                yield f"{section}[{n}]", entry
            else:
                reject(None, f"{section}[{n}]", "not_an_object", f"is a JSON {_json_type(entry)}, not an object")

    for place, entry in objects("categories"):
        if not is_int(entry.get("id")):
            reject(None, place, "bad_id", f"'id' is {short(entry.get('id'))}, not an integer")
        elif not isinstance(entry.get("name"), str) or not entry["name"].strip():
            reject(None, place, "malformed", f"'name' is {short(entry.get('name'))}, not a usable category name")
        else:
            parsed.categories[entry["id"]] = entry["name"].strip()
    files_by_id: dict[int, str] = {}
    refused_images: dict[int, str] = {}  # id -> the images[n] whose file_name was refused
    for place, image in objects("images"):
        image_id, file_name = image.get("id"), image.get("file_name")
        if not is_int(image_id):
            reject(None, place, "bad_id", f"'id' is {short(image_id)}, not an integer")
        elif image_id in files_by_id or image_id in refused_images:
            reject(None, place, "bad_id", f"'id' {image_id} is used by an earlier image entry; this one is ignored")
        elif not isinstance(file_name, str) or key_problem(file_name):
            why = key_problem(file_name) if isinstance(file_name, str) else "not a string"
            reject(None, place, "bad_file_name", f"'file_name' {short(file_name)} is unusable ({why})")
            refused_images[image_id] = place
        else:
            files_by_id[image_id] = file_name
            parsed.image_entries[file_name] = image
            parsed.by_file.setdefault(file_name, [])
    for place, annotation in objects("annotations"):
        image_id = annotation.get("image_id")
        if not is_int(image_id):
            reject(annotation, place, "bad_id", f"'image_id' is {short(image_id)}, not an integer")
        elif image_id in refused_images:
            reject(annotation, place, "unknown_image", f"its image entry {refused_images[image_id]} was rejected")
        elif image_id not in files_by_id:
            reject(annotation, place, "unknown_image", f"'image_id' {image_id} is not the id of any entry in 'images'")
        else:
            parsed.by_file[files_by_id[image_id]].append(annotation)
    return parsed


def load_document(
    raw: bytes, where: str, max_bytes: int = DEFAULT_MAX_ANNOTATION_BYTES, keep: Iterable[str] | None = None
) -> dict[str, Any]:
    """The parsed COCO object, size-checked before parsing; any failure is an AnnotationError naming `where`."""
    if len(raw) > max_bytes:
        raise AnnotationError(
            f"{where}: {len(raw)} bytes, above the annotation file limit of {max_bytes}; "
            "raise the limit or split the source"
        )
    kept = frozenset(keep) if keep is not None else None
    hook = (lambda obj: {k: v for k, v in obj.items() if k in kept}) if kept is not None else None
    # Python's own int parsing stays in the fast C scanner; it is enough when no run of digits could be
    # a HugeInteger (checked on the bytes, so only for UTF-8).
    long_digits = json.detect_encoding(raw) != "utf-8" or _LONG_RUN in raw.translate(_DIGITS_AS_ZERO)
    try:
        document = json.loads(raw, object_hook=hook, parse_int=_parse_int if long_digits else None)
    except RecursionError:
        raise AnnotationError(
            f"{where}: nested too deeply to be COCO (arrays or objects inside each other past Python's recursion limit)"
        ) from None
    except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8/16/32
        raise AnnotationError(
            f"{where}: not valid JSON ({type(error).__name__}: {short(str(error))}); fix or remove the file"
        ) from None
    if not isinstance(document, dict):
        raise AnnotationError(
            f"{where}: the top level is a JSON {type(document).__name__}, not an object with {', '.join(SECTIONS)}"
        )
    for section in SECTIONS:
        if not isinstance(document.get(section), list):
            raise AnnotationError(
                f"{where}: field {section!r} is {'missing' if section not in document else 'not a list'}"
            )
    return document


def _json_type(value: Any) -> str:
    """The JSON type of a value, for messages that must not quote what a file holds."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, HugeInteger)):
        return "number"
    return {str: "string", list: "array", type(None): "null"}.get(type(value), type(value).__name__)


def _parse_int(text: str) -> int | HugeInteger:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_INT_DIGITS else HugeInteger(digits)
