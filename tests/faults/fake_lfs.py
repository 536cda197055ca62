"""A stand-in for Lustre's `lfs` HSM commands on a plain folder, for the FSx warm job's tests.

python fake_lfs.py hsm_restore|hsm_state|hsm_release PATH...

The archive (the lake behind the data repository association) is the folder FAKE_LFS_ARCHIVE, laid
out as the channel root FAKE_LFS_ROOT; each file's HSM state (`archived`, `released`, `dirty`) is
kept in the JSON file FAKE_LFS_STATE, `archived` when unlisted. As on Lustre: a restore copies a
released file's archive bytes into it (a restored or dirty file is left alone); a release drops a
clean file's data, its size staying (the bytes become a hole), and refuses a dirty one; each state
line reads as `lfs hsm_state` prints it.
"""

import json
import os
import shutil
import sys
from pathlib import Path

FLAGS = {
    "archived": "(0x00000009) exists archived, archive_id:1",
    "released": "(0x0000000d) released exists archived, archive_id:1",
    "dirty": "(0x0000000b) exists dirty archived, archive_id:1",
}


def main(command: str, paths: list[str]) -> int:
    root, archive = Path(os.environ["FAKE_LFS_ROOT"]), Path(os.environ["FAKE_LFS_ARCHIVE"])
    state_file = Path(os.environ["FAKE_LFS_STATE"])
    states = json.loads(state_file.read_text()) if state_file.is_file() else {}
    status = 0
    for name in paths:
        path = Path(name)
        if not path.is_file():
            print(f"lfs {command}: cannot get fid of '{name}': No such file or directory", file=sys.stderr)
            status = 2
            continue
        state = states.get(name, "archived")
        if command == "hsm_state":
            print(f"{name}: {FLAGS[state]}")
        elif command == "hsm_restore" and state == "released":
            shutil.copyfile(archive / path.relative_to(root), path)
            states[name] = "archived"
        elif command == "hsm_release" and state == "dirty":
            print(f"lfs hsm_release: cannot release '{name}': Device or resource busy", file=sys.stderr)
            status = 16
        elif command == "hsm_release":
            size = path.stat().st_size
            with open(path, "r+b") as handle:
                handle.truncate(0)
                handle.truncate(size)
            states[name] = "released"
    state_file.write_text(json.dumps(states))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
