"""The 800-line rule of the developers' brief: no source file of the project (C++, CUDA, Python,
shell, CMake, and extension-less scripts with a #! line; production, tests, tools and scripts
alike) is longer than 800 lines. Vendored code (third_party/), build folders (build*/, out/),
virtual environments and caches are not the project's and are skipped. Prints each file over the
limit with its length and exits 1 when there is any.
"""
import os
import sys
import tempfile

SOURCE = os.environ.get("PDSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
MAX_LINES = 800
EXTENSIONS = (".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh", ".inc", ".cpp.in", ".py", ".sh", ".cmake")
NAMES = ("CMakeLists.txt",)
# Folder names that hold no project source wherever they are (vendored code, venvs, caches).
SKIPPED_NAMES = {".git", "third_party", ".venv", "__pycache__", "node_modules"}
# Top-level folders that hold build outputs (the CMake presets' build*/ and CI's out/).
SKIPPED_TOP = ("build", "out")


def skipped(directory, relative_dir, name):
    # Any virtual environment, whatever its name (.venv, .venv-lmeval, bench/peer/.venv): its
    # pyvenv.cfg says what it is.
    if name in SKIPPED_NAMES or os.path.isfile(os.path.join(directory, name, "pyvenv.cfg")):
        return True
    return relative_dir == "." and (name.startswith(SKIPPED_TOP[0]) or name in SKIPPED_TOP[1:])


def is_script(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def is_source(path, name):
    if name.endswith(EXTENSIONS) or name in NAMES:
        return True
    return "." not in name and is_script(path)


def oversized_files(root):
    """(relative path, line count) of every source file under `root` over MAX_LINES."""
    found = []
    for directory, folders, names in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        folders[:] = sorted(f for f in folders if not skipped(directory, relative_dir, f))
        for name in sorted(names):
            path = os.path.join(directory, name)
            if os.path.islink(path) or not is_source(path, name):
                continue
            with open(path, "rb") as handle:
                lines = handle.read().count(b"\n")
            if lines > MAX_LINES:
                found.append((os.path.relpath(path, root), lines))
    return found


def check_the_checker():
    """The rule on a made-up tree: long sources of every kind are caught, anywhere (tests too);
    the same length in vendored or build folders, or in a data file, is not."""
    long_text = "x\n" * (MAX_LINES + 1)
    caught = ["tests/api/long_test.cpp", "common/chat/long.h", "kernels/long.cu", "tools/long.py",
              "scripts/long.sh", "tests/CMakeLists.txt", "tools/long-tool"]
    ignored = ["third_party/vendored.cpp", "build/generated.cpp", "build-gpu/x.cpp", ".venv/x.py",
               ".venv-lmeval/lib/x.py", ".venv-lmeval/pyvenv.cfg",
               "tests/data/long.json", "docs/long.md", "tests/short_test.cpp"]
    with tempfile.TemporaryDirectory() as root:
        for relative in caught + ignored:
            path = os.path.join(root, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                if relative.endswith(("short_test.cpp", "pyvenv.cfg")):
                    handle.write("x\n" * MAX_LINES)
                else:
                    handle.write(("#!/bin/sh\n" if relative == "tools/long-tool" else "") + long_text)
        found = sorted(path for path, _ in oversized_files(root))
    if found != sorted(caught):
        sys.exit(f"the file-size check itself is broken: on a made-up tree it found {found}, "
                 f"expected {sorted(caught)}")


def main():
    check_the_checker()
    found = oversized_files(SOURCE)
    for path, lines in found:
        print(f"{path}: {lines} lines, over the limit of {MAX_LINES}: split it along its seams")
    print(f"{len(found)} source file(s) over {MAX_LINES} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
