"""The coverage page as HTML: one real table per kernel and profile, readable without JavaScript.

Every table has a caption, column headers (`scope="col"`: the Pythons) and row headers (`scope="row"`: toolkit
and torch), and every state is a word, not only a colour. Details (parity record, rule reasons, install
commands) are in `<details>` elements, which work without a script. The script (`page/coverage.js`, inlined
with the style sheet `page/coverage.css`) only adds to that: it puts the page's own address into the install
commands (written with the placeholder `INDEX_URL`), shows the search and state filter, and adds copy buttons.
"""

from __future__ import annotations

import html
from importlib import resources
from urllib.parse import quote

from attnforge.publish.coverage import INDEX_URL, STATE_LABELS, STATES, Entry, Row, Section, summary

STATE_HELP = {
    "parity-passed": "published, and the GPU parity suite passed on the device named",
    "built": "published, without a passed, signed GPU parity run",
    "yanked": "withdrawn (PEP 592): pip skips it unless pinned exactly, then warns with the reason",
    "not-built": "a valid cell of the matrix with no wheel in this index yet",
    "refused": "the matrix names it, but a compatibility rule refuses it (the reason is given)",
}


def _asset(name: str) -> str:
    return resources.files("attnforge.publish").joinpath("page").joinpath(name).read_text(encoding="utf-8")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _link(target: str, text: str) -> str:
    if target.startswith(("http://", "https://")):
        return f'<a href="{_e(target)}">{_e(text)}</a>'
    return _e(text)


def _command(kind: str, label: str, text: str, what: str) -> str:
    return (
        f'<p class="cmd-label">{_e(label)}</p>'
        f'<pre><code class="cmd" data-cmd="{kind}" data-what="{_e(what)}">{_e(text)}</code></pre>'
    )


def _entry(e: Entry) -> str:
    """One entry of a cell: the state word first, then what backs it."""
    parts = [
        f'<div class="entry state-{e.state}" data-state="{e.state}">',
        f'<strong class="state">{_e(STATE_LABELS[e.state])}</strong>'
        f' <span class="version">{_e(e.version or e.kernel_version)}</span>',
    ]
    if e.state == "yanked":
        when = f" ({_e(e.yanked_time)})" if e.yanked_time else ""
        parts.append(f'<p class="reason">Reason: {_e(e.yanked or "none given")}{when}</p>')
    if e.parity is not None:
        p = e.parity
        verdict = "passed" if p.passed else "FAILED"
        if not p.signed:
            verdict += " (says the manifest: no signed parity record)"
        driver = f", driver {_e(p.driver)}" if p.driver else ", driver not recorded"
        report = f"; report: {_link(p.report, p.report)}" if p.report else ""
        parts.append(
            f'<p class="parity">Parity {verdict} on {_e(p.device)}{driver}, {_e(p.date)}{report}</p>'
        )
    elif e.filename:
        parts.append('<p class="parity">No GPU parity run recorded</p>')
    if e.state == "refused":
        rules = ", ".join(r.split("]")[0].lstrip("[") for r in e.reasons if r.startswith("["))
        parts.append(
            f"<details><summary>Rule{'s' if len(e.reasons) > 1 else ''}: {_e(rules or 'see why')}</summary>"
            "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in e.reasons) + "</ul></details>"
        )
    if e.state == "not-built" and e.cell_id:
        parts.append(f'<p class="build">Build it: <code>attnforge build --cell {_e(e.cell_id)}</code></p>')
    if e.filename:
        links = [f'<a href="{_e(e.manifest_url)}">manifest</a>'] if e.manifest_url else []
        if e.pip and e.uv:
            what = e.filename
            parts.append(
                f'<details class="install"><summary>Install {_e(e.version)}</summary>'
                + _command("pip", "pip", e.pip, what)
                + _command("uv", "uv: pyproject.toml entries, then the uv add they name", e.uv, what)
                + "</details>"
            )
        parts.append(
            f'<p class="file"><span class="filename">{_e(e.filename)}</span> ' + " ".join(links) + "</p>"
        )
    parts.append("</div>")
    return "\n".join(parts)


def _search_text(section: Section, row: Row) -> str:
    words = [section.kernel, f"profile {section.profile}", row.label, row.span_label]
    for python, entries in row.cells.items():
        words.append(f"python {python}" if python != "*" else "abi3 stable")
        for e in entries:
            words += [STATE_LABELS[e.state], e.state, e.filename or "", e.variant, e.yanked or "", *e.reasons]
            if e.parity:
                words += [e.parity.device, e.parity.driver or ""]
    return " ".join(w for w in words if w).lower()


