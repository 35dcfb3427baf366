"""The module dependency rules of docs/ARCHITECTURE.md ("Modules and who may include whom"),
checked on every source file: a quoted include of another module must be listed in the
including module's row (or, where the row lists one of that module's headers, its entry point,
be that header), every folder with sources must have a row, and nothing under common/ includes
a CUDA header. Prints each violation as FILE:LINE and exits 1 when there is any.
"""
import os
import re
import sys

SOURCE = os.environ.get("PDSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
TOP_LEVEL = ("common", "kernels", "kv_transfer", "kv_tiers", "serving", "decode_node", "prefill_node", "proxy", "tools", "bench")
EXTENSIONS = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".in")
CUDA_HEADER = re.compile(r"#\s*include\s*<(cuda|cublas|cudnn|nccl|cub/|thrust/|curand|cusparse|nvtx)")
QUOTED = re.compile(r'\s*#\s*include\s+"([^"]+)"')


# Top-level folders whose subfolders are modules of their own (common/ has no files of its own).
SPLIT = ("common", "serving", "proxy")


# Subfolders of a module that are modules of their own (a room the module delegates to, with
# its own narrower row).
NESTED = ("common/engine/spec_decode",)


def module_of(path):
    parts = path.replace(os.sep, "/").split("/")
    for nested in NESTED:
        if path.replace(os.sep, "/").startswith(nested + "/"):
            return nested
    if parts[0] == "common":
        return "common/" + parts[1] if len(parts) > 2 else None
    if parts[0] in SPLIT and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0] if parts[0] in TOP_LEVEL else None


def read_rules():
    with open(os.path.join(SOURCE, "docs/ARCHITECTURE.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## Modules and who may include whom", 1)
    if len(section) != 2:
        sys.exit("docs/ARCHITECTURE.md has no 'Modules and who may include whom' section")
    rules = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        rules[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[2]))
    if len(rules) < 10:
        sys.exit(f"docs/ARCHITECTURE.md: only {len(rules)} module rows found; is the table intact?")
    return rules


def main():
    rules = read_rules()
    violations = []
    files = 0
    for top in TOP_LEVEL:
        for directory, _, names in os.walk(os.path.join(SOURCE, top)):
            for name in sorted(names):
                if not name.endswith(EXTENSIONS):
                    continue
                path = os.path.relpath(os.path.join(directory, name), SOURCE)
                module = module_of(path)
                if module is None:
                    continue
                files += 1
                if module not in rules:
                    violations.append(f"{path}: module '{module}' has no row in docs/ARCHITECTURE.md")
                    continue
                with open(os.path.join(SOURCE, path), encoding="utf-8", errors="replace") as handle:
                    for number, line in enumerate(handle, 1):
                        if module.startswith("common/") and CUDA_HEADER.match(line.strip()):
                            violations.append(f"{path}:{number}: common/ includes a CUDA header: {line.strip()}")
                        quoted = QUOTED.match(line)
                        if not quoted or "/" not in quoted.group(1):
                            continue
                        target = module_of(quoted.group(1))
                        if target is None or target == module or target in rules[module]:
                            continue
                        if quoted.group(1) in rules[module]:  # the target's entry point
                            continue
                        entry = [header for header in rules[module] if module_of(header) == target]
                        violations.append(f"{path}:{number}: {module} may not include {target} "
                                          f"({quoted.group(1)})" +
                                          (f"; its entry point is {entry[0]}" if entry else ""))
    for violation in violations:
        print(violation)
    print(f"{files} files of {len(rules)} modules checked: {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
