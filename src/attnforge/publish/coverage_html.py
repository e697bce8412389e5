"""The coverage page as HTML, readable without JavaScript and by a screen reader.

In order: what is published (per kernel and profile, each wheel with its parity state and install line), the
counts per state, a table of contents, the filter, then one grid per kernel and profile with its refused cells
folded away (`coverage_grid_html`), the variant indexes and the plan's notes. Tables have captions and
`scope`d headers, every state is a word, details are `<details>` elements. The script (`page/coverage.js`,
inlined with `page/coverage.css`) only adds to that: it puts the page's own address into the install commands
(written with the placeholder `INDEX_URL`), drives the filter (and keeps it in the address: `?state=...&q=...`
or `#state=...`), and adds copy buttons.
"""

from __future__ import annotations

from importlib import resources
from urllib.parse import quote

from attnforge.publish.coverage import INDEX_URL, STATE_HELP, STATE_LABELS, STATES, Entry, Section, summary
from attnforge.publish.coverage_grid_html import GridIds, counts_text, esc, section_html, state_word
from attnforge.publish.coverage_views import PublishedWheel, published_wheels

__all__ = ["STATE_HELP", "render_page"]
NL = "\n"  # between block elements: their text stays apart in textContent (what search and copy read)


def _asset(name: str) -> str:
    return resources.files("attnforge.publish").joinpath("page").joinpath(name).read_text(encoding="utf-8")


def _link(target: str, text: str) -> str:
    if target.startswith(("http://", "https://")):
        return f'<a href="{esc(target)}">{esc(text)}</a>'
    return esc(text)


def _command(kind: str, text: str, what: str) -> str:
    """A command to copy; `--index-url` never splits at its hyphens (the text is the same)."""
    shown = esc(text).replace(" --index-url ", ' <span class="nw">--index-url</span> ')
    return f'<pre><code class="cmd" data-cmd="{kind}" data-what="{esc(what)}">{shown}</code></pre>'


def _parity(e: Entry) -> str:
    if e.parity is None:
        return '<p class="parity">No GPU parity run recorded</p>' if e.state != "yanked" else ""
    p = e.parity
    verdict = "passed" if p.passed else "FAILED"
    if not p.signed:
        verdict += " (says the manifest: no signed parity record)"
    driver = f", driver {esc(p.driver)}" if p.driver else ", driver not recorded"
    report = f"; {_link(p.report, 'parity report')}" if p.report else ""
    return f'<p class="parity">Parity {verdict} on {esc(p.device)}{driver}, {esc(p.date)}{report}</p>'


def _breakable(version: str) -> str:
    """The version with line-break chances after `+` and before a profile tag (`.fwd128`) only."""
    public, plus, local = version.partition("+")
    if not plus:
        return esc(version)
    parts = local.split(".")
    tail = "".join(("<wbr>." if p[:1].isalpha() else ".") + esc(p) for p in parts[1:])
    return f"{esc(public)}+<wbr>{esc(parts[0])}{tail}"


def _wheel_row(w: PublishedWheel, ids: GridIds) -> str:
    """A wheel's line: version; kernel, profile and what it serves; state and parity; install line."""
    e = w.entry
    assert e.filename is not None
    state = [f'<span class="entry state-{e.state}">{state_word(e.state)}</span>']
    if e.state == "yanked":
        when = f" ({esc(e.yanked_time)})" if e.yanked_time else ""
        state.append(f'<p class="reason">Reason: {esc(e.yanked or "none given")}{when}</p>')
    state.append(_parity(e))
    more = [f'<p class="file">File: <span class="filename">{esc(e.filename)}</span></p>']
    if e.pip and e.uv:
        install = _command("pip", e.pip, e.filename)
        more.insert(
            0, '<p class="cmd-label">uv: pyproject.toml entries, then the <code>uv add</code> they name</p>'
        )
        more.insert(1, _command("uv", e.uv, e.filename))
    else:
        install = "<p>Not offered: yanked.</p>"
    manifest = f'<a href="{esc(e.manifest_url)}">manifest</a>' if e.manifest_url else ""
    tools = f'<div class="tools"><details class="more"><summary>uv, file</summary>{NL.join(more)}</details>{manifest}</div>'
    where = f"{w.section.kernel} · profile {w.section.profile}"
    return (
        f'<tr id="{ids.wheel(e.filename)}">'
        f'<th scope="row"><span class="version">{_breakable(e.version or "")}</span></th>'
        f'<td data-label="Serves"><span class="where">{esc(where)}</span>{NL}<span>{esc(w.serves)}</span></td>'
        f'<td data-label="State">{NL.join(state)}</td>'
        f'<td data-label="Install" class="install">{install}{NL}{tools}</td></tr>'
    )


