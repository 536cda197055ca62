r"""The baseline of `validate_marginal`: a plain `multiprocessing.Pool` decoding a folder's JPEGs as the
validator's strict pass does (`python -m benchmarks.plain_decode_pool FOLDER WORKERS`; prints files and ok).
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import sys
from pathlib import Path

from PIL import Image

from training_code.lib import jpeg_strict


def strict_check(path: str) -> bool:
    data = Path(path).read_bytes()
    hashlib.sha256(data).hexdigest()
    with Image.open(io.BytesIO(data)) as image:
        if image.format == "JPEG" and image.mode in ("L", "RGB", "CMYK"):
            try:
                jpeg_strict.decode_small(data, grey=image.mode != "CMYK")
                return True
            except jpeg_strict.CorruptData:
                return False
            except ValueError:
                pass  # what the strict pass does not judge goes to Pillow, as in the validator
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception:  # noqa: BLE001 - any failure is a rejected file here
        return False
    return True


def main(folder: str, workers: int) -> None:
    paths = sorted(str(path) for path in Path(folder).rglob("*.jpg"))
    with multiprocessing.Pool(workers) as pool:
        verdicts = pool.map(strict_check, paths)
        # Let the workers finish on their own before the with block's terminate(): that SIGTERMs them, and
        # a worker started with SIGTERM ignored (inherited, as in one `make bench` of 2026-12-04) that
        # missed its stop sentinel (terminate drains the task queue) then kept the script waiting for ever.
        pool.close()
        pool.join()
    print(json.dumps({"files": len(paths), "ok": sum(verdicts)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
