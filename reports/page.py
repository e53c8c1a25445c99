"""The HTML shell of the pages the reports write (the index, Table 3): one head, one font; each page adds its rules."""

from __future__ import annotations

import html

FONT = '"DejaVu Sans", Helvetica, Arial, sans-serif'


def stylesheet(body: str, rules: str) -> str:
    """A page's CSS: the shared body rule (font, colour) with the page's own `body` declarations, then its `rules`."""
    return f"\nbody {{ font-family: {FONT}; {body} color: #222; }}\n{rules}"


def document(title: str, css: str, body: str) -> str:
    """A standalone HTML page: its title, its CSS and the markup of its body."""
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>{css}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
