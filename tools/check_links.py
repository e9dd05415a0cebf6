#!/usr/bin/env python3
"""Checks every relative link of the project's Markdown files: the target file exists and, for a
link with #anchor, the target has a heading with that GitHub anchor. Prints each broken link
(file:line: link: why) and exits 1 if there is one.

    tools/check_links.py [ROOT]        (default: the repository root above this script)
"""
import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"^(#{1,6}) (.*)$", line.rstrip("\n"))
        if m:
            a = slug(m.group(2))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = 0
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
        for f in files:
            if not f.endswith(".md"):
                continue
            md = os.path.join(dirpath, f)
            fence = False
            for no, line in enumerate(open(md, encoding="utf-8"), 1):
                if line.startswith("```"):
                    fence = not fence
                if fence:
                    continue
                for target in LINK.findall(line):
                    if re.match(r"^[a-z]+:", target):
                        continue  # http:, https:, mailto:
                    path, _, anchor = target.partition("#")
                    dest = os.path.normpath(os.path.join(dirpath, path)) if path else md
                    why = None
                    if not os.path.exists(dest):
                        why = "no such file"
                    elif anchor and (os.path.isdir(dest) or not dest.endswith(".md")):
                        why = "an anchor into a file that is not Markdown"
                    elif anchor and anchor not in anchors(dest):
                        why = f"no heading with anchor #{anchor} in {os.path.relpath(dest, root)}"
                    if why:
                        bad += 1
                        print(f"{os.path.relpath(md, root)}:{no}: {target}: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
