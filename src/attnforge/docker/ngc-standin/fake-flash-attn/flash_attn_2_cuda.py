"""attnforge NGC stand-in: a *pure-Python stub* where NGC's compiled extension would be."""

STANDIN = True