def _row(section: Section, row: Row) -> str:
    cells = []
    if row.stable:
        entries = row.cells.get("*", [])
        span = max(1, len(section.pythons))
        cells.append(
            f'<td colspan="{span}" class="stable"><p class="span">{_e(row.span_label)}</p>'
            + "".join(_entry(e) for e in entries)
            + "</td>"
        )
    else:
        for python in section.pythons:
            entries = row.cells.get(python, [])
            if entries:
                cells.append("<td>" + "".join(_entry(e) for e in entries) + "</td>")
            else:
                cells.append(
                    '<td class="empty"><span class="dash" aria-hidden="true">–</span>'
                    '<span class="sr-only">not in the matrix</span></td>'
                )
    states = " ".join(row.states)
    return (
        f'<tr data-states="{states}" data-search="{_e(_search_text(section, row))}">'
        f'<th scope="row">{_e(row.label)}</th>' + "".join(cells) + "</tr>"
    )


def _section(n: int, s: Section) -> str:
    heading = f"{s.kernel} · profile {s.profile}"
    columns = [f'<th scope="col">Python {_e(p)}</th>' for p in s.pythons] or ['<th scope="col">Python</th>']
    return "\n".join(
        [
            f'<section class="grid" aria-labelledby="grid-{n}">',
            f'<h2 id="grid-{n}">{_e(heading)}</h2>',
            '<div class="scroll">',
            "<table>",
            f"<caption>{_e(s.kernel)}, profile {_e(s.profile)}: one row per toolkit and torch release, "
            "one column per Python version</caption>",
            '<thead><tr><th scope="col">Toolkit · torch</th>' + "".join(columns) + "</tr></thead>",
            "<tbody>",
            *[_row(s, r) for r in s.rows],
            "</tbody>",
            "</table>",
            "</div>",
            "</section>",
        ]
    )


def render_page(sections: list[Section], variants: list[str], generated: str, notes: list[str]) -> str:
    """The whole page."""
    counts = summary(sections)
    totals = ", ".join(f"{counts[s]} {STATE_LABELS[s]}" for s in STATES)
    legend = "".join(
        f'<dt><span class="entry state-{s}"><strong class="state">{_e(STATE_LABELS[s])}</strong></span></dt>'
        f"<dd>{_e(STATE_HELP[s])}</dd>"
        for s in STATES
    )
    options = "".join(f'<option value="{s}">{_e(STATE_LABELS[s])}</option>' for s in STATES)
    variant_links = "".join(f'<li><a href="{quote(v)}/simple/">{_e(v)}/simple/</a></li>' for v in variants)
    grids = (
        "\n".join(_section(n, s) for n, s in enumerate(sections, 1))
        or "<p>The index holds no wheels yet.</p>"
    )
    plan_notes = "".join(f"<li>{_e(n)}</li>" for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnforge wheel index: coverage</title>
<style>
{_asset("coverage.css")}
</style>
</head>
<body>
<a class="skip" href="#grids">Skip to the grids</a>
<header>
<h1>attnforge wheel index</h1>
<p>What this index holds and what its matrix plans, per kernel and profile: {_e(totals)}.
Generated {_e(generated)}.</p>
<p id="index-url-note">The install commands name this index <code>{INDEX_URL}</code>: replace it with the
address this page is served from (without <code>/index.html</code>).</p>
</header>
<main>
<section aria-labelledby="states-h">
<h2 id="states-h">States</h2>
<dl class="legend">{legend}</dl>
</section>
<form id="filters" role="search" aria-label="Filter the grids" hidden>
<p><label for="filter-text">Search</label>
<input type="search" id="filter-text" placeholder="e.g. torch 2.14 python 3.11" autocomplete="off"></p>
<p><label for="filter-state">State</label>
<select id="filter-state"><option value="">any state</option>{options}</select></p>
<p id="filter-status" role="status" aria-live="polite"></p>
</form>
<div id="grids">
{grids}
</div>
<section aria-labelledby="variants-h">
<h2 id="variants-h">Variant indexes</h2>
<p>pip reads these (PEP 503 HTML and PEP 691 JSON); <code>all</code> holds every variant.</p>
<ul>{variant_links}</ul>
</section>
{f'<section aria-labelledby="notes-h"><h2 id="notes-h">Plan notes</h2><ul>{plan_notes}</ul></section>' if notes else ""}
</main>
<script>
{_asset("coverage.js")}
</script>
</body>
</html>
"""
