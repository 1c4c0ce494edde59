#!/usr/bin/env python3
"""Checks the internal links of a built book (standard library only).

Usage: check-links.py BOOK_DIR
       check-links.py --markdown FILE...

Every relative href and src of every HTML file under BOOK_DIR must name a
file that exists under BOOK_DIR, and every #fragment must be an id (or an
<a name>) in the file it points to. Links with a scheme (https:, mailto:,
javascript:, data:) or to another host (//host) are not checked: the book
is checked offline. Exits 1 listing each broken link, 0 otherwise.

With --markdown, the relative links of markdown files outside the book
(README.md, which links into docs/src) must name existing files, and a
#fragment into a .md file one of its headings.
"""

import html.parser
import os
import re
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []  # (attribute, value, line)
        self.base = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        if tag == "base" and attrs.get("href") is not None:
            self.base = attrs["href"]
        for attr in ("href", "src"):
            value = attrs.get(attr)
            if value is not None:
                self.links.append((attr, value, self.getpos()[0]))

    handle_startendtag = handle_starttag


def parse(path):
    page = Page()
    with open(path, encoding="utf-8", errors="replace") as f:
        page.feed(f.read())
    page.close()
    return page


def slug(heading):
    """The id a heading gets: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]|\{#.*\}$", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def check_markdown(files):
    """Relative links of markdown files outside the book (README.md):
    the file must exist and a #fragment into a .md file must be a heading."""
    broken = []
    for name in files:
        with open(name, encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for match in re.finditer(r"\]\(([^)\s]+)\)", text):
            parts = urllib.parse.urlsplit(match.group(1))
            if parts.scheme or parts.netloc:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(name), parts.path)) if parts.path else name
            where = f"{name}: ({match.group(1)})"
            if not os.path.exists(target):
                broken.append(f"{where}: no file {target}")
            elif parts.fragment and target.endswith(".md"):
                with open(target, encoding="utf-8") as f:
                    headings = {slug(line.lstrip("#")) for line in f if line.startswith("#")}
                if parts.fragment not in headings:
                    broken.append(f"{where}: no heading #{parts.fragment} in {target}")
    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    return 1 if broken else 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--markdown":
        return check_markdown(sys.argv[2:])
    if len(sys.argv) != 2:
        print("usage: check-links.py BOOK_DIR | --markdown FILE...", file=sys.stderr)
        return 2
    root = os.path.realpath(sys.argv[1])
    if not os.path.isdir(root):
        print(f"check-links: {root} is not a directory (was the book built?)", file=sys.stderr)
        return 2

    pages = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(dirpath, name)
                pages[path] = parse(path)

    def ids_of(path):
        if path not in pages:
            pages[path] = parse(path)
        return pages[path].ids

    broken = []
    checked = 0
    for path, page in sorted(pages.items()):
        if page.base is not None and urllib.parse.urlsplit(page.base).scheme:
            continue  # a page based on another site
        for attr, value, line in page.links:
            parts = urllib.parse.urlsplit(value)
            if parts.scheme or parts.netloc:
                continue
            checked += 1
            where = f"{os.path.relpath(path, root)}:{line}: {attr}={value!r}"
            target_path = urllib.parse.unquote(parts.path)
            if not target_path:
                # Only a fragment (or a query): checked against this page.
                # (On a page with a <base>, mdbook's 404.html, a browser
                # would resolve it against the base; the only such links
                # there are the headings' links to themselves.)
                target = path
            if target_path:
                if target_path.startswith("/"):
                    target = os.path.join(root, target_path.lstrip("/"))
                else:
                    start = os.path.dirname(path)
                    if page.base is not None:
                        start = os.path.join(root, page.base.lstrip("/")) if page.base.startswith("/") \
                            else os.path.join(start, page.base)
                        if not page.base.endswith("/"):
                            start = os.path.dirname(start)
                    target = os.path.join(start, target_path)
                target = os.path.normpath(target)
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
                if not (target == root or target.startswith(root + os.sep)):
                    broken.append(f"{where}: leaves the book")
                    continue
                if not os.path.isfile(target):
                    broken.append(f"{where}: no file {os.path.relpath(target, root)}")
                    continue
            if parts.fragment:
                fragment = urllib.parse.unquote(parts.fragment)
                if not target.endswith(".html"):
                    broken.append(f"{where}: a fragment on a file that is not HTML")
                elif fragment not in ids_of(target):
                    broken.append(f"{where}: no id {fragment!r} in {os.path.relpath(target, root)}")

    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    if broken:
        print(f"check-links: {len(broken)} broken of {checked} internal links in {len(pages)} pages", file=sys.stderr)
        return 1
    print(f"check-links: {checked} internal links in {len(pages)} pages, none broken")
    return 0


if __name__ == "__main__":
    sys.exit(main())