def _published(wheels: list[PublishedWheel], ids: GridIds) -> str:
    """One table, its lines by kernel and profile (grid order)."""
    if not wheels:
        return "<p>No wheel is published here yet: the grids below show what the matrix plans.</p>"
    n = len(wheels)
    profiles = len({(w.section.kernel, w.section.profile) for w in wheels})
    return "\n".join(
        [
            '<table class="wheels">',
            f"<caption>{n} wheel{'s' if n != 1 else ''} of {profiles} kernel profile{'s' if profiles != 1 else ''}"
            ", each with its parity state and the pip line that installs it</caption>",
            '<thead><tr><th scope="col">Version</th><th scope="col">Kernel, profile, serves</th>'
            '<th scope="col">State</th><th scope="col">Install</th></tr></thead>',
            "<tbody>",
            *[_wheel_row(w, ids) for w in wheels],
            "</tbody></table>",
        ]
    )


def _counts(counts: dict[str, int]) -> str:
    items = "".join(
        f'<li><a class="entry state-{s}" href="?state={s}#grids">{state_word(s)} <span class="n">{counts[s]}</span>'
        "</a></li>\n"
        for s in STATES
    )
    legend = "".join(f"<dt>{esc(STATE_LABELS[s])}</dt><dd>{esc(STATE_HELP[s])}</dd>" for s in STATES)
    return (
        f'<ul class="counts" aria-label="Entries per state">{items}</ul>'
        f'<details class="legend"><summary>What the states mean</summary><dl>{legend}</dl></details>'
    )


def _toc(sections: list[Section], wheels: int, notes: bool) -> str:
    grids = "".join(
        f'<li><a href="#grid-{n}">{esc(s.kernel)} · profile {esc(s.profile)}</a>: '
        f"{esc(counts_text(summary([s])))}</li>"
        for n, s in enumerate(sections, 1)
    )
    items = [
        f'<li><a href="#published">Published wheels</a> ({wheels})</li>',
        '<li><a href="#counts">Counts per state</a></li>',
        f'<li><a href="#grids">Coverage grids</a>{f"<ol>{grids}</ol>" if grids else ""}</li>',
        '<li><a href="#variants">Variant indexes</a></li>',
    ]
    if notes:
        items.append('<li><a href="#notes">Plan notes</a></li>')
    return (
        f'<nav id="toc" aria-labelledby="toc-h"><h2 id="toc-h">Contents</h2><ol>{"".join(items)}</ol></nav>'
    )


def render_page(sections: list[Section], variants: list[str], generated: str, notes: list[str]) -> str:
    """The whole page."""
    ids = GridIds()
    wheels = published_wheels(sections)
    published = _published(wheels, ids)  # first: it numbers the wheels the grids link to
    grids = "\n".join(section_html(n, s, ids) for n, s in enumerate(sections, 1))
    options = "".join(f'<option value="{s}">{esc(STATE_LABELS[s])}</option>' for s in STATES)
    variant_links = "".join(f'<li><a href="{quote(v)}/simple/">{esc(v)}/simple/</a></li>' for v in variants)
    plan_notes = "".join(f"<li>{esc(n)}</li>" for n in notes)
    notes_html = (
        f'<section id="notes" aria-labelledby="notes-h"><h2 id="notes-h">Plan notes</h2><ul>{plan_notes}</ul>'
        "</section>"
        if notes
        else ""
    )
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
<p>Generated {esc(generated)}. <span id="index-url-note">The install commands name this index
<code>{INDEX_URL}</code>: replace it with the address this page is served from (without
<code>/index.html</code>).</span></p>
</header>
<main>
<section id="published" aria-labelledby="published-h">
<h2 id="published-h">Published wheels</h2>
{published}
</section>
<section id="counts" aria-labelledby="counts-h">
<h2 id="counts-h">Counts per state</h2>
{_counts(summary(sections))}
</section>
{_toc(sections, len(wheels), bool(notes))}
<section id="grids" aria-labelledby="grids-h">
<h2 id="grids-h">Coverage grids</h2>
<p>Per kernel and profile: toolkit × torch rows, Python columns. Cells refused by a rule are folded under each
grid, grouped by reason.</p>
<form id="filters" role="search" aria-label="Filter the grids" hidden>
<p><label for="filter-text">Search</label>
<input type="search" id="filter-text" name="q" placeholder="e.g. torch 2.14 python 3.11" autocomplete="off"></p>
<p><label for="filter-state">State</label>
<select id="filter-state" name="state"><option value="">any state</option>{options}</select></p>
<p id="filter-status" role="status" aria-live="polite"></p>
</form>
{grids or "<p>The index holds no wheels yet and has no plan.</p>"}
</section>
<section id="variants" aria-labelledby="variants-h">
<h2 id="variants-h">Variant indexes</h2>
<p>pip reads these (PEP 503 HTML and PEP 691 JSON); <code>all</code> holds every variant.</p>
<ul>{variant_links}</ul>
</section>
{notes_html}
</main>
<script>
{_asset("coverage.js")}
</script>
</body>
</html>
"""
