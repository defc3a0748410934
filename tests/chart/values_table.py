"""docs/install.md's values table, made from values.yaml: each chart key (one the
schema names), its default and the comment above it. Run this file to print
the table; test_values_table.py holds docs/install.md to it."""
import json
import re

import yaml

from chart import CHART

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
START = "<!-- values table: made by tests/chart/values_table.py -->"
END = "<!-- end of values table -->"


def comments() -> dict[str, str]:
    """key path -> the comment lines just above the key in values.yaml."""
    found, stack, above = {}, [], []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(re.sub(r"^#\s*(--\s*)?", "", stripped))
            continue
        if stripped and not stripped.startswith("-") and ":" in stripped:
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, stripped.split(":", 1)[0]))
            found[".".join(k for _, k in stack)] = " ".join(above)
        above = []
    return found


def rows() -> list[tuple[str, str, str]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    notes = comments()
    out = []

    def walk(node, schema, path):
        props = schema.get("properties")
        if isinstance(node, dict) and node and props:
            for key, child in node.items():
                walk(child, props[key], f"{path}.{key}" if path else key)
            return
        default = json.dumps(node, separators=(", ", ": "))
        out.append((path, default, notes.get(path, "")))

    walk(values, SCHEMA, "")
    return out


def table() -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, default, note in rows():
        lines.append(f"| `{key}` | `{default}` | {note.replace('|', '/')} |")
    return "\n".join([START, *lines, END])


if __name__ == "__main__":
    print(table())
