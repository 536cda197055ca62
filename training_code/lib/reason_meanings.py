"""What each quarantine and label-rejection reason code means, in a line; the codes of `tables`."""

from __future__ import annotations

IMAGE_REASONS = {
    "empty": "the file has zero bytes",
    "unidentified": "no image format recognised (text, HTML or an unknown format)",
    "truncated": "the file ends before the image does",
    "checksum": "a chunk checksum (CRC) does not match: the bytes were damaged",
    "bomb": "a decompression bomb: far more pixels or text than its size suggests",
    "timeout": "decoding took longer than timeout_s; the worker was killed",
    "crash": "the decoder crashed on it; the worker was replaced",
    "unsupported": "a valid variant Pillow cannot decode (12-bit JPEG, exotic TIFF)",
    "format_not_allowed": "an image format outside the allowed formats",
    "too_small": "narrower or shorter than min_side pixels, upright",
    "exif": "broken EXIF: its orientation cannot be applied",
    "decode_error": "the decoder failed for another reason (see the error column)",
    "corrupt_data": "a JPEG damaged mid-stream: libjpeg-turbo reports corrupt data (it partly decodes, to garbage)",
    "unreadable": "listed but could not be read (vanished, permissions, not a regular file)",
    "unsafe_key": "a key with .., control characters or bytes that are not UTF-8: never read",
    "outside_root": "a symlink out of the raw root: not followed, the target never opened",
    "too_large": "past max_image_bytes or max_pixels, or out of memory: not decoded",
}

LABEL_REASONS = {
    "outside_image": "the box lies outside the upright image",
    "degenerate": "zero or negative width or height",
    "non_finite": "a NaN or infinite coordinate",
    "unknown_category": "a category id the file's categories do not list",
    "malformed": "bbox or category missing or of the wrong shape",
    "bad_number": "a bbox value that is no usable number (too large for a float, a bool)",
    "not_an_object": "an entry of annotations.json that is not a JSON object",
    "bad_id": "an id that is not an integer, or a duplicate image id",
    "bad_file_name": "an image entry whose file_name is missing or unsafe",
    "unknown_image": "an annotation whose image_id is not among the images",
}


def meaning(reason: str, meanings: dict[str, str]) -> str:
    return meanings.get(reason, "no description: a reason code this table does not know")
